//! The observer seam of a replay: what the loop tells observers, and how observers compose.

use crate::event::PoolOp;
use crate::gpu::stats::DeviceStats;
use crate::gpu::{GpuAllocator, Handle, OomInfo};

/// A call the replay made on the allocator, with the handle a malloc answered: the calls from a
/// state on, made again on a fork of the allocator taken in that state, pass through the same
/// states (the policies are deterministic), which is how a replay revisits a past moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Call {
    /// `handle` is `None` when the malloc failed with an OOM.
    Malloc {
        bytes: u64,
        stream: u64,
        handle: Option<Handle>,
    },
    Free(Handle),
    EmptyCache,
    RecordStream {
        handle: Handle,
        stream: u64,
    },
    Sync(Option<u64>),
    Pool(PoolOp),
}

impl Call {
    /// Makes the call on `alloc`; false when it answers otherwise than it did in the replay (a
    /// fork that does not follow: its map cannot stand for the replay's).
    pub fn make(self, alloc: &mut dyn GpuAllocator) -> bool {
        match self {
            Call::Malloc { bytes, stream, handle } => alloc.malloc(bytes, stream).ok() == handle,
            Call::Free(h) => alloc.free(h).is_ok(),
            Call::EmptyCache => alloc.empty_cache().is_ok(),
            Call::RecordStream { handle, stream } => {
                alloc.record_stream(handle, stream);
                true
            }
            Call::Sync(stream) => {
                alloc.sync(stream);
                true
            }
            Call::Pool(op) => super::pool_call(alloc, op, 0).is_ok(),
        }
    }
}

/// Where a replay stands: the event's 0-based index, the step it belongs to, and the bytes the
/// workload holds (independent of the allocator).
#[derive(Debug, Clone, Copy, Default)]
pub struct At {
    pub index: u64,
    pub step: u64,
    pub live: u64,
}

/// Watches a replay. Every method has a no-op default; the loop calls them in event order with
/// the allocator `A` (generic, so observers read its stats without dynamic dispatch). Observers
/// compose: a tuple of observers is an observer, as is `&mut` one.
pub trait Observer<A: GpuAllocator + ?Sized> {
    /// Before the first event.
    fn start(&mut self, _alloc: &A) {}
    /// After an allocation of `bytes` (the request) succeeded; `stats` are the allocator's now
    /// (read once for every observer).
    fn allocated(&mut self, _alloc: &A, _stats: &DeviceStats, _at: At, _bytes: u64) {}
    /// Right after each call the replay made on the allocator (before [`Observer::placed`] and
    /// [`Observer::allocated`] for a malloc, before [`Observer::out_of_memory`] for a failed one).
    fn called(&mut self, _alloc: &A, _call: Call) {}
    /// Right after a successful allocation, before [`Observer::allocated`]: the trace's `id` for
    /// it and the policy's handle (for `GpuAllocator::block_address`).
    fn placed(&mut self, _alloc: &A, _id: u64, _handle: Handle) {}
    /// An allocation of `bytes` failed with an OOM (before the replay stops or skips it).
    fn out_of_memory(&mut self, _alloc: &A, _at: At, _bytes: u64, _info: &OomInfo) {}
    /// At a `step` marker, before it takes effect (the state after all earlier events).
    fn step(&mut self, _alloc: &A, _at: At, _n: u64) {}
    /// After an event (`at.index` already counts it): at least after each event whose count
    /// reaches [`Observer::after_event_due`], and after each event other than an allocation or a
    /// free.
    fn after_event(&mut self, _alloc: &A, _at: At) {}
    /// The first event count above `events` after which this observer wants
    /// [`Observer::after_event`] (`u64::MAX`: none). The loop asks after `start` and after each
    /// `after_event`; an observer that overrides `after_event` says here when it is due (skipping
    /// the call at every other event is most of what a replay's loop saves from it).
    fn after_event_due(&self, _events: u64) -> u64 {
        u64::MAX
    }
    /// Every `CHECK_EVERY_EVENTS` events (replay.rs): `true` stops the replay (it is then `interrupted`).
    fn checkpoint(&mut self, _events: u64) -> bool {
        false
    }
    /// After the last event; `at.index` is the number of events replayed.
    fn finish(&mut self, _alloc: &A, _at: At) {}
}

impl<A: GpuAllocator + ?Sized> Observer<A> for () {}

