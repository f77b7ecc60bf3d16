//! The CSV trace format, v1 (a contract: other tools read and write it).
//!
//! ```text
//! # comment lines start with '#'
//! op,id,bytes,stream
//! alloc,1,1048576,0
//! step,1,,
//! record_stream,1,,7
//! free,1,,
//! sync,,,7
//! empty_cache,,,
//! pool_begin,1,,5
//! pool_end,1,,
//! pool_release,1,,
//! ```
//! `id` names a live allocation (reusable after its free); `bytes` is required for `alloc`;
//! `stream` is optional for `alloc` (default 0). For `step`, the `id` column holds the step number.
//! `record_stream,ID,,STREAM`: stream STREAM uses the live allocation ID, so its free waits for
//! that stream's queued work (PyTorch's event-based deferred free); `sync,,,STREAM` says that
//! stream's work completed (`sync,,,`: the whole device's), so the deferred frees land.
//! `pool_begin,POOL,,STREAM`: allocations on STREAM (every stream when empty) go to private pool
//! POOL (a CUDA graph capture, or `torch.cuda.use_mem_pool`) until `pool_end,POOL,,`, and so do
//! those on a stream that joined the capture (`pool_join,POOL,,STREAM`); each begin
//! makes the pool (or shares it) and `pool_release,POOL,,` ends one use of it (the graph reset
//! or destroyed), after which `empty_cache` may free its cached segments; `empty_cache,POOL,,`
//! empties that pool's cache alone (a MemPool's destructor).
//! Reading is streamed: memory is bounded by the number of live ids, not the file's length.
//!
//! Allocation sites (written by `allocbench capture`) are comment lines, which readers that do
//! not know them skip like any other comment:
//! ```text
//! #site 0 train.py:57 main
//! alloc,1,4096,0
//! #site 1 model.py:31 Attention.forward
//! alloc,2,8192,0
//! alloc,3,8192,0
//! #at 0
//! alloc,4,4096,0
//! ```
//! `#site N FILE:LINE FUNCTION` defines site N (numbered 0, 1, 2... in order; FILE may hold spaces
//! and colons, FUNCTION none), `#at N` returns to a site already defined and `#at -` to no site;
//! each `alloc` row was made at the site most recently defined or returned to (none before the
//! first). A malformed
//! `#site` or `#at` line is an error naming its line, since the allocs after it would be
//! attributed to the wrong site; `# site` (with a space) stays an ordinary comment.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use rustc_hash::{FxHashMap, FxHashSet};

use super::Sites;

use crate::error::InputError;
use crate::event::{Event, PoolOp};
use crate::units::MAX_REQUEST_BYTES;

pub const HEADER: &str = "op,id,bytes,stream";
/// Lines longer than this are not a trace (a binary file, say); stop before reading gigabytes.
const MAX_LINE_BYTES: usize = 4096;
/// What the reader reads from its input at a time.
const CHUNK_BYTES: usize = 1 << 16;

/// Streams events out of a CSV trace, checking each line; errors name `file:line`.
pub struct TraceReader<R> {
    input: R,
    name: String,
    line_no: u64,
    seen_header: bool,
    live: crate::ids::IdSet,
    /// Private pools: begins not yet released per pool, and the pools being allocated to.
    pool_users: rustc_hash::FxHashMap<u64, u64>,
    pools_recording: rustc_hash::FxHashSet<u64>,
    /// Pools every user released: their ids are not begun again (PyTorch never reuses one).
    pools_retired: rustc_hash::FxHashSet<u64>,
    /// The line being read.
    buf: Vec<u8>,
    /// Bytes read from `input` and not yet split into lines: `chunk[start..end]`. Lines are cut
    /// here (one `read` per 64 KiB) rather than through `read_until` per line, which costs two
    /// calls into the (boxed) reader each.
    chunk: Box<[u8]>,
    start: usize,
    end: usize,
    failed: bool,
    site_names: Vec<String>,
    site: Option<u32>,
    /// The last `step` row's number: step numbers increase (a step is the events after it).
    last_step: Option<u64>,
}

/// Opens a trace file for streaming; a `.gz` name is read through gzip.
pub fn read_trace(path: &Path) -> anyhow::Result<TraceReader<Box<dyn BufRead + Send>>> {
    let file = File::open(path).map_err(|e| InputError::new(path.display().to_string(), format!("cannot open trace: {e}")))?;
    let input: Box<dyn BufRead + Send> = if is_gzip_name(path) {
        Box::new(BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(BufReader::new(file))))
    } else {
        Box::new(BufReader::with_capacity(1 << 16, file))
    };
    Ok(TraceReader::new(input, path.display().to_string()))
}

