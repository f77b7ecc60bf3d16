//! Which PyTorch release's caching allocator the simulator follows (`--torch-version`).
//!
//! Each rule that differs between the verified releases is a method here, named for what it
//! changes and citing the release that changed it; the oracle (`allocbench oracle
//! --torch-version V`, PyTorch's own `libc10_cuda.so` of that release) is what each was found
//! and is checked against (`tests/oracle.rs`).

use std::fmt;
use std::sync::OnceLock;

use crate::error::InputError;

/// A PyTorch release, by its minor version (every verified release is 2.x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion {
    pub minor: u32,
}

/// The releases whose allocators were run through the oracle, oldest first, with the patch
/// release fetched for each (`fetch_torch.py`). The last is the default.
pub const VERIFIED: &[(TorchVersion, &str)] = &[
    (TorchVersion { minor: 9 }, "2.9.0"),
    (TorchVersion { minor: 10 }, "2.10.0"),
    (TorchVersion { minor: 11 }, "2.11.0"),
    (TorchVersion { minor: 12 }, "2.12.0"),
    (TorchVersion { minor: 13 }, "2.13.0"),
    (TorchVersion { minor: 14 }, "2.14.0"),
    (TorchVersion { minor: 15 }, "2.15.0"),
];

const fn v(minor: u32) -> TorchVersion {
    TorchVersion { minor }
}

impl TorchVersion {
    /// The newest verified release: what the simulator follows unless told otherwise.
    pub const NEWEST: TorchVersion = VERIFIED[VERIFIED.len() - 1].0;
    pub const OLDEST: TorchVersion = VERIFIED[0].0;

    /// `2.12`, `2.12.1`, `2.12.0+cu130`: the minor version, which must be a verified one.
    pub fn parse(text: &str) -> Result<Self, InputError> {
        let err = |why: String| InputError::new("--torch-version", why);
        let base = text.trim().split(['+', '-']).next().unwrap_or("");
        let mut parts = base.split('.');
        let (major, minor) = (parts.next(), parts.next());
        let minor: u32 = match (major, minor) {
            (Some("2"), Some(m)) => m.parse().map_err(|_| err(format!("'{text}' is not a torch version (say e.g. 2.12)")))?,
            _ => return Err(err(format!("'{text}' is not a torch 2.x version (say e.g. 2.12)"))),
        };
        let version = TorchVersion { minor };
        if !(Self::OLDEST..=Self::NEWEST).contains(&version) {
            return Err(err(format!("torch {text}'s allocator is not verified: the simulator follows {} to {}", Self::OLDEST, Self::NEWEST)));
        }
        Ok(version)
    }

    /// The release the oracle fetches for this version (its `.0`).
    pub fn release(self) -> &'static str {
        VERIFIED.iter().find(|(v, _)| *v == self).map_or("2.15.0", |(_, r)| r)
    }

    /// How a pool's free set orders blocks of equal size (`BlockComparatorSize` compares stream
    /// and size first). Found by the oracle, release by release: 2.11 splits the lower of two
    /// equal cached segments, 2.12 and later the older one; 2.12 alone numbers every new block.
    pub fn free_block_order(self) -> FreeBlockOrder {
        match self.minor {
            ..=11 => FreeBlockOrder::Address,
            12 => FreeBlockOrder::BlockAge,
            _ => FreeBlockOrder::SegmentAge,
        }
    }

    /// torch 2.13 (markCaptureBegin/End, is_capture_context): whether a graph capture is
    /// underway is a counter of captures, and whether a stream captures is asked of the stream,
    /// so a MemPool being allocated to no longer stops `empty_cache` and the OOM path from
    /// freeing the default pools' cached segments. Before 2.13 any pool being allocated to did
    /// (`captures_underway.empty()`). Found by the oracle: 2.12 OOMs where 2.13 frees the cache.
    pub fn captures_are_counted(self) -> bool {
        self >= v(13)
    }

    /// torch 2.10: `max_split_size_mb` and `max_non_split_rounding_mb` may equal their minimum
    /// (20); torch 2.9 refused it ("too small, must be > 20"). Found by the oracle.
    pub fn mb_minimum_is_allowed(self) -> bool {
        self >= v(10)
    }

    /// torch 2.10: in a `roundup_power2_divisions` list, `>:N` fills the buckets after the last
    /// explicit one; in 2.9 it filled that bucket too, overwriting its value (`[64:4,>:1]` does
    /// not round 64-128 MiB requests in 2.9). Found by the oracle.
    pub fn roundup_tail_skips_last_key(self) -> bool {
        self >= v(10)
    }

    /// torch 2.11: an allocation that finds no cached block and no device memory tries the
    /// MemPools marked use_on_oom before freeing oversize blocks and flushing the cache; before
    /// 2.11 only after the flush's retry failed (a retry and a device-wide sync counted first).
    /// Found by the oracle.
    pub fn use_on_oom_before_flush(self) -> bool {
        self >= v(11)
    }

    /// torch 2.10: setUseOnOOM takes whether (2.9: it only sets), so a MemPool's destructor stops
    /// the pool's use on OOM before releasing it.
    pub fn use_on_oom_can_be_unset(self) -> bool {
        self >= v(10)
    }

    /// The release a `PYTORCH_CUDA_ALLOC_CONF` key first appeared in, for the keys that did not
    /// always exist (`None`: in every verified release). Read off each release's own parser:
    /// an older one refuses the key (`Unrecognized CachingAllocator option: KEY`).
    pub fn conf_key_since(key: &str) -> Option<TorchVersion> {
        Some(match key {
            "per_process_memory_fraction" | "pinned_reserve_segment_size_mb" => v(10),
            "large_segment_size_mb" => v(11),
            "throw_on_cudamalloc_oom" | "pinned_free_catch_all" => v(12),
            "pinned_max_cached_size_mb" | "pinned_max_round_threshold_mb" => v(13),
            "expandable_segments_reserve" | "expandable_segments_reserve_by_class" => v(15),
            _ => return None,
        })
    }

    /// The release selected for this process (`--torch-version`), else [`Self::NEWEST`].
    pub fn selected() -> TorchVersion {
        Self::chosen().unwrap_or(Self::NEWEST)
    }

    /// The release `--torch-version` selected, if it was given.
    pub fn chosen() -> Option<TorchVersion> {
        SELECTED.get().copied()
    }

    /// Selects the release every allocator config of this process follows (once, at start).
    pub fn select(self) {
        let _ = SELECTED.set(self);
    }
}

