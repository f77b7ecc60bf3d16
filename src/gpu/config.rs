//! `PYTORCH_CUDA_ALLOC_CONF` parsing, with PyTorch's syntax, checks and error wording
//! (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp; torch 2.15).

use std::fmt;

use super::torch_version::TorchVersion;
use crate::error::InputError;
use crate::units::{GIB, MIB};

/// kLargeBuffer: the 20 MiB segment for 1–10 MiB requests and the minimum for the `_mb` knobs.
pub const LARGE_BUFFER_BYTES: u64 = 20 * MIB;
/// kRoundUpPowerOfTwoIntervals: buckets of the roundup table, 1 MiB … 64 GiB.
pub const ROUNDUP_INTERVALS: usize = 16;

/// The allocator settings that change placement. `Default` is PyTorch's default.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// `max_split_size_mb` in bytes; `u64::MAX` means unlimited (PyTorch's SIZE_MAX).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes (default: `large_segment_size`, so 20 MiB).
    pub max_non_split_rounding_size: u64,
    /// Divisions per size bucket (idx = clamp(log2(n) − 20, 0, 15)); 0 or 1 = plain 512 rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// In (0, 1); 0 = off. Only acts when a memory fraction below 1 is set.
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// `per_process_memory_fraction`; 1.0 = no cap.
    pub per_process_memory_fraction: f64,
    /// `large_segment_size_mb` in bytes (NEW only; default 20 MiB).
    pub large_segment_size: u64,
    /// `throw_on_cudamalloc_oom` (torch 2.12+): refuse a segment larger than the device's free
    /// memory before any device call, without flushing the cache and retrying.
    pub throw_on_cudamalloc_oom: bool,
    /// `expandable_segments_reserve` (torch 2.15): each expandable segment's address reserve.
    pub expandable_segments_reserve: ExpandableReserve,
    /// The string this was parsed from, for results.
    pub source: String,
    /// The PyTorch release whose rules apply (its knobs, and its allocator's versioned rules).
    pub torch: TorchVersion,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: LARGE_BUFFER_BYTES,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: 1.0,
            large_segment_size: LARGE_BUFFER_BYTES,
            throw_on_cudamalloc_oom: false,
            expandable_segments_reserve: ExpandableReserve::Default,
            source: String::new(),
            torch: TorchVersion::selected(),
        }
    }
}

impl fmt::Display for AllocatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.source.is_empty() {
            write!(f, "(default)")
        } else {
            write!(f, "{}", self.source)
        }
    }
}

/// The environment variables PyTorch reads, in priority order. torch 2.15's libc10 takes every
/// key, device-generic ones included, from PYTORCH_CUDA_ALLOC_CONF when it is set, else from
/// PYTORCH_ALLOC_CONF (the order of CUDAAllocatorConfig::instance() in
/// c10/cuda/CUDAAllocatorConfig.h; checked against the venv's libc10 with both set, although
/// AllocatorConfig.h calls PYTORCH_ALLOC_CONF the primary one).
pub const ENV_VARS: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

impl AllocatorConfig {
    /// Reads the config from the environment, as PyTorch does at first use.
    pub fn from_env() -> Result<Self, InputError> {
        let [first, second] = ENV_VARS.map(|var| std::env::var(var).ok());
        Self::from_vars(first.as_deref(), second.as_deref())
    }

    /// The config of a process whose environment holds `PYTORCH_CUDA_ALLOC_CONF` = `cuda` and
    /// `PYTORCH_ALLOC_CONF` = `generic` ([`ENV_VARS`]): the first that is set, whole; an empty
    /// value counts as set (c10::utils::get_env), and means the defaults.
    pub fn from_vars(cuda: Option<&str>, generic: Option<&str>) -> Result<Self, InputError> {
        match ENV_VARS.into_iter().zip([cuda, generic]).find_map(|(var, text)| Some((var, text?))) {
            Some((var, text)) => Self::parse(text).map_err(|e| InputError::new(var, e.message)),
            None => Ok(Self::default()),
        }
    }

    /// Parses `key:value,key:value` with `[a:b,c:d]` lists as torch 2.15 does
    /// (AcceleratorAllocatorConfig::parseArgs in c10/core/AllocatorConfig.cpp, then
    /// CUDAAllocatorConfig::parseArgs): whitespace is dropped; tokens are read by position, so the
    /// token after a key and the one after a value are skipped whatever they are
    /// (ConfigTokenizer::checkToken's result is never checked: `max_split_size_mb,64` is accepted);
    /// numbers are read as std::stoull / std::stod read them (a valid prefix: `512MB` is 512); a
    /// stray `,` stands where a key should and is refused.
    /// Parsed for the release `--torch-version` selected ([`TorchVersion::selected`]).
    pub fn parse(text: &str) -> Result<Self, InputError> {
        Self::parse_for(text, TorchVersion::selected())
    }

