//! The recorded CPU trace (`allocbench cpu --record`): every malloc-family call of a process tree,
//! per process, in the order the calls happened across threads, with the thread, the time, the
//! size and a stable id per block. Written by [`write`], read by [`RecordedTrace::read`]; the
//! byte layout is specified in docs/cpu-trace-format.md.
//!
//! Ids are implicit: the n-th call of a process that hands out a block (malloc, calloc, an aligned
//! allocation, realloc) creates block n; a free or realloc names the block it gives back by how
//! far back it was created (`next id - id`), a small number for the short-lived blocks that
//! dominate, so the trace stays near 4 bytes a call before any compression.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::InputError;

/// The file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"ABCPUTRC";
/// The format version after the magic (little-endian u32).
pub const VERSION: u32 = 1;
/// Each process section starts with these 4 bytes.
const SECTION_MAGIC: &[u8; 4] = b"PROC";
/// A trace larger than this (read or decompressed) is refused rather than loaded.
const MAX_TRACE_BYTES: u64 = 16 << 30;

/// One malloc-family call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Malloc {
        bytes: u64,
    },
    /// calloc(n, size): `bytes` = n × size, handed out zeroed.
    Calloc {
        bytes: u64,
    },
    /// posix_memalign, aligned_alloc, memalign, valloc, pvalloc: 2^`align_log2` alignment.
    Aligned {
        align_log2: u8,
        bytes: u64,
    },
    Free {
        id: u64,
    },
    /// realloc (and reallocarray): `old` is the block given back (None: from NULL, or from a block
    /// allocated before recording began); a new block is created either way.
    Realloc {
        old: Option<u64>,
        bytes: u64,
    },
}

impl Call {
    /// Whether the call creates a block (and so takes the next id).
    pub fn creates(&self) -> bool {
        !matches!(self, Call::Free { .. })
    }

    fn code(&self) -> u8 {
        match self {
            Call::Malloc { .. } => 1,
            Call::Calloc { .. } => 2,
            Call::Aligned { .. } => 3,
            Call::Free { .. } => 4,
            Call::Realloc { .. } => 5,
        }
    }
}

/// A call, the thread that made it (an index into its process's threads) and when (ns since the
/// recording started).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub thread: u32,
    pub t_ns: u64,
    pub call: Call,
}

/// One recorded process image (an exec starts a new one under the same pid).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    /// The command line the image ran.
    pub cmdline: Vec<String>,
    /// When the recorder started in it, seconds since the recording began.
    pub start_s: f64,
    /// Threads that made a call, in the order of their first call.
    pub threads: u32,
    pub calls: u64,
    /// Frees (and reallocs) of blocks the recording never saw handed out: allocated before the
    /// recorder started in this process, or inherited from its parent through fork. Left out.
    pub unmatched_frees: u64,
    /// Blocks handed out at an address still live in the recording: a free the recorder could not
    /// see (a call glibc made internally). The older block is taken as freed there.
    pub unseen_frees: u64,
    /// The most bytes live at once (requested sizes) and what was live at the end.
    pub peak_live_bytes: u64,
    pub live_bytes_end: u64,
}

/// What is known of the recording as a whole (the header's JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordingInfo {
    /// The command recorded.
    pub command: Vec<String>,
    /// Its exit status (128 + N when killed by signal N).
    pub exit_code: i32,
    /// Why the recording may be incomplete: a non-zero exit, a signal, Ctrl-C. Calls still in a
    /// thread's buffer when a process was killed are missing (up to 2,046 per thread).
    pub incomplete: Option<String>,
    pub wall_s: f64,
    /// The process tree's RSS over the recorded run, `[t_s, bytes]`, and its peak.
    pub rss: Vec<(f64, u64)>,
    pub peak_rss_bytes: u64,
    /// allocbench's version that wrote it.
    pub recorder: String,
    pub processes: Vec<ProcessInfo>,
}

/// A whole trace in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedTrace {
    pub info: RecordingInfo,
    /// Per process (the order of `info.processes`), its calls in the order they happened.
    pub calls: Vec<Vec<Recorded>>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Encodes one process's calls (the section payload).
fn encode_calls(calls: &[Recorded]) -> Vec<u8> {
    let mut out = Vec::with_capacity(calls.len() * 5);
    let mut next_id = 0u64;
    let mut prev_t = 0u64;
    for r in calls {
        out.push(r.call.code());
        put_varint(&mut out, r.thread as u64);
        put_varint(&mut out, zigzag(r.t_ns as i64 - prev_t as i64));
        prev_t = r.t_ns;
        match r.call {
            Call::Malloc { bytes } | Call::Calloc { bytes } => put_varint(&mut out, bytes),
            Call::Aligned { align_log2, bytes } => {
                out.push(align_log2);
                put_varint(&mut out, bytes);
            }
            Call::Free { id } => put_varint(&mut out, next_id - id),
            Call::Realloc { old, bytes } => {
                put_varint(&mut out, old.map_or(0, |id| next_id - id));
                put_varint(&mut out, bytes);
            }
        }
        if r.call.creates() {
            next_id += 1;
        }
    }
    out
}

