//! `PYTORCH_CUDA_ALLOC_CONF` parsing, with PyTorch's syntax, checks and error wording
//! (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp; torch ≈ 2.10–2.12).

use std::fmt;

use crate::error::InputError;
use crate::units::MIB;

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
    /// The string this was parsed from, for results.
    pub source: String,
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
            source: String::new(),
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

/// The environment variables PyTorch reads, in priority order (NEW: PYTORCH_ALLOC_CONF first).
pub const ENV_VARS: [&str; 2] = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"];

impl AllocatorConfig {
    /// Reads the config from the environment, as PyTorch does at first use.
    pub fn from_env() -> Result<Self, InputError> {
        for var in ENV_VARS {
            if let Ok(v) = std::env::var(var) {
                return Self::parse(&v).map_err(|e| InputError::new(var, e.message));
            }
        }
        Ok(Self::default())
    }

    /// Parses `key:value,key:value` with `[a:b,c:d]` lists; whitespace is ignored.
    pub fn parse(text: &str) -> Result<Self, InputError> {
        let mut cfg = AllocatorConfig { source: text.trim().to_string(), ..Default::default() };
        let tokens = tokenize(text);
        let err = |m: String| InputError::new("--conf", m);
        // AcceleratorAllocatorConfig::parseArgs (c10/core/AllocatorConfig.cpp) reads
        // large_segment_size_mb first, wherever it stands, because the two `_mb` limits below
        // are checked against it; then max_non_split_rounding_size defaults to it.
        for (j, t) in tokens.iter().enumerate() {
            if t == "large_segment_size_mb" {
                cfg.large_segment_size = parse_large_segment_size(&tokens, j)?;
            }
        }
        cfg.max_non_split_rounding_size = cfg.large_segment_size;
        let mut i = 0;
        while i < tokens.len() {
            let key = tokens[i].as_str();
            let expect = |i: usize, tok: &str| -> Result<(), InputError> {
                if tokens.get(i).map(String::as_str) != Some(tok) {
                    return Err(err(format!("Error parsing CachingAllocator settings, expected {tok} after '{key}'")));
                }
                Ok(())
            };
            let value = |i: usize| -> Result<&str, InputError> {
                tokens.get(i).map(String::as_str).filter(|t| !matches!(*t, "," | ":" | "[" | "]")).ok_or_else(|| err(format!("Error, expecting {key} value")))
            };
            let size_mb = |v: &str| -> Result<u64, InputError> {
                v.parse::<u64>().map_err(|_| err(format!("Error, expecting digit string in config for {key}, got '{v}'")))
            };
            match key {
                // Read (and checked) before this loop.
                "large_segment_size_mb" => i += 3,
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    expect(i + 1, ":")?;
                    let mb = size_mb(value(i + 2)?)?;
                    // parseMaxSplitSize / parseMaxNonSplitRoundingSize
                    // (c10/core/AllocatorConfig.cpp): the minimum is large_segment_size_ / kMB,
                    // so a value below large_segment_size_mb is rejected.
                    let min_mb = cfg.large_segment_size / MIB;
                    if mb < min_mb {
                        return Err(err(format!("CachingAllocator option {key} too small, must be >= {min_mb}")));
                    }
                    let bytes = mb.min(u64::MAX / MIB) * MIB;
                    if key == "max_split_size_mb" {
                        cfg.max_split_size = bytes;
                    } else {
                        cfg.max_non_split_rounding_size = bytes;
                    }
                    i += 3;
                }
                "garbage_collection_threshold" => {
                    expect(i + 1, ":")?;
                    let v = value(i + 2)?;
                    let t: f64 = v.parse().map_err(|_| err(format!("Error, expecting a number for garbage_collection_threshold, got '{v}'")))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(err("garbage_collect_threshold is invalid, set it in (0.0, 1.0)".into()));
                    }
                    cfg.garbage_collection_threshold = t;
                    i += 3;
                }
                "per_process_memory_fraction" => {
                    expect(i + 1, ":")?;
                    let v = value(i + 2)?;
                    let f: f64 = v.parse().map_err(|_| err(format!("Error, expecting a number for per_process_memory_fraction, got '{v}'")))?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(err("per_process_memory_fraction is invalid, set it in [0.0, 1.0]".into()));
                    }
                    cfg.per_process_memory_fraction = f;
                    i += 3;
                }
                "expandable_segments" => {
                    expect(i + 1, ":")?;
                    cfg.expandable_segments = parse_bool(key, value(i + 2)?)?;
                    i += 3;
                }
                "roundup_power2_divisions" => {
                    expect(i + 1, ":")?;
                    i = parse_roundup(&tokens, i + 2, &mut cfg.roundup_power2_divisions)?;
                }
                "backend" => {
                    expect(i + 1, ":")?;
                    match value(i + 2)? {
                        "native" => {}
                        "cudaMallocAsync" => {
                            return Err(err("backend:cudaMallocAsync is the driver's pool, not this policy: use --allocator async (real GPU) instead".into()))
                        }
                        other => return Err(err(format!("Unknown allocator backend, options should be native or cudaMallocAsync, got '{other}'"))),
                    }
                    i += 3;
                }
                // Knobs that exist in PyTorch but do not change placement: accepted, ignored.
                "release_lock_on_cudamalloc" | "pinned_use_cuda_host_register" | "pinned_use_background_threads" | "graph_capture_record_stream_reuse" => {
                    expect(i + 1, ":")?;
                    parse_bool(key, value(i + 2)?)?;
                    i += 3;
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    expect(i + 1, ":")?;
                    size_mb(value(i + 2)?)?;
                    i += 3;
                }
                "," => i += 1,
                other => return Err(err(format!("Unrecognized key '{other}' in CachingAllocator config"))),
            }
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