    /// [`Self::parse`] as torch `torch` parses it: a key that release does not have is refused
    /// as its parser refuses it.
    pub fn parse_for(text: &str, torch: TorchVersion) -> Result<Self, InputError> {
        let mut cfg = AllocatorConfig { source: text.trim().to_string(), torch, ..Default::default() };
        let t = Tokens(tokenize(text));
        for (j, tok) in t.0.iter().enumerate() {
            // Keys stand at every fourth token (key, ':', value, ','), lists aside: a key of a
            // later release is looked for wherever it stands, as the parse below would reach it.
            if let Some(since) = TorchVersion::conf_key_since(tok) {
                if torch < since && t.0.get(j + 1).is_some_and(|n| n == ":") {
                    return Err(conf_error(format!("Unrecognized CachingAllocator option: {tok} (torch {torch} has no such key; it came in {since})")));
                }
            }
        }
        // parseArgs reads large_segment_size_mb first, wherever it stands, because the two `_mb`
        // limits below are checked against it; then max_non_split_rounding_size defaults to it.
        for (j, tok) in t.0.iter().enumerate() {
            if tok == "large_segment_size_mb" {
                // parseLargeSegmentSize: must be > kMinLargeAlloc (10 MiB).
                let mb = t.size_t(j, j + 2)?;
                if mb <= 10 {
                    return Err(conf_error(format!("CachingAllocator option large_segment_size_mb too small, must be > 10, got {mb}")));
                }
                cfg.large_segment_size = mb.min(u64::MAX / MIB) * MIB;
            }
        }
        cfg.max_non_split_rounding_size = cfg.large_segment_size;
        let mut i = 0;
        while i < t.0.len() {
            let key = t.0[i].as_str();
            // Each arm returns the index of the value's last token.
            let value_end = match key {
                // Read (and checked) before this loop.
                "large_segment_size_mb" => i + 2,
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb = t.size_t(i, i + 2)?;
                    // parseMaxSplitSize / parseMaxNonSplitRoundingSize
                    // (c10/core/AllocatorConfig.cpp): the minimum is large_segment_size_ / kMB,
                    // so a value below large_segment_size_mb is rejected.
                    let min_mb = cfg.large_segment_size / MIB;
                    if mb < min_mb {
                        return Err(conf_error(format!("CachingAllocator option {key} too small, must be >= {min_mb}")));
                    }
                    if mb == min_mb && !torch.mb_minimum_is_allowed() {
                        return Err(conf_error(format!("CachingAllocator option {key} too small, must be > {min_mb}")));
                    }
                    let bytes = mb.min(u64::MAX / MIB) * MIB;
                    if key == "max_split_size_mb" {
                        cfg.max_split_size = bytes;
                    } else {
                        cfg.max_non_split_rounding_size = bytes;
                    }
                    i + 2
                }
                "garbage_collection_threshold" => {
                    let v = t.double(i, i + 2)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(conf_error("garbage_collect_threshold is invalid, set it in (0.0, 1.0)"));
                    }
                    cfg.garbage_collection_threshold = v;
                    i + 2
                }
                "per_process_memory_fraction" => {
                    // parsePerProcessMemoryFraction (c10/cuda/CUDAAllocatorConfig.cpp).
                    let v = t.double(i, i + 2)?;
                    if !(0.0..=1.0).contains(&v) {
                        return Err(conf_error("per_process_memory_fraction is invalid, set it in [0.0, 1.0]"));
                    }
                    cfg.per_process_memory_fraction = v;
                    i + 2
                }
                "expandable_segments" => {
                    cfg.expandable_segments = t.boolean(i, i + 2)?;
                    i + 2
                }
                "roundup_power2_divisions" => parse_roundup(&t, i, &mut cfg.roundup_power2_divisions, torch)?,
                "backend" => match t.value(i, i + 2)? {
                    "native" => i + 2,
                    "cudaMallocAsync" => {
                        return Err(conf_error("backend:cudaMallocAsync is the driver's pool, not this policy: use --allocator async (real GPU) instead"))
                    }
                    other => return Err(conf_error(format!("Unknown allocator backend, options should be native or cudaMallocAsync, got '{other}'"))),
                },
                // Knobs that exist in PyTorch but do not change device placement: checked, ignored
                // (ROCm's `hip` spellings are accepted by CUDA builds too).
                "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_hip_host_register"
                | "pinned_use_background_threads"
                | "pinned_free_catch_all"
                | "graph_capture_record_stream_reuse" => {
                    t.boolean(i, i + 2)?;
                    i + 2
                }
                "pinned_num_register_threads" => {
                    // parsePinnedNumRegisterThreads: a power of 2, at most pinned_max_register_threads() (128).
                    let n = t.size_t(i, i + 2)?;
                    if !n.is_power_of_two() {
                        return Err(conf_error(format!("Number of register threads has to be power of 2, got {n}")));
                    }
                    if n > 128 {
                        return Err(conf_error(format!("Number of register threads should be less than or equal to 128, got {n}")));
                    }
                    i + 2
                }
                // Host-only (pinned memory) limits of torch 2.15: a number, read with std::stoull
                // (parsePinnedMaxRoundThreshold, parsePinnedMaxCachedSize), no bound checked.
                "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => {
                    t.size_t(i, i + 2)?;
                    i + 2
                }
                "pinned_reserve_segment_size_mb" => {
                    if t.size_t(i, i + 2)? == 0 {
                        return Err(conf_error("Pinned reserve segment size has to be greater than 0"));
                    }
                    i + 2
                }
                // Per-stream-class reserves apply only to streams tagged through the C++ API,
                // which no trace carries: every stream here is untagged, so they change nothing.
                "expandable_segments_reserve_by_class" => skip_reserve_classes(&t, i)?,
                "throw_on_cudamalloc_oom" => {
                    cfg.throw_on_cudamalloc_oom = t.boolean(i, i + 2)?;
                    i + 2
                }
                "expandable_segments_reserve" => {
                    cfg.expandable_segments_reserve = ExpandableReserve::parse(t.value(i, i + 2)?);
                    i + 2
                }
                "," | ":" | "[" | "]" => {
                    return Err(conf_error(format!("Unrecognized key '{key}' in CachingAllocator config: a stray '{key}' where a key should be")))
                }
                other => return Err(conf_error(format!("Unrecognized key '{other}' in CachingAllocator config"))),
            };
            // The separator after the value is skipped, whatever it is.
            i = value_end + 2;
        }
        Ok(cfg)
    }

    /// Parses the value of `--conf`, or the environment when `None`.
    pub fn from_arg(conf: Option<&str>) -> Result<Self, InputError> {
        match conf {
            Some(c) => Self::parse(c),
            None => Self::from_env(),
        }
    }

    /// The bytes the allocator may reserve on a `capacity` device when a fraction below 1 is set:
    /// setMemoryFraction's allowed_memory_maximum = fraction × total memory (none at 1.0).
    pub fn allowed_bytes(&self, capacity: u64) -> Option<u64> {
        (self.per_process_memory_fraction < 1.0).then(|| (self.per_process_memory_fraction * capacity as f64).floor() as u64)
    }

    /// A GC that actually runs needs both a threshold and a memory cap (pytorch#106660). In the
    /// newest c10/cuda/CUDACachingAllocator.cpp, setMemoryFraction leaves allowed_memory_maximum
    /// empty for a fraction of 1.0 and malloc garbage-collects only when it has a value, so
    /// `per_process_memory_fraction:1.0` does not enable the GC.
    pub fn gc_enabled(&self) -> bool {
        self.garbage_collection_threshold > 0.0 && self.per_process_memory_fraction < 1.0
    }

    /// Settings that fight each other, or that PyTorch ignores in the mode chosen: one line each,
    /// flagged by `advise` (never recommended) and `diagnose`. The one place these rules live.
    pub fn conflicts(&self) -> Vec<String> {
        let mut out = Vec::new();
        let split_set = self.max_split_size != u64::MAX;
        if split_set && self.expandable_segments {
            out.push(
                "max_split_size_mb with expandable_segments:True: together they let reserved memory grow without bound \
                 (pytorch PR #193400); keep one of them"
                    .into(),
            );
        }
        if self.garbage_collection_threshold > 0.0 && self.per_process_memory_fraction >= 1.0 {
            out.push(
                "garbage_collection_threshold without per_process_memory_fraction below 1: PyTorch runs the GC only under a memory cap \
                 (malloc checks allowed_memory_maximum), so it never runs; add e.g. per_process_memory_fraction:0.99"
                    .into(),
            );
        } else if self.gc_enabled() && self.expandable_segments {
            out.push(
                "garbage_collection_threshold with expandable_segments:True: the GC frees only whole non-expandable segments \
                 (garbage_collect_cached_blocks), and every segment is expandable, so it frees nothing"
                    .into(),
            );
        }
        if !split_set && self.max_non_split_rounding_size != self.large_segment_size {
            out.push(
                "max_non_split_rounding_mb without max_split_size_mb: it applies only to oversize blocks (get_free_block), \
                 and without max_split_size_mb there are none, so PyTorch ignores it"
                    .into(),
            );
        }
        out
    }
}

