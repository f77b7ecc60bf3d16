//! Reading and writing event traces: our CSV format (v1), and imports from other tools.

pub mod csv;
pub mod pickle;
pub mod ranks;
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

    /// What follows `#site N` for site `index`: `FILE:LINE FUNCTION`, the inverse of
    /// [`Sites::name`] as the CSV reader parses it. A function name loses its blanks (`_`: the
    /// reader takes the last word as the function), a missing one reads `?`, and a name with no
    /// `FILE:LINE` keeps its text as the file at line 0.
    pub fn definition(&self, index: u32) -> String {
        let name = self.names[index as usize].replace(['\n', '\r'], " ");
        let has_line = |place: &str| place.rsplit_once(':').is_some_and(|(file, line)| !file.is_empty() && line.parse::<u64>().is_ok());
        let (place, function) = match name.rsplit_once(" in ") {
            Some((place, function)) if has_line(place) => (place.to_string(), function),
            _ if has_line(&name) => (name.clone(), ""),
            _ => (format!("{}:0", if name.trim().is_empty() { "?" } else { name.trim() }), ""),
        };
        let function = function.split_whitespace().collect::<Vec<_>>().join("_");
        format!("{place} {}", if function.is_empty() { "?" } else { &function })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `#site` line written from any site name reads back as a valid site line: the same name
    /// where the name has the reader's shape, a close one (blanks in the function as `_`, `?` for
    /// a missing function, line 0 for a missing line) where it has not.
    #[test]
    fn definitions_read_back_as_the_sites_they_name() {
        let names = ["my model/a:b.py:31 in Attention.forward", "x.py:7", "weird", "a.py:3 in foo bar", "", "t.py:2 in <module>", "c.py:9 in "];
        let want =
            ["my model/a:b.py:31 in Attention.forward", "x.py:7 in ?", "weird:0 in ?", "a.py:3 in foo_bar", "?:0 in ?", "t.py:2 in <module>", "c.py:9 in ?"];
        let sites = Sites { names: names.iter().map(|s| s.to_string()).collect(), of_id: FxHashMap::default() };
        let mut text = String::from("op,id,bytes,stream\n");
        for i in 0..names.len() {
            text += &format!("#site {i} {}\nalloc,{i},512,0\n", sites.definition(i as u32));
        }
        let read = TraceReader::new(text.as_bytes(), "t.csv").read_sites().unwrap();
        assert_eq!(read.names, want);
        assert_eq!(read.of_id.len(), names.len());
    }
}