/// Writes `trace` to `path` (through a temporary file beside it, renamed when whole).
pub fn write(path: &Path, trace: &RecordedTrace) -> anyhow::Result<()> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let header = serde_json::to_vec(&trace.info)?;
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    for (i, calls) in trace.calls.iter().enumerate() {
        let payload = encode_calls(calls);
        out.extend_from_slice(SECTION_MAGIC);
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&(calls.len() as u64).to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let mut crc = flate2::Crc::new();
        crc.update(&payload);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(&payload);
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, &out)?;
    tmp.persist(path)?;
    Ok(())
}

/// Whether `path` starts like a recorded CPU trace (gzip-compressed too).
pub fn is_recorded_trace(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    if f.read_exact(&mut head).is_err() {
        return false;
    }
    if &head == MAGIC {
        return true;
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        let Ok(f) = std::fs::File::open(path) else { return false };
        let mut d = flate2::read::MultiGzDecoder::new(f);
        return d.read_exact(&mut head).is_ok() && &head == MAGIC;
    }
    false
}

/// A cursor over the file's bytes that names the offset of whatever is wrong.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    name: &'a str,
    /// "" or " of the decompressed trace".
    whose: &'static str,
}

impl<'a> Reader<'a> {
    fn fail(&self, at: usize, what: impl std::fmt::Display) -> InputError {
        InputError::new(self.name, format!("{what} at byte {at}{}", self.whose))
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], InputError> {
        if self.data.len() - self.at < n {
            return Err(self.fail(self.at, format!("truncated: {what} needs {n} bytes, {} left", self.data.len() - self.at)));
        }
        let b = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32, InputError> {
        Ok(u32::from_le_bytes(self.bytes(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64, InputError> {
        Ok(u64::from_le_bytes(self.bytes(8, what)?.try_into().expect("8 bytes")))
    }
}

/// The decompressed bytes of a gzip-compressed trace; a stream that stops early or does not
/// decode names how far it got.
fn gunzip(raw: &[u8], name: &str) -> Result<Vec<u8>, InputError> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut d = flate2::read::MultiGzDecoder::new(raw);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match d.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() as u64 > MAX_TRACE_BYTES {
                    return Err(InputError::new(
                        name,
                        format!("larger than {} decompressed: not a recorded CPU trace", crate::units::format_bytes(MAX_TRACE_BYTES)),
                    ));
                }
            }
            Err(e) => return Err(InputError::new(name, format!("truncated or corrupt gzip: {e} at byte {} of the decompressed trace", out.len()))),
        }
    }
}

/// Decodes a section payload that starts at `base` in the file (for offsets in errors).
fn decode_calls(r: &Reader, payload: &[u8], base: usize, count: u64, threads: u32) -> Result<Vec<Recorded>, InputError> {
    let mut calls = Vec::with_capacity(count.min(payload.len() as u64) as usize);
    let mut at = 0usize;
    let mut next_id = 0u64;
    let mut t = 0i64;
    // Blocks already given back: a second give-back would have a replay wait for ever.
    let mut given_back: Vec<u64> = Vec::new();
    let varint = |at: &mut usize| -> Result<u64, InputError> {
        let start = *at;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = payload.get(*at) else {
                return Err(r.fail(base + start, "truncated: a call's number runs past its section"));
            };
            *at += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(r.fail(base + start, "corrupt: a number longer than 10 bytes"))
    };
    while at < payload.len() {
        let start = at;
        let code = payload[at];
        at += 1;
        let thread = varint(&mut at)?;
        if thread >= threads as u64 {
            return Err(r.fail(base + start, format!("corrupt: a call on thread {thread}, but the process has {threads}")));
        }
        t = t
            .checked_add(unzigzag(varint(&mut at)?))
            .filter(|t| *t >= -(1 << 62) && *t <= 1 << 62)
            .ok_or_else(|| r.fail(base + start, "corrupt: a call's time is out of range"))?;
        let mut back = |at: &mut usize, allow_none: bool| -> Result<Option<u64>, InputError> {
            let b = varint(at)?;
            if b == 0 && allow_none {
                return Ok(None);
            }
            if b == 0 || b > next_id {
                return Err(r.fail(base + start, format!("corrupt: a call gives back block {b} back of {next_id} created")));
            }
            let id = next_id - b;
            let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
            if given_back.len() <= word {
                given_back.resize(word + 1, 0);
            }
            if given_back[word] & bit != 0 {
                return Err(r.fail(base + start, format!("corrupt: block {id} is given back twice")));
            }
            given_back[word] |= bit;
            Ok(Some(id))
        };
        let call = match code {
            1 => Call::Malloc { bytes: varint(&mut at)? },
            2 => Call::Calloc { bytes: varint(&mut at)? },
            3 => {
                let Some(&align_log2) = payload.get(at) else {
                    return Err(r.fail(base + at, "truncated: an aligned allocation runs past its section"));
                };
                at += 1;
                if align_log2 > 40 {
                    return Err(r.fail(base + start, format!("corrupt: an alignment of 2^{align_log2}")));
                }
                Call::Aligned { align_log2, bytes: varint(&mut at)? }
            }
            4 => Call::Free { id: back(&mut at, false)?.expect("a free names a block") },
            5 => {
                let old = back(&mut at, true)?;
                Call::Realloc { old, bytes: varint(&mut at)? }
            }
            other => return Err(r.fail(base + start, format!("corrupt: unknown call code {other}"))),
        };
        if let Call::Malloc { bytes } | Call::Calloc { bytes } | Call::Aligned { bytes, .. } | Call::Realloc { bytes, .. } = call {
            if bytes >= crate::units::MAX_REQUEST_BYTES {
                return Err(r.fail(base + start, format!("corrupt: a request of {bytes} bytes")));
            }
        }
        if call.creates() {
            next_id += 1;
        }
        calls.push(Recorded { thread: thread as u32, t_ns: t.max(0) as u64, call });
    }
    if calls.len() as u64 != count {
        return Err(r.fail(base, format!("corrupt: the section says {count} calls but holds {}", calls.len())));
    }
    Ok(calls)
}

impl RecordedTrace {
    /// Reads and checks a whole trace: a wrong magic or version, a truncated file, a checksum
    /// that does not match, a call that names a block not yet created — each is one line naming
    /// the byte offset.
    pub fn read(path: &Path) -> Result<RecordedTrace, InputError> {
        let name = path.display().to_string();
        let raw = std::fs::read(path).map_err(|e| InputError::new(&name, format!("cannot read the trace: {e}")))?;
        let gz = raw.starts_with(&[0x1f, 0x8b]);
        let data = if gz { gunzip(&raw, &name)? } else { raw };
        let mut r = Reader { data: &data, at: 0, name: &name, whose: if gz { " of the decompressed trace" } else { "" } };
        let magic = r.bytes(8.min(data.len()), "the magic")?;
        if magic != MAGIC {
            return Err(InputError::new(
                &name,
                "not a recorded CPU trace (it does not start with ABCPUTRC): record one with `allocbench cpu --record -o TRACE -- CMD`",
            ));
        }
        let version = r.u32("the version")?;
        if version != VERSION {
            return Err(r.fail(8, format!("a trace of format version {version}; this allocbench reads version {VERSION}")));
        }
        let len = r.u32("the header's length")? as usize;
        let header_at = r.at;
        let header = r.bytes(len, "the header")?;
        let info: RecordingInfo = serde_json::from_slice(header).map_err(|e| r.fail(header_at, format!("corrupt header: {e}")))?;
        if let Some((i, p)) = info.processes.iter().enumerate().find(|(_, p)| p.threads as u64 > p.calls.max(1)) {
            return Err(r.fail(header_at, format!("corrupt header: process {i} has {} threads but {} calls", p.threads, p.calls)));
        }
        let mut calls = Vec::new();
        for (i, p) in info.processes.iter().enumerate() {
            let at = r.at;
            let m = r.bytes(4, "a process section")?;
            if m != SECTION_MAGIC {
                return Err(r.fail(at, format!("corrupt: process {i}'s section does not start with PROC")));
            }
            let index = r.u32("a process section")?;
            if index as usize != i {
                return Err(r.fail(at, format!("corrupt: section {index} where process {i}'s was expected")));
            }
            let count = r.u64("a process section")?;
            let len = r.u64("a process section")?;
            let crc = r.u32("a process section")?;
            let base = r.at;
            let payload = r.bytes(usize::try_from(len).unwrap_or(usize::MAX), &format!("process {i}'s calls"))?;
            let mut sum = flate2::Crc::new();
            sum.update(payload);
            if sum.sum() != crc {
                return Err(r.fail(base, format!("corrupt: process {i}'s calls do not match their checksum")));
            }
            calls.push(decode_calls(&r, payload, base, count, p.threads)?);
        }
        if r.at != data.len() {
            return Err(r.fail(r.at, format!("corrupt: {} bytes after the last process's calls", data.len() - r.at)));
        }
        Ok(RecordedTrace { info, calls })
    }