impl<A: GpuAllocator + ?Sized, O: Observer<A> + ?Sized> Observer<A> for &mut O {
    #[inline]
    fn start(&mut self, alloc: &A) {
        (**self).start(alloc)
    }
    #[inline]
    fn allocated(&mut self, alloc: &A, stats: &DeviceStats, at: At, bytes: u64) {
        (**self).allocated(alloc, stats, at, bytes)
    }
    #[inline]
    fn called(&mut self, alloc: &A, call: Call) {
        (**self).called(alloc, call)
    }
    #[inline]
    fn placed(&mut self, alloc: &A, id: u64, handle: Handle) {
        (**self).placed(alloc, id, handle)
    }
    #[inline]
    fn out_of_memory(&mut self, alloc: &A, at: At, bytes: u64, info: &OomInfo) {
        (**self).out_of_memory(alloc, at, bytes, info)
    }
    #[inline]
    fn step(&mut self, alloc: &A, at: At, n: u64) {
        (**self).step(alloc, at, n)
    }
    #[inline]
    fn after_event(&mut self, alloc: &A, at: At) {
        (**self).after_event(alloc, at)
    }
    #[inline]
    fn after_event_due(&self, events: u64) -> u64 {
        (**self).after_event_due(events)
    }
    #[inline]
    fn checkpoint(&mut self, events: u64) -> bool {
        (**self).checkpoint(events)
    }
    #[inline]
    fn finish(&mut self, alloc: &A, at: At) {
        (**self).finish(alloc, at)
    }
}

macro_rules! tuple_observer {
    ($($o:ident . $i:tt),+) => {
        impl<A: GpuAllocator + ?Sized, $($o: Observer<A>),+> Observer<A> for ($($o,)+) {
            #[inline]
            fn start(&mut self, alloc: &A) {
                $(self.$i.start(alloc);)+
            }
            #[inline]
            fn allocated(&mut self, alloc: &A, stats: &DeviceStats, at: At, bytes: u64) {
                $(self.$i.allocated(alloc, stats, at, bytes);)+
            }
            #[inline]
            fn called(&mut self, alloc: &A, call: Call) {
                $(self.$i.called(alloc, call);)+
            }
            #[inline]
            fn placed(&mut self, alloc: &A, id: u64, handle: Handle) {
                $(self.$i.placed(alloc, id, handle);)+
            }
            #[inline]
            fn out_of_memory(&mut self, alloc: &A, at: At, bytes: u64, info: &OomInfo) {
                $(self.$i.out_of_memory(alloc, at, bytes, info);)+
            }
            #[inline]
            fn step(&mut self, alloc: &A, at: At, n: u64) {
                $(self.$i.step(alloc, at, n);)+
            }
            #[inline]
            fn after_event(&mut self, alloc: &A, at: At) {
                $(self.$i.after_event(alloc, at);)+
            }
            #[inline]
            fn after_event_due(&self, events: u64) -> u64 {
                u64::MAX $(.min(self.$i.after_event_due(events)))+
            }
            #[inline]
            fn checkpoint(&mut self, events: u64) -> bool {
                let mut stop = false;
                $(stop |= self.$i.checkpoint(events);)+
                stop
            }
            #[inline]
            fn finish(&mut self, alloc: &A, at: At) {
                $(self.$i.finish(alloc, at);)+
            }
        }
    };
}
tuple_observer!(O0.0, O1.1);
tuple_observer!(O0.0, O1.1, O2.2);
tuple_observer!(O0.0, O1.1, O2.2, O3.3);
tuple_observer!(O0.0, O1.1, O2.2, O3.3, O4.4);
tuple_observer!(O0.0, O1.1, O2.2, O3.3, O4.4, O5.5);

/// Passes on what happens at steps, OOMs, checkpoints and the ends, but not every event: how a
/// caller's observer rides along a replay whose per-event measuring is the standard observers'.
pub struct Coarse<O>(pub O);

impl<A: GpuAllocator + ?Sized, O: Observer<A>> Observer<A> for Coarse<O> {
    #[inline]
    fn start(&mut self, alloc: &A) {
        self.0.start(alloc)
    }
    #[inline]
    fn out_of_memory(&mut self, alloc: &A, at: At, bytes: u64, info: &OomInfo) {
        self.0.out_of_memory(alloc, at, bytes, info)
    }
    #[inline]
    fn step(&mut self, alloc: &A, at: At, n: u64) {
        self.0.step(alloc, at, n)
    }
    #[inline]
    fn checkpoint(&mut self, events: u64) -> bool {
        self.0.checkpoint(events)
    }
    #[inline]
    fn finish(&mut self, alloc: &A, at: At) {
        self.0.finish(alloc, at)
    }
}