/// `trace.csv.gz` and the like.
pub fn is_gzip_name(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R, name: impl Into<String>) -> Self {
        TraceReader {
            input,
            name: name.into(),
            line_no: 0,
            seen_header: false,
            live: crate::ids::IdSet::default(),
            pool_users: Default::default(),
            pools_recording: Default::default(),
            pools_retired: Default::default(),
            buf: Vec::with_capacity(128),
            chunk: vec![0; CHUNK_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            failed: false,
            site_names: Vec::new(),
            site: None,
            last_step: None,
        }
    }

    fn err(&self, msg: impl Into<String>) -> anyhow::Error {
        InputError::new(format!("{}:{}", self.name, self.line_no), msg).into()
    }

    /// The input, for reading it another way (its header comments, say).
    pub fn into_inner(self) -> R {
        self.input
    }

    /// The site of the allocs read now (the last `#site` or `#at`): right after an alloc, its site.
    pub fn site(&self) -> Option<u32> {
        self.site
    }

    /// The sites defined so far (`#site` lines), as `FILE:LINE in FUNCTION`.
    pub fn site_names(&self) -> &[String] {
        &self.site_names
    }

    /// Reads the rest of the trace for its allocation sites (ids allocated at different sites,
    /// when a trace reuses ids, are left out: which one a block is cannot be told by its id).
    pub fn read_sites(mut self) -> anyhow::Result<Sites> {
        let mut of_id: FxHashMap<u64, u32> = FxHashMap::default();
        let mut ambiguous: FxHashSet<u64> = FxHashSet::default();
        // Not a `for`: the loop reads the reader's site after each event.
        while let Some(event) = self.next() {
            if let Event::Alloc { id, .. } = event? {
                match (self.site, of_id.get(&id)) {
                    (Some(site), None) if !ambiguous.contains(&id) => {
                        of_id.insert(id, site);
                    }
                    (Some(site), Some(&old)) if old == site => {}
                    (_, old) => {
                        if old.is_some() || self.site.is_some() {
                            ambiguous.insert(id);
                        }
                        of_id.remove(&id);
                    }
                }
            }
        }
        Ok(Sites { names: self.site_names, of_id })
    }

    /// A `#site N FILE:LINE FUNCTION` or `#at N` line (`None` for any other comment).
    fn site_line(&mut self, text: &str) -> Option<anyhow::Result<()>> {
        let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        let rest = rest.trim();
        match word {
            "#site" => Some(self.define_site(rest)),
            "#at" if rest == "-" => {
                self.site = None;
                Some(Ok(()))
            }
            "#at" => Some(match rest.parse::<u32>() {
                Ok(n) if (n as usize) < self.site_names.len() => {
                    self.site = Some(n);
                    Ok(())
                }
                Ok(n) => Err(self.err(format!("'#at {n}' names a site not defined yet ({} defined by '#site' lines above)", self.site_names.len()))),
                Err(_) => Err(self.err(format!("bad site line '{}': expected '#at N' (a site number) or '#at -' (no site)", clip(text)))),
            }),
            _ => None,
        }
    }

    fn define_site(&mut self, rest: &str) -> anyhow::Result<()> {
        let expected = "expected '#site N FILE:LINE FUNCTION'";
        let bad = |me: &Self| me.err(format!("bad site line '#site {}': {expected}", clip(rest)));
        let (number, place) = rest.split_once(char::is_whitespace).ok_or_else(|| bad(self))?;
        let number: u32 = number.parse().map_err(|_| bad(self))?;
        let (place, function) = place.trim().rsplit_once(char::is_whitespace).ok_or_else(|| bad(self))?;
        let (file, line) = place.trim_end().rsplit_once(':').ok_or_else(|| bad(self))?;
        let line: u64 = line.parse().map_err(|_| bad(self))?;
        if file.is_empty() {
            return Err(bad(self));
        }
        if number as usize != self.site_names.len() {
            return Err(self.err(format!("'#site {number}' out of order: sites are numbered 0, 1, 2... and the next is {}", self.site_names.len())));
        }
        self.site_names.push(Sites::name(file, line, function));
        self.site = Some(number);
        Ok(())
    }

    /// Ids allocated and not yet freed when the trace ended (or so far).
    pub fn live_ids(&self) -> usize {
        self.live.len()
    }

    fn read_chunk(&mut self) -> Result<usize, anyhow::Error> {
        loop {
            match self.input.read(&mut self.chunk) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // A corrupt or truncated gzip stream surfaces here, and plain text named .gz.
                r => {
                    return Ok(r.map_err(|e| {
                        let what = if self.line_no == 0 && e.to_string().contains("invalid gzip header") {
                            "not gzip-compressed data: name it without .gz, or compress it (gzip)".to_string()
                        } else {
                            format!("read error: {e}")
                        };
                        InputError::new(format!("{}:{}", self.name, self.line_no + 1), what)
                    })?)
                }
            }
        }
    }

    /// A comment says nothing the replay reads: at any length it is a comment (a capture's note
    /// can be long). A site line is data, and keeps the line limit.
    fn is_long_comment(&self) -> bool {
        self.buf[0] == b'#' && !self.buf.starts_with(b"#site ")
    }

    /// Drops the input up to and including the next line end (or to the end of the input).
    fn skip_rest_of_line(&mut self) -> Result<(), anyhow::Error> {
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.chunk[self.start..self.end]) {
                self.start += i + 1;
                return Ok(());
            }
            let n = self.read_chunk()?;
            (self.start, self.end) = (0, n);
            if n == 0 {
                return Ok(());
            }
        }
    }

    fn next_line(&mut self) -> Result<Option<()>, anyhow::Error> {
        self.buf.clear();
        loop {
            let window = &self.chunk[self.start..self.end];
            if let Some(i) = memchr::memchr(b'\n', window) {
                self.buf.extend_from_slice(&window[..=i]);
                self.start += i + 1;
                break;
            }
            self.buf.extend_from_slice(window);
            self.start = self.end;
            if self.buf.len() > MAX_LINE_BYTES {
                if self.is_long_comment() {
                    // The rest of it is skipped, not held.
                    self.skip_rest_of_line()?;
                }
                break;
            }
            let n = self.read_chunk()?;
            (self.start, self.end) = (0, n);
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                break;
            }
        }
        self.line_no += 1;
        if self.buf.len() - self.buf.ends_with(b"\n") as usize > MAX_LINE_BYTES {
            if !self.is_long_comment() {
                return Err(self.err(format!("line longer than {MAX_LINE_BYTES} bytes: not a trace file")));
            }
            self.buf.truncate(1);
            self.buf.push(b'\n');
        }
        Ok(Some(()))
    }

    /// The next row, when it is a canonical row (see [`fast_event`]) lying whole in the chunk
    /// and valid here: read where it lies, not copied out line by line (the copy and the
    /// general path's plumbing were most of a parse). Anything else, errors included, is left
    /// for [`Self::parse_line`], which reads the same line again and words what is wrong.
    #[inline(always)]
    fn next_in_place(&mut self) -> Option<Event> {
        if !self.seen_header {
            return None;
        }
        let window = &self.chunk[self.start..self.end];
        let end = memchr::memchr(b'\n', window)?;
        let ev = fast_event(&window[..end])?;
        if !self.takes_fast(ev) {
            return None;
        }
        self.start += end + 1;
        self.line_no += 1;
        Some(ev)
    }

    /// Whether a canonical row's event is valid here (an alloc of an id not live, under 1 EiB; a
    /// free of a live id), recording it in the live ids if so. A refusal changes nothing: the
    /// general path then finds the same error and words it.
    #[inline(always)]
    fn takes_fast(&mut self, ev: Event) -> bool {
        match ev {
            Event::Alloc { id, bytes, .. } => bytes < MAX_REQUEST_BYTES && self.live.insert(id, true),
            Event::Free { id } => self.live.remove(id).is_some(),
            Event::Step { n } => {
                let increases = crate::event::check_step_order(self.last_step, n).is_ok();
                if increases {
                    self.last_step = Some(n);
                }
                increases
            }
            Event::EmptyCache => true,
            _ => false,
        }
    }

    fn parse_line(&mut self) -> Result<Option<Event>, anyhow::Error> {
        // The fast path takes the canonical rows TraceWriter and captures write; anything else
        // (spaces, comments, errors) goes the general way below, which words the errors.
        if self.seen_header {
            if let Some(ev) = fast_event(&self.buf).filter(|&ev| self.takes_fast(ev)) {
                return Ok(Some(ev));
            }
            // `#at N`, a capture's return to a known site, comes before most of its allocs.
            if let Some(rest) = self.buf.strip_prefix(b"#at ") {
                let rest = rest.strip_suffix(b"\n").unwrap_or(rest);
                if let Some((n, b"" | b"\r")) = number_then(rest) {
                    if (n as usize) < self.site_names.len() {
                        self.site = Some(n as u32);
                        return Ok(None);
                    }
                }
            }
        }
        let text = match std::str::from_utf8(&self.buf) {
            // A UTF-8 byte-order mark (spreadsheet exports) is not part of the header.
            Ok(t) => t.trim_start_matches('\u{feff}').trim_end_matches(['\n', '\r']).trim(),
            // gzip's magic bytes: a compressed trace read as text.
            Err(_) if self.buf.starts_with(&[0x1f, 0x8b]) => {
                // A .gz name was decompressed once already: the data inside is gzip again.
                let fix =
                    if self.name.ends_with(".gz") { "compressed twice: decompress it once (gunzip)" } else { "name the file .csv.gz to have it decompressed" };
                return Err(self.err(format!("gzip-compressed data: {fix}")));
            }
            Err(_) => return Err(self.err("not valid UTF-8 text")),
        };
        if text.starts_with("#site") || text.starts_with("#at") {
            let text = text.to_owned();
            return self.site_line(&text).transpose().map(|_| None);
        }
        if text.starts_with('#') {
            return Ok(None);
        }
        if text.is_empty() {
            return Ok(None);
        }
        if !self.seen_header {
            let normalized: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            if normalized != HEADER {
                return Err(self.err(format!("expected the header '{HEADER}', found '{}'", clip(text))));
            }
            self.seen_header = true;
            return Ok(None);
        }
        let mut fields = text.split(',').map(str::trim);
        let op = fields.next().unwrap_or("");
        let id = fields.next().unwrap_or("");
        let bytes = fields.next().unwrap_or("");
        let stream = fields.next().unwrap_or("");
        if fields.next().is_some() {
            return Err(self.err(format!("more than 4 fields in '{}'", clip(text))));
        }
        let event = match op {
            "alloc" => {
                let id = self.number(id, "id")?;
                if bytes.is_empty() {
                    return Err(self.err("alloc needs a 'bytes' value"));
                }
                // A 0-byte alloc is accepted (PyTorch returns a null pointer for it: see
                // Event::Alloc); its id is live like any other so that its free is accepted.
                let bytes = crate::units::check_request_bytes(self.number(bytes, "bytes")?).map_err(|m| self.err(m))?;
                let stream = if stream.is_empty() { 0 } else { self.number(stream, "stream")? };
                if !self.live.insert(id, true) {
                    return Err(self.err(format!("alloc of id {id}, which is still live (free it first)")));
                }
                Event::Alloc { id, bytes, stream }
            }
            "free" => {
                let id = self.number(id, "id")?;
                if self.live.remove(id).is_none() {
                    return Err(self.err(format!("free of id {id}, which is not live")));
                }
                Event::Free { id }
            }
            "step" => {
                let n = self.number(id, "step number (id column)")?;
                crate::event::check_step_order(self.last_step, n).map_err(|m| self.err(format!("{m} (renumber the steps of joined traces)")))?;
                self.last_step = Some(n);
                Event::Step { n }
            }
            // `empty_cache,POOL,,`: the cache of one private pool (emptyCache(mempool_id)).
            "empty_cache" if id.is_empty() => Event::EmptyCache,
            "empty_cache" => Event::Pool(PoolOp::EmptyCache { pool: self.number(id, "pool (id column)")? }),
            "record_stream" => {
                let id = self.number(id, "id")?;
                if !self.live.contains(id) {
                    return Err(self.err(format!("record_stream of id {id}, which is not live")));
                }
                Event::RecordStream { id, stream: self.number(stream, "stream")? }
            }
            // A number in the id column is a stream put one column early: syncing the whole
            // device instead would replay another trace.
            "sync" if !id.is_empty() => return Err(self.err(format!("sync takes its stream in the stream column ('sync,,,{id}'), not the id column"))),
            "sync" => Event::Sync { stream: if stream.is_empty() { None } else { Some(self.number(stream, "stream")?) } },
            "pool_begin" => {
                let pool = self.number(id, "pool (id column)")?;
                let stream = if stream.is_empty() { None } else { Some(self.number(stream, "stream")?) };
                if stream == Some(0) {
                    // CUDAGraph::capture_begin refuses the default stream.
                    return Err(self.err(format!(
                        "pool_begin of pool {pool} on stream 0: no capture runs on the default stream (leave the stream empty to route every stream)"
                    )));
                }
                if self.pools_retired.contains(&pool) {
                    return Err(self.err(format!("pool_begin of pool {pool}, which every user has released (pool ids are not reused)")));
                }
                // beginAllocateToPool: "already recording to mempool_id".
                if !self.pools_recording.insert(pool) {
                    return Err(self.err(format!("pool_begin of pool {pool}, which is already being allocated to (pool_end it first)")));
                }
                *self.pool_users.entry(pool).or_default() += 1;
                Event::Pool(PoolOp::Begin { pool, stream })
            }
            "pool_end" => {
                let pool = self.number(id, "pool (id column)")?;
                // endAllocateToPool: "not currently recording to mempool_id".
                if !self.pools_recording.remove(&pool) {
                    return Err(self.err(format!("pool_end of pool {pool}, which is not being allocated to")));
                }
                Event::Pool(PoolOp::End { pool })
            }
            "pool_join" => {
                let pool = self.number(id, "pool (id column)")?;
                let stream = self.number(stream, "stream")?;
                if !self.pools_recording.contains(&pool) {
                    return Err(self.err(format!("pool_join of pool {pool}, which is not being allocated to")));
                }
                if stream == 0 {
                    return Err(self.err(format!("pool_join of pool {pool} on stream 0: no capture runs on the default stream")));
                }
                Event::Pool(PoolOp::Join { pool, stream })
            }
            "pool_release" => {
                let pool = self.number(id, "pool (id column)")?;
                // releasePool: one release per use (use_count never goes below 0).
                match self.pool_users.get_mut(&pool) {
                    Some(1) if self.pools_recording.contains(&pool) => {
                        return Err(
                            self.err(format!("pool_release of pool {pool}, which is being allocated to and would be left with no user (pool_end it first)"))
                        )
                    }
                    Some(users) => {
                        *users -= 1;
                        if *users == 0 {
                            self.pool_users.remove(&pool);
                            self.pools_retired.insert(pool);
                        }
                    }
                    None => return Err(self.err(format!("pool_release of pool {pool}, which has no pool_begin left to release"))),
                }
                Event::Pool(PoolOp::Release { pool })
            }
            "pool_use_on_oom" => {
                let pool = self.number(id, "pool (id column)")?;
                // setUseOnOOM needs the pool: made by a pool_begin, not yet released by every user.
                if !self.pool_users.contains_key(&pool) {
                    return Err(self.err(format!("pool_use_on_oom of pool {pool}, which no pool_begin made or every user has released")));
                }
                Event::Pool(PoolOp::UseOnOom { pool })
            }
            other => {
                return Err(self.err(format!(
                    "unknown op '{}' (expected alloc, free, record_stream, sync, step, empty_cache, pool_begin, pool_join, pool_end, pool_release or pool_use_on_oom)",
                    clip(other)
                )))
            }
        };
        Ok(Some(event))
    }

    fn number(&self, field: &str, what: &str) -> Result<u64, anyhow::Error> {
        if field.is_empty() {
            return Err(self.err(format!("missing {what}")));
        }
        field.parse::<u64>().map_err(|_| self.err(format!("bad {what} '{}': expected a non-negative integer", clip(field))))
    }
}