    /// Calls in the whole trace.
    pub fn total_calls(&self) -> u64 {
        self.calls.iter().map(|c| c.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordedTrace {
        let calls = vec![
            Recorded { thread: 0, t_ns: 10, call: Call::Malloc { bytes: 100 } },
            Recorded { thread: 1, t_ns: 9, call: Call::Calloc { bytes: 64 } },
            Recorded { thread: 1, t_ns: 30, call: Call::Aligned { align_log2: 12, bytes: 5000 } },
            Recorded { thread: 0, t_ns: 40, call: Call::Realloc { old: Some(0), bytes: 300 } },
            Recorded { thread: 1, t_ns: 41, call: Call::Free { id: 3 } },
            Recorded { thread: 0, t_ns: 50, call: Call::Realloc { old: None, bytes: 7 } },
            Recorded { thread: 0, t_ns: 60, call: Call::Free { id: 1 } },
        ];
        let info = RecordingInfo {
            command: vec!["prog".into()],
            exit_code: 0,
            incomplete: None,
            wall_s: 1.0,
            rss: vec![(0.0, 1 << 20)],
            peak_rss_bytes: 1 << 20,
            recorder: "test".into(),
            processes: vec![ProcessInfo {
                pid: 7,
                ppid: 1,
                cmdline: vec!["prog".into()],
                start_s: 0.0,
                threads: 2,
                calls: 7,
                unmatched_frees: 0,
                unseen_frees: 0,
                peak_live_bytes: 5464,
                live_bytes_end: 5007,
            }],
        };
        RecordedTrace { info, calls: vec![calls] }
    }

    #[test]
    fn a_trace_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.abt");
        let t = sample();
        write(&p, &t).unwrap();
        assert!(is_recorded_trace(&p));
        assert_eq!(RecordedTrace::read(&p).unwrap(), t);
        // About 4-5 bytes a call after the header.
        let len = std::fs::metadata(&p).unwrap().len();
        let header = serde_json::to_vec(&t.info).unwrap().len() as u64;
        assert!(len - header - 16 - 28 <= 7 * 6, "{len}");
    }

    #[test]
    fn a_damaged_trace_is_refused_naming_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.abt");
        write(&p, &sample()).unwrap();
        let good = std::fs::read(&p).unwrap();
        // Truncated in the calls.
        std::fs::write(&p, &good[..good.len() - 3]).unwrap();
        let e = RecordedTrace::read(&p).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("at byte"), "{e}");
        // A flipped byte in the calls fails the checksum.
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 2] ^= 0x40;
        std::fs::write(&p, &bad).unwrap();
        let e = RecordedTrace::read(&p).unwrap_err().to_string();
        let calls_at = 16 + serde_json::to_vec(&sample().info).unwrap().len() + 28;
        assert!(e.contains("checksum") && e.ends_with(&format!("at byte {calls_at}")), "{e}");
        // Not a trace at all.
        std::fs::write(&p, b"alloc,1,2\n").unwrap();
        let e = RecordedTrace::read(&p).unwrap_err().to_string();
        assert!(e.contains("not a recorded CPU trace"), "{e}");
        assert!(!is_recorded_trace(&p));
    }

    #[test]
    fn a_block_given_back_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.abt");
        let mut t = sample();
        // Block 1 (the calloc) is freed at the end; free it once more.
        t.calls[0].push(Recorded { thread: 0, t_ns: 70, call: Call::Free { id: 1 } });
        t.info.processes[0].calls += 1;
        write(&p, &t).unwrap();
        let e = RecordedTrace::read(&p).unwrap_err().to_string();
        assert!(e.contains("block 1 is given back twice") && e.contains("at byte"), "{e}");
        // A gzip-compressed trace cut short names how far it decoded.
        write(&p, &sample()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &std::fs::read(&p).unwrap()).unwrap();
        let gz = gz.finish().unwrap();
        std::fs::write(&p, &gz[..gz.len() - 12]).unwrap();
        let e = RecordedTrace::read(&p).unwrap_err().to_string();
        assert!(e.contains("of the decompressed trace"), "{e}");
    }

    #[test]
    fn varints_and_zigzag_round_trip() {
        for v in [0i64, 1, -1, 63, -64, 1 << 40, -(1 << 40), i64::MAX / 2] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }
}