fn conf_error(message: impl Into<String>) -> InputError {
    InputError::new("--conf", message)
}

/// A conf string's tokens (ConfigTokenizer), read by position with its checks and PyTorch's
/// number parsing.
struct Tokens(Vec<String>);

impl Tokens {
    fn get(&self, at: usize) -> Option<&str> {
        self.0.get(at).map(String::as_str)
    }

    /// The value at `at` of the key at `key_at`; the config must not end before it.
    fn value(&self, key_at: usize, at: usize) -> Result<&str, InputError> {
        let key = &self.0[key_at];
        if key_at + 1 >= self.0.len() {
            return Err(conf_error(format!("Error parsing CachingAllocator settings, expected : after '{key}'")));
        }
        self.get(at).ok_or_else(|| conf_error(format!("Error, expecting {key} value")))
    }

    fn size_t(&self, key_at: usize, at: usize) -> Result<u64, InputError> {
        let v = self.value(key_at, at)?;
        stoull(v).ok_or_else(|| conf_error(format!("Error, expecting digit string in config for {}, got '{v}'", self.0[key_at])))
    }

    fn double(&self, key_at: usize, at: usize) -> Result<f64, InputError> {
        let v = self.value(key_at, at)?;
        stod(v).ok_or_else(|| conf_error(format!("Error, expecting a number for {}, got '{v}'", self.0[key_at])))
    }

