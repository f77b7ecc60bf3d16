//! Reading and writing event traces: our CSV format (v1), and imports from other tools.

pub mod csv;
pub mod pickle;
pub mod snapshot;

pub use csv::{read_trace, TraceReader, TraceWriter};