static SELECTED: OnceLock<TorchVersion> = OnceLock::new();

/// The order of equal-size free blocks in a pool ([`TorchVersion::free_block_order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeBlockOrder {
    /// By address (torch 2.11 and before).
    Address,
    /// By the block's creation number (`Block::registration_counter`, torch 2.12): a block split
    /// off gets the next number, the remainder and a merge's survivor keep theirs.
    BlockAge,
    /// By the segment's creation number, then address (torch 2.13 on): split blocks keep their
    /// segment's number.
    SegmentAge,
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format!("2.{}", self.minor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_by_their_minor_and_unverified_ones_are_refused() {
        assert_eq!(TorchVersion::parse("2.12.0+cu130").unwrap(), v(12));
        assert_eq!(TorchVersion::parse("2.9").unwrap(), v(9));
        assert_eq!(TorchVersion::parse("2.15.1").unwrap().release(), "2.15.0");
        for bad in ["2.8.0", "2.16", "3.0", "two", ""] {
            assert!(TorchVersion::parse(bad).is_err(), "{bad}");
        }
        assert!(TorchVersion::parse("2.8.0").unwrap_err().to_string().contains("2.9 to 2.15"));
    }

    #[test]
    fn roundup_tail_skips_the_last_key_from_2_10() {
        use crate::gpu::config::AllocatorConfig;
        let table = |torch| AllocatorConfig::parse_for("roundup_power2_divisions:[8:1,64:4,>:1]", torch).unwrap().roundup_power2_divisions;
        assert_eq!(table(v(9))[6], 1);
        assert_eq!(table(v(10))[6], 4);
        assert_eq!(table(v(10))[7], 1);
        assert!(!v(9).roundup_tail_skips_last_key());
    }

    #[test]
    fn the_mb_knobs_take_their_minimum_from_2_10() {
        use crate::gpu::config::AllocatorConfig;
        let e = AllocatorConfig::parse_for("max_non_split_rounding_mb:20", v(9)).unwrap_err().to_string();
        assert!(e.contains("too small, must be > 20"), "{e}");
        assert!(AllocatorConfig::parse_for("max_split_size_mb:20", v(10)).is_ok());
    }

    #[test]
    fn use_on_oom_pools_come_before_the_flush_from_2_11() {
        assert!(!v(10).use_on_oom_before_flush());
        assert!(v(11).use_on_oom_before_flush());
    }

    #[test]
    fn captures_are_counted_from_2_13() {
        assert!(!v(12).captures_are_counted());
        assert!(v(13).captures_are_counted());
    }

    #[test]
    fn free_block_order_changed_in_2_12_and_2_13() {
        assert_eq!(v(11).free_block_order(), FreeBlockOrder::Address);
        assert_eq!(v(12).free_block_order(), FreeBlockOrder::BlockAge);
        assert_eq!(v(13).free_block_order(), FreeBlockOrder::SegmentAge);
        assert_eq!(TorchVersion::NEWEST.free_block_order(), FreeBlockOrder::SegmentAge);
    }
}