    /// ConfigTokenizer::toBool: exactly `True` or `False`.
    fn boolean(&self, key_at: usize, at: usize) -> Result<bool, InputError> {
        match self.value(key_at, at)? {
            "True" => Ok(true),
            "False" => Ok(false),
            v => Err(conf_error(format!("Expected a single True/False argument for {}, got '{v}'", self.0[key_at]))),
        }
    }
}

/// std::stoull in base 10: an optional sign and the longest run of digits after it (`512MB` is
/// 512); a negative number wraps, as strtoull negates in unsigned arithmetic. `None` when there is
/// no digit or the digits exceed u64.
fn stoull(s: &str) -> Option<u64> {
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    let v: u64 = digits[..end].parse().ok()?;
    Some(if negative { v.wrapping_neg() } else { v })
}

/// std::stod: the longest prefix strtod reads (decimal, hexadecimal, `inf`, `nan`). `None` when
/// there is none, or when the value is out of range (strtod's ERANGE: an overflow, or a nonzero
/// number that underflows to a subnormal or zero), as std::stod throws then.
fn stod(s: &str) -> Option<f64> {
    let (sign, body) = match s.as_bytes().first() {
        Some(b'-') => (-1.0, &s[1..]),
        Some(b'+') => (1.0, &s[1..]),
        _ => (1.0, s),
    };
    let lower = body.to_ascii_lowercase();
    if lower.starts_with("inf") {
        return Some(sign * f64::INFINITY);
    }
    if lower.starts_with("nan") {
        return Some(f64::NAN);
    }
    let digits_from = |text: &str, start: usize, radix: u32| text[start..].find(|c: char| !c.is_digit(radix)).map_or(text.len(), |n| start + n);
    let (value, nonzero) = if let Some(hex) = lower.strip_prefix("0x").filter(|h| h.starts_with(|c: char| c.is_ascii_hexdigit() || c == '.')) {
        // Hexadecimal: mantissa digits, an optional '.', and an optional binary exponent `p±N`.
        let int_end = digits_from(hex, 0, 16);
        let (frac, frac_end) = match hex[int_end..].strip_prefix('.') {
            Some(_) => (&hex[int_end + 1..digits_from(hex, int_end + 1, 16)], digits_from(hex, int_end + 1, 16)),
            None => ("", int_end),
        };
        if int_end == 0 && frac.is_empty() {
            return Some(0.0);
        }
        let mantissa = hex[..int_end].chars().chain(frac.chars()).fold(0.0f64, |m, c| m * 16.0 + c.to_digit(16).unwrap_or(0) as f64);
        let mut exp = -4 * frac.len() as i32;
        let after = &hex[frac_end..];
        if let Some(e) = after.strip_prefix('p') {
            let (esign, edigits) = match e.as_bytes().first() {
                Some(b'-') => (-1, &e[1..]),
                Some(b'+') => (1, &e[1..]),
                _ => (1, e),
            };
            let end = digits_from(edigits, 0, 10);
            if end > 0 {
                exp = exp.saturating_add(esign * edigits[..end].parse::<i32>().unwrap_or(i32::MAX));
            }
        }
        (mantissa * 2f64.powi(exp), mantissa != 0.0)
    } else {
        // Decimal: digits, an optional '.' and digits (one digit at least), an optional `e±N`.
        let int_end = digits_from(&lower, 0, 10);
        let mut end = int_end;
        if lower[end..].starts_with('.') {
            end = digits_from(&lower, end + 1, 10);
        }
        let mantissa = &lower[..end];
        if !mantissa.bytes().any(|b| b.is_ascii_digit()) {
            return None;
        }
        if lower[end..].starts_with('e') {
            let sign_len = usize::from(lower[end + 1..].starts_with(['+', '-']));
            let exp_end = digits_from(&lower, end + 1 + sign_len, 10);
            if exp_end > end + 1 + sign_len {
                end = exp_end;
            }
        }
        (lower[..end].parse::<f64>().ok()?, mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b)))
    };
    if value.is_infinite() || (nonzero && value < f64::MIN_POSITIVE) {
        return None;
    }
    Some(sign * value)
}

fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        // ConfigTokenizer drops std::isspace characters (ASCII whitespace).
        if c.is_ascii_whitespace() || c == '\x0b' {
            continue;
        }
        if matches!(c, ',' | ':' | '[' | ']') {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            out.push(c.to_string());
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `roundup_power2_divisions:4` or `[64:8,256:4,>:1]`, after
/// AcceleratorAllocatorConfig::parseRoundUpPower2Divisions (c10/core/AllocatorConfig.cpp): the
/// first explicit key of a list also fills every bucket below it (the `first_value` flag clears
/// only on an explicit key, so a `>` before it does not stop that); later keys set only their
/// own bucket; gaps keep what they had; `>` fills from the last explicit bucket + 1 (1 when none
/// came yet) to the end (torch 2.9: from the last explicit bucket itself, 0 when none came:
/// [`TorchVersion::roundup_tail_skips_last_key`]); `[]` sets nothing; a `,` before the `]` is allowed. A single number must
/// be a power of 2 (0 is refused there, unlike in a list). The table is not reset here: parseArgs
/// resets it once per parse, so a repeated key writes over the first one's table. Returns the
/// index of the value's last token.
fn parse_roundup(t: &Tokens, key_at: usize, table: &mut [u64; ROUNDUP_INTERVALS], torch: TorchVersion) -> Result<usize, InputError> {
    let tail_from = torch.roundup_tail_skips_last_key() as usize;
    let i = key_at + 2;
    if t.value(key_at, i)? != "[" {
        let v = t.size_t(key_at, i)?;
        if !v.is_power_of_two() {
            return Err(conf_error(format!("For roundups, the divisions has to be power of 2, got {v}")));
        }
        *table = [v; ROUNDUP_INTERVALS];
        return Ok(i);
    }
    let mut first = true;
    let mut last_index = 0usize;
    walk_pairs(t, i, "roundup_power2_divisions", |key, val_s| {
        let val = stoull(val_s).ok_or_else(|| conf_error(format!("Error, expecting digit string in roundup_power2_divisions, got '{val_s}'")))?;
        if !(val == 0 || val.is_power_of_two()) {
            return Err(conf_error(format!("For roundups, the divisions has to be power of 2 or 0 to disable roundup, got {val}")));
        }
        if key == ">" {
            for slot in table.iter_mut().skip(last_index + tail_from) {
                *slot = val;
            }
        } else {
            let mb = stoull(key).ok_or_else(|| conf_error(format!("Error, expecting digit string as roundup_power2_divisions key, got '{key}'")))?;
            if !mb.is_power_of_two() {
                return Err(conf_error(format!("For roundups, the intervals have to be power of 2, got {mb}")));
            }
            let idx = (mb.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                for slot in table.iter_mut().take(idx) {
                    *slot = val;
                }
                first = false;
            }
            table[idx] = val;
            last_index = idx;
        }
        Ok(())
    })
}

/// Walks a `[KEY:VALUE,...]` list whose '[' is at `open`, as PyTorch's list parsers do: the
/// token between a key and its value and the one after a value (unless it is the ']') are
/// skipped whatever they are, and a ',' right before the ']' is allowed. Returns the index of the ']'.
fn walk_pairs(t: &Tokens, open: usize, what: &str, mut each: impl FnMut(&str, &str) -> Result<(), InputError>) -> Result<usize, InputError> {
    let unterminated = || conf_error(format!("Error parsing {what}: expected KEY:VALUE pairs and ']' before the end of the config"));
    let mut i = open;
    loop {
        i += 1;
        let key = match t.get(i) {
            None => return Err(unterminated()),
            Some("]") => return Ok(i),
            Some(key) => key,
        };
        i += 2;
        each(key, t.get(i).ok_or_else(unterminated)?)?;
        match t.get(i + 1) {
            None => return Err(unterminated()),
            Some("]") => {}
            Some(_) => i += 1,
        }
    }
}

/// The address space each expandable segment reserves (`expandable_segments_reserve`, torch
/// 2.15): by default 9/8 of the device's memory; a fraction of it (`0.5`), or GiB (`4G`). What
/// torch 2.15 does with each, found with the oracle (the reservations' addresses show their
/// sizes): a value it cannot read (`1GB`, `512M`, `True`), zero or less, or over the default is
/// the default, without a word; the bytes are rounded up to whole pages of the segment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpandableReserve {
    Default,
    Fraction(f64),
    Bytes(u64),
}

impl ExpandableReserve {
    fn parse(value: &str) -> Self {
        let number = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0);
        match value.strip_suffix('G') {
            Some(gib) => number(gib).map_or(Self::Default, |g| Self::Bytes((g * GIB as f64) as u64)),
            None => number(value).map_or(Self::Default, Self::Fraction),
        }
    }

    /// The bytes an expandable segment of a `total`-byte device reserves, before rounding to pages.
    pub fn bytes(self, total: u64) -> u64 {
        let default = total + total / 8;
        let asked = match self {
            Self::Default => default,
            Self::Fraction(f) => (f * total as f64) as u64,
            Self::Bytes(b) => b,
        };
        if asked == 0 || asked > default {
            default
        } else {
            asked
        }
    }
}

