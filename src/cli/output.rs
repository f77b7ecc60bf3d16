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
        return Ok(Box::new(std::io::BufWriter::new(Named { name: "standard output".into(), inner: std::io::stdout().lock() })));
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
    Ok(Box::new(std::io::BufWriter::new(Named { name: path.to_string(), inner: f })))
}

/// A writer whose errors name where it writes (a full disk otherwise reads "No space left on
/// device" with no file to free).
struct Named<W> {
    name: String,
    inner: W,
}

impl<W: Write> Named<W> {
    fn named(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("{}: cannot write: {e}", self.name))
    }
}

impl<W: Write> Write for Named<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).map_err(|e| self.named(e))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().map_err(|e| self.named(e))
    }
}

/// Makes a JSON Lines file that records will be appended to end with a newline: a last record
/// written without one (by hand, by another tool) gets it, so the next one starts a line of its
/// own; a torn last line (a writer killed mid-record) is cut off, with a warning, as `sweep run`
/// does with its shards. Either would otherwise glue two records into one line the readers refuse.
fn end_with_a_whole_line(path: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let name = path.display().to_string();
    let Ok(mut f) = std::fs::OpenOptions::new().read(true).write(true).open(path) else {
        return Ok(()); // not there yet (or not writable: opening it to append says so)
    };
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8];
    f.seek(SeekFrom::End(-1))?;
    f.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    // The last line: read back from the end in chunks until its start.
    let mut start = len;
    let mut tail = Vec::new();
    while start > 0 {
        let chunk = (start).min(64 << 10);
        start -= chunk;
        let mut buf = vec![0u8; chunk as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf)?;
        buf.extend_from_slice(&tail);
        tail = buf;
        if let Some(i) = tail[..chunk as usize].iter().rposition(|&b| b == b'\n') {
            start += i as u64 + 1;
            tail.drain(..=i);
            break;
        }
    }
    if serde_json::from_slice::<serde_json::Value>(&tail).is_ok() {
        f.seek(SeekFrom::End(0))?;
        f.write_all(b"\n").map_err(|e| InputError::new(&name, format!("cannot append: {e}")))?;
    } else {
        f.set_len(start).map_err(|e| InputError::new(&name, format!("cannot cut off its torn last line: {e}")))?;
        eprintln!("warning: {name}: its last line was torn (a writer stopped mid-record); cut off before appending");
    }
    Ok(())
}

/// Checks, before any work, that every one of `outputs` can be written, and refuses any that is
/// one of `inputs` (the same file, by any name): creating it would empty the input before it is
/// read, or replace it with results. (An output found unwritable after a long run loses the run.)
pub fn check_outputs(outputs: &[Option<&Path>], inputs: &[Option<&Path>]) -> anyhow::Result<()> {
    use crate::files::same_file;
    let named: Vec<&&Path> = outputs.iter().flatten().filter(|o| o.as_os_str() != "-").collect();
    // Two outputs of one run in one file would overwrite or interleave each other.
    for (i, a) in named.iter().enumerate() {
        if let Some(b) = named[..i].iter().find(|b| same_file(b, a)) {
            return Err(InputError::new(a.display().to_string(), format!("is also the file of another output ({}): name two files", b.display())).into());
        }
    }
    for output in named {
        check_writable(output)?;
        for input in inputs.iter().flatten() {
            if same_file(input, output) {
                let why = format!("is the input {}: writing it would destroy the input; name another file", input.display());
                return Err(InputError::new(output.display().to_string(), why).into());
            }
        }
    }
    Ok(())
}

/// Whether `path` can be written as `open` would: an existing file opened for writing (not
/// truncated), or a new one created and removed again in the nearest folder that exists (the
/// folders between are made by `open`). Nothing is left behind.
fn check_writable(path: &Path) -> anyhow::Result<()> {
    let name = path.display().to_string();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return Err(InputError::new(name, "is a folder: name a file").into()),
        Ok(_) => {
            return std::fs::OpenOptions::new().append(true).open(path).map(drop).map_err(|e| InputError::new(name, format!("cannot write: {e}")).into());
        }
        Err(_) => {}
    }
    let parent = |p: &Path| p.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    let mut folder = parent(path);
    while !folder.exists() {
        folder = parent(&folder);
    }
    if !folder.is_dir() {
        return Err(InputError::new(name, format!("cannot create: {} is not a folder", folder.display())).into());
    }
    let probe = folder.join(format!(".allocbench-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(InputError::new(name, format!("cannot create: {e}")).into()),
    }
}

/// Prints a command's text: on standard output, or on standard error when its `--json` document
/// goes to standard output (`-`), so that stdout holds only the JSON.
pub fn say(json: Option<&str>, text: &str) {
    if json == Some("-") {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
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
        if let Some(p) = path.filter(|p| p.as_os_str() != "-") {
            end_with_a_whole_line(p)?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appending_starts_a_line_of_its_own_and_drops_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let after = |text: &str| {
            std::fs::write(&path, text).unwrap();
            end_with_a_whole_line(&path).unwrap();
            std::fs::read_to_string(&path).unwrap()
        };
        assert_eq!(after(""), "");
        assert_eq!(after("{\"a\":1}\n"), "{\"a\":1}\n");
        // A whole record without its newline keeps it; a torn one goes, the rest stays.
        assert_eq!(after("{\"a\":1}\n{\"b\":2}"), "{\"a\":1}\n{\"b\":2}\n");
        assert_eq!(after("{\"a\":1}\n{\"b\":[1,"), "{\"a\":1}\n");
        assert_eq!(after("{\"b\":[1,"), "");
        // A last line longer than one read-back chunk.
        let long = format!("{{\"a\":1}}\n{{\"s\":\"{}\"}}", "x".repeat(200_000));
        assert_eq!(after(&long), format!("{long}\n"));
        assert_eq!(after(&long[..150_000]), "{\"a\":1}\n");
    }
}
