//! The one output path of every command: JSON documents and JSON Lines files, to a file (its
//! folder created) or to standard output (`-`).

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::error::InputError;
use crate::results::{write_json_pretty, write_jsonl, ResultRecord};

/// Opens `path` for writing (replacing it); `-` is standard output.
pub fn open(path: &str) -> anyhow::Result<Box<dyn Write>> {
    open_with(path, false)
}

/// Opens `path` for writing, appending to what it holds when `append`; `-` is standard output.
fn open_with(path: &str, append: bool) -> anyhow::Result<Box<dyn Write>> {
    if path == "-" {
        return Ok(Box::new(std::io::BufWriter::new(std::io::stdout().lock())));
    }
    if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| InputError::new(path, format!("cannot create folder: {e}")))?;
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| InputError::new(path, format!("cannot create: {e}")))?;
    Ok(Box::new(std::io::BufWriter::new(f)))
}

/// Refuses to write any of `outputs` that is one of `inputs` (the same file, by any name):
/// creating it would empty the input before it is read, or replace it with results.
pub fn refuse_overwriting_inputs(outputs: &[Option<&Path>], inputs: &[Option<&Path>]) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for output in outputs.iter().flatten().filter(|o| o.as_os_str() != "-") {
        let Ok(out) = std::fs::metadata(output) else { continue };
        for input in inputs.iter().flatten() {
            if std::fs::metadata(input).is_ok_and(|i| i.dev() == out.dev() && i.ino() == out.ino()) {
                let why = format!("is the input {}: writing it would destroy the input; name another file", input.display());
                return Err(InputError::new(output.display().to_string(), why).into());
            }
        }
    }
    Ok(())
}

/// Writes one pretty-printed JSON document to `path` (`-` = standard output).
pub fn write_json<T: Serialize + ?Sized>(path: &str, value: &T) -> anyhow::Result<()> {
    write_json_pretty(open(path)?.as_mut(), value)
}

/// A JSON Lines file that records are appended to as they finish (nothing when not asked for).
pub struct Jsonl(Option<Box<dyn Write>>);

impl Jsonl {
    /// A new file (replacing one of that name).
    pub fn open(path: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Jsonl(path.map(|p| open(&p.display().to_string())).transpose()?))
    }

    /// Records added after those the file holds already (`run --jsonl`, `cpu --jsonl`: results
    /// of several runs gather in one file).
    pub fn append(path: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Jsonl(path.map(|p| open_with(&p.display().to_string(), true)).transpose()?))
    }

    /// Appends one record (flushed at once).
    pub fn write(&mut self, rec: &ResultRecord) -> anyhow::Result<()> {
        if let Some(out) = self.0.as_mut() {
            write_jsonl(out.as_mut(), rec)?;
        }
        Ok(())
    }
}