/// `expandable_segments_reserve_by_class:[CLASS:RESERVE,...]`, walked as
/// parseExpandableSegmentsReserveByClass does (a reserve it cannot read is only warned about
/// there). Returns the index of the closing ']'.
fn skip_reserve_classes(t: &Tokens, key_at: usize) -> Result<usize, InputError> {
    let i = key_at + 2;
    if t.value(key_at, i)? != "[" {
        return Err(conf_error(format!("expandable_segments_reserve_by_class expects a list [CLASS:RESERVE,...], got '{}'", t.0[i])));
    }
    // A reserve PyTorch cannot read is only warned about there.
    walk_pairs(t, i, "expandable_segments_reserve_by_class", |_, _| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_reserve_reads_a_fraction_or_gib_and_defaults_the_rest() {
        let total = 8 * GIB;
        let bytes = |v: &str| ExpandableReserve::parse(v).bytes(total);
        assert_eq!(bytes("0.5"), 4 * GIB);
        assert_eq!(bytes("1G"), GIB);
        assert_eq!(bytes("0.5G"), GIB / 2);
        for default in ["0", "-1", "1GB", "512M", "True", "1.2", "20G"] {
            assert_eq!(bytes(default), 9 * GIB, "{default}");
        }
    }

    #[test]
    fn parses_the_documented_example() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:512,roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.8,expandable_segments:True",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 512 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.8);
        assert!(c.expandable_segments);
        // 256 → index 8 (and below), 512 → 9, '>' → 10..15.
        assert_eq!(&c.roundup_power2_divisions[..8], &[1; 8]);
        assert_eq!(c.roundup_power2_divisions[8], 1);
        assert_eq!(c.roundup_power2_divisions[9], 2);
        assert_eq!(&c.roundup_power2_divisions[10..], &[4; 6]);
    }

    #[test]
    fn gaps_between_keys_stay_zero() {
        // The upstream unit test: divisions(1024 MiB) = 0 for this list.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]").unwrap();
        assert_eq!(c.roundup_power2_divisions[10], 0);
        assert_eq!(c.roundup_power2_divisions[7], 8);
        assert_eq!(c.roundup_power2_divisions[0], 8);
        assert_eq!(c.roundup_power2_divisions[11], 8);
        assert_eq!(c.roundup_power2_divisions[12], 2);
        let lone = AllocatorConfig::parse("roundup_power2_divisions:[>:2]").unwrap();
        assert_eq!(lone.roundup_power2_divisions[0], 0);
        assert_eq!(&lone.roundup_power2_divisions[1..], &[2; 15]);
    }

    #[test]
    fn roundup_lists_follow_parse_round_up_power2_divisions() {
        // c10/core/AllocatorConfig.cpp, parseRoundUpPower2Divisions: `first_value` clears only
        // in the explicit-key branch, so 256 still fills buckets 0..8 after the '>'.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[>:2,256:4]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..9], &[4; 9]);
        assert_eq!(&c.roundup_power2_divisions[9..], &[2; 7]);
        // parseArgs resets the table once per parse, not per key: the second list writes over
        // the first (bucket 10 keeps the first list's 8; 64 fills 0..6 then sets 6).
        let c = AllocatorConfig::parse("roundup_power2_divisions:[1024:8],roundup_power2_divisions:[64:2]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..7], &[2; 7]);
        assert_eq!(&c.roundup_power2_divisions[7..10], &[8; 3]);
        assert_eq!(c.roundup_power2_divisions[10], 8);
        assert_eq!(&c.roundup_power2_divisions[11..], &[0; 5]);
        // The loop `while (tokenizer[++i] != "]")` accepts an empty list and sets nothing.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[]").unwrap();
        assert_eq!(c.roundup_power2_divisions, [0; ROUNDUP_INTERVALS]);
        let c = AllocatorConfig::parse("roundup_power2_divisions:4,roundup_power2_divisions:[]").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
    }

    #[test]
    fn max_split_size_is_checked_against_large_segment_size() {
        // parseMaxSplitSize / parseMaxNonSplitRoundingSize (c10/core/AllocatorConfig.cpp): the
        // minimum is large_segment_size_ / kMB, and parseArgs reads large_segment_size_mb first
        // (upstream's AllocatorConfig_test expects max_split_size_mb below it to throw).
        for s in ["large_segment_size_mb:64,max_split_size_mb:32", "max_split_size_mb:32,large_segment_size_mb:64"] {
            let e = AllocatorConfig::parse(s).unwrap_err().to_string();
            assert!(e.contains("max_split_size_mb too small, must be >= 64"), "{s}: {e}");
        }
        let e = AllocatorConfig::parse("max_non_split_rounding_mb:40,large_segment_size_mb:64").unwrap_err().to_string();
        assert!(e.contains("max_non_split_rounding_mb too small, must be >= 64"), "{e}");
        let c = AllocatorConfig::parse("max_split_size_mb:64,large_segment_size_mb:64").unwrap();
        assert_eq!(c.max_split_size, 64 * MIB);
        // A large segment size below 20 MiB lowers the minimum too.
        assert_eq!(AllocatorConfig::parse("large_segment_size_mb:12,max_split_size_mb:12").unwrap().max_split_size, 12 * MIB);
        assert!(AllocatorConfig::parse("large_segment_size_mb:10").is_err());
    }

    #[test]
    fn max_non_split_rounding_defaults_to_large_segment_size() {
        // AcceleratorAllocatorConfig's constructor and parseArgs (c10/core/AllocatorConfig.cpp):
        // max_non_split_rounding_size_ = large_segment_size_ unless max_non_split_rounding_mb is set.
        assert_eq!(AllocatorConfig::default().max_non_split_rounding_size, 20 * MIB);
        assert_eq!(AllocatorConfig::parse("large_segment_size_mb:64").unwrap().max_non_split_rounding_size, 64 * MIB);
        let c = AllocatorConfig::parse("large_segment_size_mb:64,max_non_split_rounding_mb:128").unwrap();
        assert_eq!(c.max_non_split_rounding_size, 128 * MIB);
    }

    #[test]
    fn bad_strings_name_the_key() {
        for (s, want) in [
            ("max_split_size_mb:10", "max_split_size_mb too small"),
            ("foo:1", "Unrecognized key 'foo'"),
            ("garbage_collection_threshold:1.5", "garbage_collect_threshold is invalid"),
            ("expandable_segments:maybe", "True/False argument for expandable_segments"),
            ("expandable_segments:true", "True/False argument for expandable_segments"),
            ("roundup_power2_divisions:3", "power of 2"),
            ("roundup_power2_divisions:[100:2]", "intervals have to be power of 2"),
            ("max_split_size_mb", "expected :"),
            ("max_split_size_mb:", "expecting max_split_size_mb value"),
            ("per_process_memory_fraction:2", "per_process_memory_fraction is invalid"),
        ] {
            let e = AllocatorConfig::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    /// DeviceCachingAllocator::setMemoryFraction (c10/cuda/CUDACachingAllocator.cpp) sets
    /// allowed_memory_maximum only for a fraction < 1.0, and malloc runs the GC only when it has a
    /// value: a fraction of exactly 1.0 leaves the GC off.
    #[test]
    fn gc_needs_a_fraction() {
        assert!(!AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap().gc_enabled());
        assert!(AllocatorConfig::parse("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9").unwrap().gc_enabled());
        assert!(!AllocatorConfig::parse("garbage_collection_threshold:0.6,per_process_memory_fraction:1.0").unwrap().gc_enabled());
    }

    #[test]
    fn conflicts_are_flagged_once_each() {
        let flagged = |c: &str| AllocatorConfig::parse(c).unwrap().conflicts();
        assert!(flagged("").is_empty());
        assert!(flagged("expandable_segments:True,garbage_collection_threshold:0.6").len() == 1, "GC without a fraction is the one flagged");
        assert!(flagged("max_split_size_mb:64,max_non_split_rounding_mb:64,garbage_collection_threshold:0.8,per_process_memory_fraction:0.9").is_empty());
        let both = flagged("max_split_size_mb:64,expandable_segments:True");
        assert!(both.len() == 1 && both[0].contains("#193400"), "{both:?}");
        assert!(flagged("garbage_collection_threshold:0.6")[0].contains("per_process_memory_fraction"));
        assert!(flagged("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9,expandable_segments:True")[0].contains("frees nothing"));
        assert!(flagged("max_non_split_rounding_mb:64")[0].contains("ignores it"));
        // large_segment_size_mb moves the default of max_non_split_rounding_mb with it: no flag.
        assert!(flagged("large_segment_size_mb:64").is_empty());
    }

    #[test]
    fn pytorch_cuda_alloc_conf_wins_whole_over_pytorch_alloc_conf() {
        assert_eq!(AllocatorConfig::from_vars(None, None).unwrap(), AllocatorConfig::default());
        let only_generic = AllocatorConfig::from_vars(None, Some("max_split_size_mb:32")).unwrap();
        assert_eq!(only_generic.max_split_size, 32 * MIB);
        // Both set (measured on torch 2.15's libc10): nothing of PYTORCH_ALLOC_CONF is read, not
        // even a device-generic key the CUDA variable leaves out.
        let both = AllocatorConfig::from_vars(Some("max_split_size_mb:64"), Some("expandable_segments:True,max_split_size_mb:32")).unwrap();
        assert_eq!((both.max_split_size, both.expandable_segments), (64 * MIB, false));
        assert_eq!(both.source, "max_split_size_mb:64");
        // Set but empty: the defaults (also measured), and a broken PYTORCH_ALLOC_CONF is never parsed.
        assert_eq!(AllocatorConfig::from_vars(Some(""), Some("max_split_size_mb:1")).unwrap(), AllocatorConfig::default());
        // An error names the variable it is in.
        let err = AllocatorConfig::from_vars(None, Some("max_split_size_mb:1")).unwrap_err();
        assert!(err.to_string().contains("PYTORCH_ALLOC_CONF"), "{err}");
    }

    /// Values and refusals checked against torch 2.15's own parser (libc10's
    /// AcceleratorAllocatorConfig + CUDAAllocatorConfig, driven through setAllocatorSettings).
    #[test]
    fn accepts_and_refuses_what_torch_2_15_does() {
        let ok = |s: &str| AllocatorConfig::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        // Token positions, not separators, matter (checkToken's result is never checked).
        assert_eq!(ok("max_split_size_mb,64").max_split_size, 64 * MIB);
        let c = ok("expandable_segments:True:max_split_size_mb:64");
        assert!(c.expandable_segments && c.max_split_size == 64 * MIB);
        assert_eq!(ok("large_segment_size_mb,64").large_segment_size, 64 * MIB);
        // std::stoull / std::stod read a prefix; a negative size wraps, then is capped.
        assert_eq!(ok("max_split_size_mb:512MB").max_split_size, 512 * MIB);
        assert_eq!(ok("max_split_size_mb:64.5").max_split_size, 64 * MIB);
        assert_eq!(ok("max_split_size_mb:-1").max_split_size, (u64::MAX / MIB) * MIB);
        assert_eq!(ok("max_split_size_mb:-18446744073709551596").max_split_size, 20 * MIB);
        assert_eq!(ok("garbage_collection_threshold:0.5abc").garbage_collection_threshold, 0.5);
        assert_eq!(ok("garbage_collection_threshold:0x0.8p0").garbage_collection_threshold, 0.5);
        assert_eq!(ok("garbage_collection_threshold:5e-1").garbage_collection_threshold, 0.5);
        assert_eq!(ok("garbage_collection_threshold:0.5e+").garbage_collection_threshold, 0.5);
        assert_eq!(ok("per_process_memory_fraction:0x1p-1").per_process_memory_fraction, 0.5);
        assert_eq!(ok("roundup_power2_divisions:4abc").roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
        assert_eq!(ok("roundup_power2_divisions:1.5").roundup_power2_divisions, [1; ROUNDUP_INTERVALS]);
        // A ',' before a list's ']' is allowed; what follows a list's ']' is a separator.
        let c = ok("roundup_power2_divisions:[256:4,]");
        assert_eq!(&c.roundup_power2_divisions[..10], &[4, 4, 4, 4, 4, 4, 4, 4, 4, 0]);
        assert_eq!(ok("roundup_power2_divisions:[256:4]:max_split_size_mb:64").max_split_size, 64 * MIB);
        let c = ok("roundup_power2_divisions:[>:2,>:4]");
        assert_eq!(c.roundup_power2_divisions[0], 0);
        assert_eq!(&c.roundup_power2_divisions[1..], &[4; 15]);
        let c = ok("roundup_power2_divisions:[512:2,256:4]");
        assert_eq!(&c.roundup_power2_divisions[..11], &[2, 2, 2, 2, 2, 2, 2, 2, 4, 2, 0]);
        // CUDA builds accept ROCm's spellings and torch 2.15's host-only knobs.
        for s in [
            "release_lock_on_hipmalloc:True",
            "pinned_use_hip_host_register:True",
            "pinned_free_catch_all:False",
            "throw_on_cudamalloc_oom:False",
            "pinned_num_register_threads:128",
            "pinned_max_round_threshold_mb:0",
            "pinned_max_cached_size_mb:-1,pinned_max_round_threshold_mb:1.5",
            "expandable_segments_reserve_by_class:[capture:0.25,workspace:40G]",
            "expandable_segments_reserve_by_class:[]",
            " expandable_segments :\tTrue ",
            "",
        ] {
            ok(s);
        }
        for (s, want) in [
            (",expandable_segments:True", "a stray ','"),
            ("expandable_segments:True,,max_split_size_mb:64", "a stray ','"),
            ("expandable_segments:True,:", "a stray ':'"),
            ("roundup_power2_divisions:0", "divisions has to be power of 2"),
            ("pinned_num_register_threads:3", "has to be power of 2"),
            ("pinned_num_register_threads:256", "less than or equal to 128"),
            ("pinned_reserve_segment_size_mb:0", "greater than 0"),
            ("pinned_max_cached_size_mb:x", "expecting digit string"),
            ("pinned_max_round_threshold_mb:99999999999999999999", "expecting digit string"),
            ("max_split_size_mb:1e3", "too small, must be >= 20"),
            ("max_split_size_mb:-18446744073709551615", "too small"),
            ("max_split_size_mb:18446744073709551616", "expecting digit string"),
            ("max_split_size_mb:--5", "expecting digit string"),
            ("garbage_collection_threshold:1e-310", "expecting a number"),
            ("garbage_collection_threshold:.", "expecting a number"),
            ("per_process_memory_fraction:1e400", "expecting a number"),
            ("garbage_collection_threshold:infinity", "garbage_collect_threshold is invalid"),
            ("roundup_power2_divisions:[256:1,,512:2]", "expecting digit string"),
            ("roundup_power2_divisions:[256:4", "expected KEY:VALUE pairs and ']'"),
            ("roundup_power2_divisions:[,]", "expected KEY:VALUE pairs and ']'"),
            ("expandable_segments_reserve_by_class:[a:0.5,b]", "expected KEY:VALUE pairs"),
            ("expandable_segments:True,expandable_segments", "expected : after 'expandable_segments'"),
            ("large_segment_size_mb:", "expecting large_segment_size_mb value"),
        ] {
            let e = AllocatorConfig::parse(s).expect_err(s).to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