/// A canonical row (`alloc,ID,BYTES,STREAM`, `free,ID,,`, `step,N,,`, `empty_cache,,,`; plain
/// digits, no spaces, LF or CRLF) parsed straight from its bytes; `None` for anything else.
fn fast_event(line: &[u8]) -> Option<Event> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if let Some(rest) = line.strip_prefix(b"alloc,") {
        let (id, rest) = number_then(rest)?;
        let (bytes, rest) = number_then(rest.strip_prefix(b",")?)?;
        let stream = match rest {
            [] | [b','] => 0,
            [b',', s @ ..] => match number_then(s)? {
                (n, []) => n,
                _ => return None,
            },
            _ => return None,
        };
        // `alloc,1,2` (no stream column) is the general path's to judge.
        if rest.is_empty() {
            return None;
        }
        return Some(Event::Alloc { id, bytes, stream });
    }
    let (op, rest) = if let Some(rest) = line.strip_prefix(b"free,") {
        (0, rest)
    } else if let Some(rest) = line.strip_prefix(b"step,") {
        (1, rest)
    } else {
        return (line == b"empty_cache,,,").then_some(Event::EmptyCache);
    };
    match number_then(rest)? {
        (id, b",,") if op == 0 => Some(Event::Free { id }),
        (n, b",,") => Some(Event::Step { n }),
        _ => None,
    }
}

