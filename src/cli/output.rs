//! The one output path of every command: JSON documents and JSON Lines files, to a file (its
//! folder created) or to standard output (`-`).

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::error::InputError;
use crate::results::{write_json_pretty, write_jsonl, ResultRecord};

/// Opens `path` for writing; `-` is standard output.
pub fn open(path: &str) -> anyhow::Result<Box<dyn Write>> {
    if path == "-" {
        return Ok(Box::new(std::io::BufWriter::new(std::io::stdout().lock())));
    }
    if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| InputError::new(path, format!("cannot create folder: {e}")))?;
    }
    let f = std::fs::File::create(path).map_err(|e| InputError::new(path, format!("cannot create: {e}")))?;
    Ok(Box::new(std::io::BufWriter::new(f)))
}

/// Writes one pretty-printed JSON document to `path` (`-` = standard output).
pub fn write_json<T: Serialize + ?Sized>(path: &str, value: &T) -> anyhow::Result<()> {
    write_json_pretty(open(path)?.as_mut(), value)
}

/// A JSON Lines file that records are appended to as they finish (nothing when not asked for).
pub struct Jsonl(Option<Box<dyn Write>>);

impl Jsonl {
    pub fn open(path: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Jsonl(path.map(|p| open(&p.display().to_string())).transpose()?))
    }

    /// Appends one record (flushed at once).
    pub fn write(&mut self, rec: &ResultRecord) -> anyhow::Result<()> {
        if let Some(out) = self.0.as_mut() {
            write_jsonl(out.as_mut(), rec)?;
        }
        Ok(())
    }
}