/// parseLargeSegmentSize (c10/core/AllocatorConfig.cpp): `large_segment_size_mb` must be
/// > kMinLargeAlloc (10 MiB). `at` is the key's index.
fn parse_large_segment_size(tokens: &[String], at: usize) -> Result<u64, InputError> {
    let key = "large_segment_size_mb";
    let err = |m: String| InputError::new("--conf", m);
    if tokens.get(at + 1).map(String::as_str) != Some(":") {
        return Err(err(format!("Error parsing CachingAllocator settings, expected : after '{key}'")));
    }
    let v =
        tokens.get(at + 2).map(String::as_str).filter(|t| !matches!(*t, "," | ":" | "[" | "]")).ok_or_else(|| err(format!("Error, expecting {key} value")))?;
    let mb: u64 = v.parse().map_err(|_| err(format!("Error, expecting digit string in config for {key}, got '{v}'")))?;
    if mb <= 10 {
        return Err(err(format!("CachingAllocator option {key} too small, must be > 10")));
    }
    Ok(mb.min(u64::MAX / MIB) * MIB)
}

fn parse_bool(key: &str, v: &str) -> Result<bool, InputError> {
    match v {
        // PyTorch accepts exactly these spellings.
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(InputError::new("--conf", format!("Expected a single True/False argument for {key}, got '{v}'"))),
    }
}

fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_whitespace() {
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
/// came yet) to the end; `[]` sets nothing. The table is not reset here: parseArgs resets it once
/// per parse, so a repeated key writes over the first one's table. Returns the index after the value.
fn parse_roundup(tokens: &[String], mut i: usize, table: &mut [u64; ROUNDUP_INTERVALS]) -> Result<usize, InputError> {
    let err = |m: String| InputError::new("--conf", m);
    let pow2 = |v: u64| v == 0 || v.is_power_of_two();
    match tokens.get(i).map(String::as_str) {
        Some("[") => {
            i += 1;
            let mut first = true;
            let mut last_index: Option<usize> = None;
            if tokens.get(i).map(String::as_str) == Some("]") {
                return Ok(i + 1);
            }
            loop {
                let key = tokens.get(i).ok_or_else(|| err("Error parsing roundup_power2_divisions: unterminated list".into()))?;
                if tokens.get(i + 1).map(String::as_str) != Some(":") {
                    return Err(err("Error parsing CachingAllocator settings, expected : in roundup_power2_divisions list".into()));
                }
                let val_s = tokens.get(i + 2).ok_or_else(|| err("Error, expecting roundup_power2_divisions value".into()))?;
                let val: u64 = val_s.parse().map_err(|_| err(format!("Error, expecting digit string in roundup_power2_divisions, got '{val_s}'")))?;
                if !pow2(val) {
                    return Err(err(format!("For roundups, the divisions has to be power of 2 or 0 to disable roundup, got {val}")));
                }
                if key == ">" {
                    // NEW starts from last + 1 with last = 0 when no key came first, so bucket 0 stays 0.
                    let start = last_index.map(|l| l + 1).unwrap_or(1);
                    for slot in table.iter_mut().skip(start) {
                        *slot = val;
                    }
                } else {
                    let mb: u64 = key.parse().map_err(|_| err(format!("Error, expecting digit string as roundup_power2_divisions key, got '{key}'")))?;
                    if !(mb > 0 && mb.is_power_of_two()) {
                        return Err(err(format!("For roundups, the intervals have to be power of 2, got {mb}")));
                    }
                    let idx = (mb.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
                    if first {
                        for slot in table.iter_mut().take(idx) {
                            *slot = val;
                        }
                    }
                    table[idx] = val;
                    last_index = Some(idx);
                    first = false;
                }
                i += 3;
                match tokens.get(i).map(String::as_str) {
                    Some(",") => i += 1,
                    Some("]") => return Ok(i + 1),
                    _ => return Err(err("Error parsing roundup_power2_divisions: expected , or ]".into())),
                }
            }
        }
        Some(v) => {
            let val: u64 = v.parse().map_err(|_| err(format!("Error, expecting digit string for roundup_power2_divisions, got '{v}'")))?;
            if !pow2(val) {
                return Err(err(format!("For roundups, the divisions has to be power of 2, got {val}")));
            }
            *table = [val; ROUNDUP_INTERVALS];
            Ok(i + 1)
        }
        None => Err(err("Error, expecting roundup_power2_divisions value".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
