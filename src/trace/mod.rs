//! Reading and writing event traces: our CSV format (v1), and imports from other tools.

pub mod csv;
pub mod pickle;
pub mod snapshot;

pub use csv::{read_trace, TraceReader, TraceWriter};
use rustc_hash::FxHashMap;

/// Events parsed ahead on a thread of their own, handed over in batches: `allocbench replay` of
/// a CSV spends about as long parsing as replaying, so the two overlap. The reader thread stops
/// at the first error (passed on in order, like the reader's own) and when the consumer is
/// dropped.
pub struct ReadAhead {
    batches: std::sync::mpsc::Receiver<Vec<anyhow::Result<crate::event::Event>>>,
    current: std::vec::IntoIter<anyhow::Result<crate::event::Event>>,
}

/// Events per hand-over: large enough that the channel costs nothing per event, small enough
/// that the replay starts at once.
const READ_AHEAD_BATCH: usize = 8192;

impl ReadAhead {
    pub fn spawn<I: Iterator<Item = anyhow::Result<crate::event::Event>> + Send + 'static>(events: I) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        std::thread::spawn(move || {
            let mut events = events.fuse();
            loop {
                let batch: Vec<_> = events.by_ref().take(READ_AHEAD_BATCH).collect();
                let last = batch.len() < READ_AHEAD_BATCH || batch.last().is_some_and(|e| e.is_err());
                if batch.is_empty() || tx.send(batch).is_err() || last {
                    return;
                }
            }
        });
        ReadAhead { batches: rx, current: Vec::new().into_iter() }
    }
}

impl Iterator for ReadAhead {
    type Item = anyhow::Result<crate::event::Event>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.current.next() {
                return Some(e);
            }
            self.current = self.batches.recv().ok()?.into_iter();
        }
    }
}

/// Where allocations were made, as the input recorded it (PyTorch snapshots' frames, captures'
/// `#site` lines): each site named once, each allocation id pointing at one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sites {
    /// `FILE:LINE in FUNCTION`, indexed by site.
    pub names: Vec<String>,
    /// The site of each allocation id, as an index into `names`.
    pub of_id: FxHashMap<u64, u32>,
}

impl Sites {
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The index of `name`, added when new.
    pub fn intern(&mut self, name: String, index: &mut FxHashMap<String, u32>) -> u32 {
        let n = self.names.len() as u32;
        *index.entry(name).or_insert_with_key(|name| {
            self.names.push(name.clone());
            n
        })
    }

    /// The display name of a site: `FILE:LINE in FUNCTION`.
    pub fn name(file: &str, line: u64, function: &str) -> String {
        if function.is_empty() {
            format!("{file}:{line}")
        } else {
            format!("{file}:{line} in {function}")
        }
    }
}
