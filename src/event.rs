//! The event model every workload, trace and snapshot is turned into.

/// One thing a workload does to an allocator. Ids are logical names chosen by the workload,
/// never addresses; an id may be reused once its allocation has been freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Allocate `bytes` (> 0) on `stream` and call the allocation `id`.
    Alloc { id: u64, bytes: u64, stream: u64 },
    /// Free the live allocation `id`.
    Free { id: u64 },
    /// `torch.cuda.empty_cache()`: release every cached, fully free segment.
    EmptyCache,
    /// An iteration boundary: the events after it belong to step `n`.
    Step { n: u64 },
}

impl Event {
    pub fn op_name(&self) -> &'static str {
        match self {
            Event::Alloc { .. } => "alloc",
            Event::Free { .. } => "free",
            Event::EmptyCache => "empty_cache",
            Event::Step { .. } => "step",
        }
    }
}

/// A stream of events that may fail part-way (a trace file with a bad line).
pub type EventStream<'a> = Box<dyn Iterator<Item = anyhow::Result<Event>> + 'a>;

/// Adapts an infallible generator into an [`EventStream`].
pub fn infallible<'a, I: Iterator<Item = Event> + 'a>(events: I) -> EventStream<'a> {
    Box::new(events.map(Ok))
}