/// The leading digits of `s` (1 to 19 of them: never past u64::MAX) and what follows them.
#[inline]
fn number_then(s: &[u8]) -> Option<(u64, &[u8])> {
    // One pass over at most 20 digits (a 20th means too long); wrapping, as 20 digits can pass
    // u64::MAX before the length check refuses them.
    let (mut n, mut len) = (0u64, 0);
    while let Some(&b) = s.get(len).filter(|_| len < 20) {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        n = n.wrapping_mul(10).wrapping_add(digit as u64);
        len += 1;
    }
    if len == 0 || len > 19 {
        return None;
    }
    Some((n, &s[len..]))
}

fn clip(s: &str) -> String {
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.to_string()
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = anyhow::Result<Event>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if let Some(ev) = self.next_in_place() {
            return Some(Ok(ev));
        }
        loop {
            let step = self.next_line().and_then(|more| match more {
                None => Ok(None),
                Some(()) => self.parse_line().map(Some),
            });
            match step {
                Ok(None) => {
                    if !self.seen_header {
                        self.failed = true;
                        return Some(Err(InputError::new(&self.name, format!("empty trace: no '{HEADER}' header")).into()));
                    }
                    return None;
                }
                Ok(Some(None)) => continue,
                Ok(Some(Some(ev))) => return Some(Ok(ev)),
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// `text` cut (at a character boundary, marked with `…`) so that a line holding it and a short
/// prefix stays under the reader's line limit: a writer never writes what its reader refuses.
fn within_line_limit(text: &str) -> std::borrow::Cow<'_, str> {
    const ROOM: usize = MAX_LINE_BYTES - 64;
    if text.len() <= ROOM {
        return text.into();
    }
    let cut = (0..=ROOM - 3).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &text[..cut]).into()
}

/// Writes events as a v1 CSV trace.
pub struct TraceWriter<W: Write> {
    out: W,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the comment lines (each prefixed with `# `) and the header.
    pub fn new(mut out: W, comments: &[String]) -> std::io::Result<Self> {
        for c in comments {
            for line in c.lines() {
                writeln!(out, "# {}", within_line_limit(line))?;
            }
        }
        writeln!(out, "{HEADER}")?;
        Ok(TraceWriter { out })
    }

    pub fn write(&mut self, ev: &Event) -> std::io::Result<()> {
        match *ev {
            Event::Alloc { id, bytes, stream } => writeln!(self.out, "alloc,{id},{bytes},{stream}"),
            Event::Free { id } => writeln!(self.out, "free,{id},,"),
            Event::EmptyCache => writeln!(self.out, "empty_cache,,,"),
            Event::Step { n } => writeln!(self.out, "step,{n},,"),
            Event::RecordStream { id, stream } => writeln!(self.out, "record_stream,{id},,{stream}"),
            Event::Sync { stream: Some(s) } => writeln!(self.out, "sync,,,{s}"),
            Event::Sync { stream: None } => writeln!(self.out, "sync,,,"),
            Event::Pool(PoolOp::Begin { pool, stream: Some(s) }) => writeln!(self.out, "pool_begin,{pool},,{s}"),
            Event::Pool(PoolOp::Begin { pool, stream: None }) => writeln!(self.out, "pool_begin,{pool},,"),
            Event::Pool(PoolOp::End { pool }) => writeln!(self.out, "pool_end,{pool},,"),
            Event::Pool(PoolOp::Join { pool, stream }) => writeln!(self.out, "pool_join,{pool},,{stream}"),
            Event::Pool(PoolOp::Release { pool }) => writeln!(self.out, "pool_release,{pool},,"),
            Event::Pool(PoolOp::UseOnOom { pool }) => writeln!(self.out, "pool_use_on_oom,{pool},,"),
            Event::Pool(PoolOp::EmptyCache { pool }) => writeln!(self.out, "empty_cache,{pool},,"),
        }
    }

    /// The allocs written next are at site `index`: `#site index DEFINITION` the first time
    /// (sites are numbered 0, 1, 2... in order of definition), `#at index` after; `None`: at no
    /// site (`#at -`).
    pub fn site(&mut self, index: Option<u32>, definition: Option<&str>) -> std::io::Result<()> {
        match (index, definition) {
            (Some(i), Some(d)) => writeln!(self.out, "#site {i} {}", within_line_limit(d)),
            (Some(i), None) => writeln!(self.out, "#at {i}"),
            (None, _) => writeln!(self.out, "#at -"),
        }
    }

    /// A comment line (`# text`) among the rows.
    pub fn comment(&mut self, text: &str) -> std::io::Result<()> {
        for line in text.lines() {
            writeln!(self.out, "# {}", within_line_limit(line))?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<anyhow::Result<Event>> {
        TraceReader::new(text.as_bytes(), "t.csv").collect()
    }

    proptest::proptest! {
        /// The byte-level fast path reads every row exactly as the general parser does (which
        /// takes the same row with a leading space, off the fast path), errors included.
        #[test]
        fn fast_path_agrees_with_the_general_parser(rows in proptest::collection::vec(
            (proptest::sample::select(vec!["alloc", "free", "step", "empty_cache", "allocx", ""]),
             proptest::sample::select(vec!["1", "2", "", "007", "+3", "18446744073709551615", "99999999999999999999", "x"]),
             proptest::sample::select(vec!["", "512", "1152921504606846976", "1152921504606846975", "0", "-1"]),
             proptest::sample::select(vec!["", "0", "7", "s"]),
             proptest::sample::select(vec!["\n", "\r\n", ",\n"])), 1..12)) {
            let mut fast = String::from("op,id,bytes,stream\n");
            let mut general = fast.clone();
            for (op, id, bytes, stream, end) in rows {
                fast += &format!("{op},{id},{bytes},{stream}{end}");
                general += &format!(" {op},{id},{bytes},{stream}{end}");
            }
            let show = |v: Vec<anyhow::Result<Event>>| v.into_iter().map(|r| r.map_err(|e| e.to_string())).collect::<Vec<_>>();
            proptest::prop_assert_eq!(show(parse(&fast)), show(parse(&general)));
        }
    }

    /// Rows are read where they lie in the reader's chunk; a row cut by a chunk's end goes the
    /// general way. Read in 7-byte pieces (every row cut somewhere) and in whole chunks, a trace
    /// longer than a chunk gives the same events and the same error at the same line.
    #[test]
    fn rows_cut_by_a_chunk_end_read_as_whole_ones() {
        struct Trickle<'a>(&'a [u8]);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(7).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut text = String::from("op,id,bytes,stream\r\n");
        for i in 1..=20_000u64 {
            text += &format!("alloc,{i},{},{}\nfree,{i},,\r\n", i * 512 + 3, i % 3);
            if i % 1000 == 0 {
                text += &format!("step,{},,\n# a comment\nempty_cache,,,\n", i / 1000);
            }
        }
        text += "free,5,,\nalloc,1,512,0\n";
        assert!(text.len() > 2 * CHUNK_BYTES);
        let show = |v: Vec<anyhow::Result<Event>>| v.into_iter().map(|r| r.map_err(|e| e.to_string())).collect::<Vec<_>>();
        let whole = show(parse(&text));
        let cut = show(TraceReader::new(std::io::BufReader::with_capacity(7, Trickle(text.as_bytes())), "t.csv").collect());
        assert_eq!(whole.len(), 20_000 * 2 + 20 * 2 + 1);
        assert_eq!(whole.last().unwrap().as_ref().unwrap_err(), &format!("t.csv:{}: free of id 5, which is not live", 1 + 20_000 * 2 + 20 * 3 + 1));
        assert_eq!(whole, cut);
    }

    #[test]
    fn reads_the_documented_example() {
        let evs: Vec<Event> =
            parse("# c\nop,id,bytes,stream\nalloc,1,1048576,0\nstep,1,,\nfree,1,,\nempty_cache,,,\n").into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs, vec![Event::Alloc { id: 1, bytes: 1 << 20, stream: 0 }, Event::Step { n: 1 }, Event::Free { id: 1 }, Event::EmptyCache]);
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("op,id,bytes,stream\nfree,7,,\n", "t.csv:2: free of id 7"),
            ("op,id,bytes,stream\nalloc,1,10,\nalloc,1,10,\n", "t.csv:3: alloc of id 1, which is still live"),
            ("op,id,bytes,stream\nalloc,1,-5,\n", "t.csv:2: bad bytes '-5'"),
            ("op,id,bytes,stream\nmalloc,1,5,\n", "t.csv:2: unknown op 'malloc'"),
            ("op,id,bytes,stream\nalloc,1,0,\nalloc,1,0,\n", "t.csv:3: alloc of id 1, which is still live"),
            ("op,id,bytes,stream\nalloc,1,,\n", "t.csv:2: alloc needs a 'bytes' value"),
            ("op,id,bytes,stream\nalloc,1,2000000000000000000,\n", "t.csv:2: alloc of 2000000000000000000 bytes is 1 EiB or more"),
            ("op,id,bytes,stream\nalloc,1,1152921504606846976,\n", "t.csv:2: alloc of 1152921504606846976 bytes is 1 EiB or more"),
            ("op,id,bytes,stream\nstep,5,,\nstep,3,,\n", "t.csv:3: step 3 after step 5: step numbers must increase"),
            ("op,id,bytes,stream\nstep,2,,\nstep,2,,\n", "t.csv:3: step 2 after step 2"),
            // The general path (spaces) keeps the same order.
            ("op,id,bytes,stream\nstep,4,,\nstep, 1,,\n", "t.csv:3: step 1 after step 4"),
            ("op,id,bytes,stream\nstep, 4,,\nstep,1,,\n", "t.csv:3: step 1 after step 4"),
            ("op,id,bytes,stream\nsync,4,,\n", "t.csv:2: sync takes its stream in the stream column ('sync,,,4')"),
            ("id,op\n", "t.csv:1: expected the header"),
            ("", "t.csv: empty trace"),
        ];
        for (text, want) in cases {
            let err = parse(text).into_iter().find_map(|r| r.err()).unwrap_or_else(|| panic!("no error for {text:?}"));
            let msg = err.to_string();
            assert!(msg.starts_with(want), "{msg:?} should start with {want:?}");
        }
    }

    #[test]
    fn non_utf8_is_an_error_not_a_panic() {
        let bytes = b"op,id,bytes,stream\nalloc,1,\xff\xfe,0\n";
        let res: Vec<_> = TraceReader::new(&bytes[..], "x.csv").collect();
        assert!(res.last().unwrap().as_ref().unwrap_err().to_string().contains("x.csv:2: not valid UTF-8"));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, b"op,id,bytes,stream\nalloc,1,8,0\n").unwrap();
        let gz = gz.finish().unwrap();
        let res: Vec<_> = TraceReader::new(&gz[..], "x.csv").collect();
        assert!(res[0].as_ref().unwrap_err().to_string().contains("x.csv:1: gzip-compressed data: name the file .csv.gz"), "{:?}", res[0]);
        let res: Vec<_> = TraceReader::new(&gz[..], "x.csv.gz").collect();
        assert!(res[0].as_ref().unwrap_err().to_string().contains("x.csv.gz:1: gzip-compressed data: compressed twice"), "{:?}", res[0]);
    }

    #[test]
    fn crlf_bom_and_short_rows_are_accepted() {
        let evs: Vec<Event> =
            parse("\u{feff}op, id, bytes, stream\r\nalloc,1,10\r\nstep,2\r\nfree,1\r\nempty_cache\r\n").into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs, vec![Event::Alloc { id: 1, bytes: 10, stream: 0 }, Event::Step { n: 2 }, Event::Free { id: 1 }, Event::EmptyCache]);
    }

    #[test]
    fn zero_byte_allocs_are_events_and_their_ids_are_live() {
        // NativeCachingAllocator::allocate (c10/cuda/CUDACachingAllocator.cpp) calls malloc only
        // `if (size != 0)`: a 0-byte tensor is a null pointer, not an error.
        let evs: Vec<Event> = parse("op,id,bytes,stream\nalloc,1,0,0\nfree,1,,\n").into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs, vec![Event::Alloc { id: 1, bytes: 0, stream: 0 }, Event::Free { id: 1 }]);
    }

    #[test]
    fn sizes_below_one_eib_are_requests() {
        // NativeCachingAllocator::allocate (c10/cuda/CUDACachingAllocator.cpp) refuses only
        // `size >= one_exa_bytes`; below that a size no device holds is the allocator's OOM.
        let just_below = crate::units::EIB - 1;
        let evs: Vec<Event> =
            parse(&format!("op,id,bytes,stream\nalloc,1,{just_below},0\nalloc,2,{},0\n", 2 * crate::units::PIB)).into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs[0], Event::Alloc { id: 1, bytes: just_below, stream: 0 });
        assert_eq!(evs[1], Event::Alloc { id: 2, bytes: 2 * crate::units::PIB, stream: 0 });
    }

    #[test]
    fn record_stream_needs_a_live_id_and_a_stream() {
        let head = "op,id,bytes,stream\nalloc,1,10,0\n";
        let res = parse(&format!("{head}record_stream,1,,3\nsync,,,3\nsync,,,\n"));
        let evs: Vec<Event> = res.into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs[1..], [Event::RecordStream { id: 1, stream: 3 }, Event::Sync { stream: Some(3) }, Event::Sync { stream: None }]);
        for (line, want) in [("record_stream,2,,3", "id 2, which is not live"), ("record_stream,1,,", "missing stream"), ("sync,,,x", "t.csv:3:")] {
            let res = parse(&format!("{head}{line}\n"));
            let err = res.last().unwrap().as_ref().unwrap_err().to_string();
            assert!(err.contains(want) && err.starts_with("t.csv:3"), "{line}: {err}");
        }
    }

    #[test]
    fn pool_rows_pair_up_as_pytorch_requires() {
        let head = "op,id,bytes,stream\n";
        let res = parse(&format!("{head}pool_begin,4,,7\nalloc,1,10,7\npool_end,4,,\npool_begin,4,,\npool_end,4,,\npool_release,4,,\npool_release,4,,\n"));
        let evs: Vec<Event> = res.into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(evs[0], Event::Pool(PoolOp::Begin { pool: 4, stream: Some(7) }));
        assert_eq!(evs[3], Event::Pool(PoolOp::Begin { pool: 4, stream: None }));
        assert_eq!(evs[6], Event::Pool(PoolOp::Release { pool: 4 }));
        for (rows, want) in [
            ("pool_begin,1,,\npool_begin,1,,2", "t.csv:3: pool_begin of pool 1, which is already being allocated to"),
            ("pool_begin,1,,\npool_end,2,,", "t.csv:3: pool_end of pool 2, which is not being allocated to"),
            ("pool_begin,1,,\npool_end,1,,\npool_release,1,,\npool_release,1,,", "t.csv:5: pool_release of pool 1, which has no pool_begin left"),
            ("pool_begin,,,", "t.csv:2: missing pool (id column)"),
            ("pool_begin,1,,\npool_release,1,,", "t.csv:3: pool_release of pool 1, which is being allocated to"),
            ("pool_begin,1,,0", "t.csv:2: pool_begin of pool 1 on stream 0: no capture runs on the default stream"),
            ("pool_join,1,,4", "t.csv:2: pool_join of pool 1, which is not being allocated to"),
            ("pool_begin,1,,3\npool_join,1,,", "t.csv:3: missing stream"),
            ("pool_begin,1,,\npool_end,1,,\npool_release,1,,\npool_begin,1,,", "t.csv:5: pool_begin of pool 1, which every user has released"),
            ("pool_begin,1,,x", "t.csv:2:"),
            ("pool_use_on_oom,1,,", "t.csv:2: pool_use_on_oom of pool 1, which no pool_begin made"),
            (
                "pool_begin,1,,\npool_end,1,,\npool_release,1,,\npool_use_on_oom,1,,",
                "t.csv:5: pool_use_on_oom of pool 1, which no pool_begin made or every user has released",
            ),
        ] {
            let res = parse(&format!("{head}{rows}\n"));
            let err = res.last().unwrap().as_ref().unwrap_err().to_string();
            assert!(err.starts_with(want), "{rows}: {err}");
        }
    }

    #[test]
    fn ids_can_be_reused_after_free() {
        let res = parse("op,id,bytes,stream\nalloc,1,10,0\nfree,1,,\nalloc,1,20,3\n");
        assert!(res.iter().all(|r| r.is_ok()));
        assert_eq!(res[2].as_ref().unwrap(), &Event::Alloc { id: 1, bytes: 20, stream: 3 });
    }

    #[test]
    fn gzip_traces_read_like_plain_ones_and_corruption_names_the_line() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let text = "op,id,bytes,stream\nalloc,1,10,0\nstep,1,,\nfree,1,,\n";
        let path = dir.path().join("t.csv.gz");
        let mut gz = flate2::write::GzEncoder::new(File::create(&path).unwrap(), flate2::Compression::default());
        gz.write_all(text.as_bytes()).unwrap();
        gz.finish().unwrap();
        let evs: Vec<Event> = read_trace(&path).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(evs, parse(text).into_iter().map(|e| e.unwrap()).collect::<Vec<_>>());

        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.csv.gz");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = read_trace(&cut).unwrap().find_map(|r| r.err()).expect("a truncated gzip stream is an error");
        assert!(err.to_string().contains("cut.csv.gz:"), "{err}");
    }

    /// Each alloc with the site the reader gives right after it.
    fn allocs_and_sites(text: &str) -> Vec<(u64, Option<String>)> {
        let mut reader = TraceReader::new(text.as_bytes(), "t.csv");
        let mut out = Vec::new();
        while let Some(event) = reader.next() {
            if let Event::Alloc { id, .. } = event.unwrap() {
                out.push((id, reader.site().map(|s| reader.site_names()[s as usize].clone())));
            }
        }
        out
    }

    const WITH_SITES: &str = "# c\nop,id,bytes,stream\nalloc,1,8,0\n#site 0 train.py:57 main\nalloc,2,8,0\n# op mm\n#site 1 my model/a:b.py:31 Attention.forward\nalloc,3,8,0\nalloc,4,8,0\n#at 0\nalloc,5,8,0\nfree,5,,\n#at -\nalloc,6,8,0\n";

    /// A reader that hands out at most `step` bytes per call (cycling 1..=step), then an error
    /// when `fail` is set: lines cut anywhere across reads.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
        fail: bool,
    }

    impl std::io::Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.data.len() && self.fail {
                return Err(std::io::Error::other("disk on fire"));
            }
            let n = (1 + self.at % self.step).min(out.len()).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn lines_cut_across_reads_parse_as_whole_lines() {
        // Past two 64 KiB chunks, with comments, CRLF rows, site lines and no newline at the end.
        let mut text = String::from("# c\r\nop,id,bytes,stream\n#site 0 a.py:1 f\n");
        for i in 1..6000u64 {
            text += &format!("alloc,{i},{},0\r\n# note {i}\nfree,{i},,\n", 512 * i);
        }
        text += "step,1,,";
        assert!(text.len() > 2 * CHUNK_BYTES);
        let whole: Vec<Event> = parse(&text).into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(whole.len(), 2 * 5999 + 1);
        for step in [1, 3, 7, 4096] {
            let input = std::io::BufReader::with_capacity(5, Trickle { data: text.clone().into_bytes(), at: 0, step, fail: false });
            let cut: Vec<Event> = TraceReader::new(input, "t.csv").map(|e| e.unwrap()).collect();
            assert_eq!(cut, whole, "read {step} bytes at a time");
        }
    }

    #[test]
    fn overlong_lines_and_read_errors_name_their_line() {
        let long = format!("op,id,bytes,stream\nalloc,1,512,0\nfree,1,{}\nfree,1,,\n", "9".repeat(MAX_LINE_BYTES));
        let errs: Vec<String> = parse(&long).into_iter().filter_map(|e| e.err()).map(|e| e.to_string()).collect();
        assert_eq!(errs, [format!("t.csv:3: line longer than {MAX_LINE_BYTES} bytes: not a trace file")]);
        // A comment is skipped at any length (a capture's note can be long), read in pieces.
        let comment = format!("op,id,bytes,stream\nalloc,1,512,0\n#{}\nfree,1,,\n# {}", "x".repeat(10 * MAX_LINE_BYTES), "y".repeat(3 * MAX_LINE_BYTES));
        let events: Vec<Event> = parse(&comment).into_iter().map(|e| e.unwrap()).collect();
        assert_eq!(events, [Event::Alloc { id: 1, bytes: 512, stream: 0 }, Event::Free { id: 1 }]);
        let input = std::io::BufReader::with_capacity(5, Trickle { data: comment.clone().into_bytes(), at: 0, step: 7, fail: false });
        assert_eq!(TraceReader::new(input, "t.csv").map(|e| e.unwrap()).collect::<Vec<_>>(), events);
        let site = format!("op,id,bytes,stream\n#site 0 {}.py:1 f\nalloc,1,512,0\n", "s".repeat(MAX_LINE_BYTES));
        assert!(parse(&site).into_iter().any(|e| e.is_err()), "a site line keeps the limit");
        // A comment of exactly the limit (newline aside) is a line like any other.
        let at_limit = format!("op,id,bytes,stream\n#{}\nalloc,1,512,0\n", "x".repeat(MAX_LINE_BYTES - 1));
        assert!(parse(&at_limit).into_iter().all(|e| e.is_ok()));
        let input = std::io::BufReader::new(Trickle { data: b"op,id,bytes,stream\nalloc,1,512,0\nfree,1".to_vec(), at: 0, step: 4, fail: true });
        let results: Vec<_> = TraceReader::new(input, "t.csv").collect();
        let err = results.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(err.starts_with("t.csv:3: read error: disk on fire"), "{err}");
    }

    #[test]
    fn site_lines_give_each_alloc_its_site() {
        let site = |s: &str| Some(s.to_string());
        assert_eq!(
            allocs_and_sites(WITH_SITES),
            vec![
                (1, None),
                (2, site("train.py:57 in main")),
                (3, site("my model/a:b.py:31 in Attention.forward")),
                (4, site("my model/a:b.py:31 in Attention.forward")),
                (5, site("train.py:57 in main")),
                (6, None)
            ]
        );
        let sites = TraceReader::new(WITH_SITES.as_bytes(), "t.csv").read_sites().unwrap();
        assert_eq!(sites.names, ["train.py:57 in main", "my model/a:b.py:31 in Attention.forward"]);
        assert_eq!(sites.of_id, [(2, 0), (3, 1), (4, 1), (5, 0)].into_iter().collect());
    }

    #[test]
    fn site_lines_change_no_event() {
        // What a reader that skips every comment sees (the v1 contract) is what this one reads.
        let stripped: String = WITH_SITES.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect();
        let evs = |t: &str| parse(t).into_iter().map(|e| e.unwrap()).collect::<Vec<_>>();
        assert_eq!(evs(WITH_SITES), evs(&stripped));
        assert!(TraceReader::new(stripped.as_bytes(), "t.csv").read_sites().unwrap().is_empty());
    }

    #[test]
    fn a_reused_id_keeps_its_site_only_when_every_alloc_agrees() {
        let text = "op,id,bytes,stream\n#site 0 a.py:1 f\nalloc,1,8,0\nfree,1,,\nalloc,2,8,0\nfree,2,,\n#site 1 a.py:2 g\nalloc,1,8,0\n#at 0\nalloc,2,8,0\n";
        let sites = TraceReader::new(text.as_bytes(), "t.csv").read_sites().unwrap();
        assert_eq!(sites.of_id, [(2, 0)].into_iter().collect(), "id 1 was allocated at two sites: which block is which cannot be told");
    }

    #[test]
    fn malformed_site_lines_are_errors_naming_the_line() {
        let head = "op,id,bytes,stream\n#site 0 a.py:1 f\n";
        for (line, want) in [
            ("#site x a.py:1 f", "t.csv:3: bad site line '#site x a.py:1 f': expected '#site N FILE:LINE FUNCTION'"),
            ("#site 1 a.py f", "t.csv:3: bad site line"),
            ("#site 1 a.py:x f", "t.csv:3: bad site line"),
            ("#site 1 a.py:3", "t.csv:3: bad site line"),
            ("#site 1 :3 f", "t.csv:3: bad site line"),
            ("#site", "t.csv:3: bad site line"),
            ("#site 2 a.py:3 f", "t.csv:3: '#site 2' out of order: sites are numbered 0, 1, 2... and the next is 1"),
            ("#at 1", "t.csv:3: '#at 1' names a site not defined yet (1 defined"),
            ("#at", "t.csv:3: bad site line '#at': expected '#at N'"),
            ("#at -1", "t.csv:3: bad site line"),
        ] {
            let err = parse(&format!("{head}{line}\nalloc,1,8,0\n")).into_iter().find_map(|r| r.err()).unwrap_or_else(|| panic!("no error for {line:?}"));
            assert!(err.to_string().starts_with(want), "{line}: {err}");
        }
        // Comments that only look alike stay comments.
        for line in ["# site 0 a.py:1 f", "#sites below", "#atomic", "## at 3"] {
            assert!(parse(&format!("{head}{line}\nalloc,1,8,0\n")).iter().all(|r| r.is_ok()), "{line}");
        }
    }

    #[test]
    fn write_then_read_is_identical() {
        let evs = vec![
            Event::Step { n: 0 },
            Event::Alloc { id: 5, bytes: 999, stream: 2 },
            Event::RecordStream { id: 5, stream: 7 },
            Event::EmptyCache,
            Event::Free { id: 5 },
            Event::Sync { stream: Some(7) },
            Event::Sync { stream: None },
            Event::Pool(PoolOp::Begin { pool: 3, stream: Some(9) }),
            Event::Pool(PoolOp::Join { pool: 3, stream: 10 }),
            Event::Pool(PoolOp::End { pool: 3 }),
            Event::Pool(PoolOp::Begin { pool: 3, stream: None }),
            Event::Pool(PoolOp::UseOnOom { pool: 3 }),
            Event::Pool(PoolOp::End { pool: 3 }),
            Event::Pool(PoolOp::Release { pool: 3 }),
            Event::Pool(PoolOp::Release { pool: 3 }),
            Event::Pool(PoolOp::EmptyCache { pool: 3 }),
        ];
        let mut w = TraceWriter::new(Vec::new(), &["hello\nworld".to_string()]).unwrap();
        for e in &evs {
            w.write(e).unwrap();
        }
        let buf = w.finish().unwrap();
        let back: Vec<Event> = TraceReader::new(&buf[..], "rt").map(|r| r.unwrap()).collect();
        assert_eq!(back, evs);
    }
}
