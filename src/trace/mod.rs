//! Reading and writing event traces: our CSV format (v1), and imports from other tools.

pub mod csv;
pub mod pickle;
pub mod snapshot;

pub use csv::{read_trace, TraceReader, TraceWriter};

use rustc_hash::FxHashMap;

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
