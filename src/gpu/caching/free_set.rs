//! The free-block set of a pool, ordered by (stream, size, address) exactly as PyTorch's
//! `std::set<Block*, BlockComparatorSize>`, but built for speed: per stream, blocks sit in
//! size-class bins (four classes per power of two; class order follows size order) kept sorted,
//! with a bitmap of non-empty bins. Best fit is a search in one small bin, else the first entry
//! of the next non-empty bin: the same answer as a lower_bound on the ordered set.

/// The order (stream, size, address): the stream first, then size and address packed into one
/// u128 (size in the high 64 bits, address in the low 64), so neither the number of streams nor
/// a size is limited by the packing (BlockComparatorSize has no such limits either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FreeKey {
    stream: u32,
    size_ptr: u128,
}

impl FreeKey {
    #[inline]
    pub fn new(stream: u32, size: u64, ptr: u64) -> Self {
        FreeKey { stream, size_ptr: ((size as u128) << 64) | ptr as u128 }
    }
    #[inline]
    pub fn stream(self) -> u32 {
        self.stream
    }
    #[inline]
    pub fn size(self) -> u64 {
        (self.size_ptr >> 64) as u64
    }
    #[inline]
    pub fn ptr(self) -> u64 {
        self.size_ptr as u64
    }
}

const BINS: usize = 256;

/// Monotonic in size: a ≤ b implies class(a) ≤ class(b).
#[inline]
fn class_of(size: u64) -> usize {
    let l = size.max(1).ilog2() as usize;
    if l < 2 {
        l * 4
    } else {
        l * 4 + ((size >> (l - 2)) & 3) as usize
    }
}

/// A bin entry: the stream is the bin's, so an entry holds (size, address) and the block, 24
/// bytes compared as two words.
#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    ptr: u64,
    block: u32,
}

impl Entry {
    #[inline]
    fn below(&self, size: u64, ptr: u64) -> bool {
        self.size < size || (self.size == size && self.ptr < ptr)
    }
    #[inline]
    fn key(&self, stream: u32) -> FreeKey {
        FreeKey::new(stream, self.size, self.ptr)
    }
}

/// The first position in `bin` not below (size, ptr). Bins hold a handful of entries (about 5 on
/// the captured 1.3B trace), where a forward scan beats a binary search; long bins are searched.
#[inline]
fn position(bin: &[Entry], size: u64, ptr: u64) -> usize {
    if bin.len() <= 16 {
        bin.iter().position(|e| !e.below(size, ptr)).unwrap_or(bin.len())
    } else {
        bin.partition_point(|e| e.below(size, ptr))
    }
}

/// Free blocks of one pool: key → block index. The bins of stream `s` are
/// `bins[s * BINS..(s + 1) * BINS]`, one flat table (one load less per lookup than a table per
/// stream), with a bitmap of the non-empty ones per stream.
#[derive(Default)]
pub struct FreeSet {
    bins: Vec<Vec<Entry>>,
    nonempty: Vec<[u64; BINS / 64]>,
    len: usize,
}

impl FreeSet {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn streams(&self) -> usize {
        self.nonempty.len()
    }

    /// The first non-empty bin of `stream` at or after class `from`.
    #[inline]
    fn next_bin(&self, stream: usize, from: usize) -> Option<usize> {
        let words = &self.nonempty[stream];
        let mut word = from / 64;
        if word >= words.len() {
            return None;
        }
        let mut bits = words[word] & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word >= words.len() {
                return None;
            }
            bits = words[word];
        }
    }

    #[inline(always)]
    pub fn insert(&mut self, k: FreeKey, block: u32) {
        let s = k.stream() as usize;
        if self.streams() <= s {
            self.nonempty.resize(s + 1, [0; BINS / 64]);
            self.bins.resize_with((s + 1) * BINS, Vec::new);
        }
        let c = class_of(k.size());
        let bin = &mut self.bins[s * BINS + c];
        let pos = position(bin, k.size(), k.ptr());
        debug_assert!(bin.get(pos).is_none_or(|e| e.below(k.size(), k.ptr()) || e.key(k.stream()) != k), "duplicate free key");
        bin.insert(pos, Entry { size: k.size(), ptr: k.ptr(), block });
        self.nonempty[s][c / 64] |= 1 << (c % 64);
        self.len += 1;
    }

    /// Removes `k`; returns whether it was there.
    #[inline(always)]
    pub fn remove(&mut self, k: FreeKey) -> bool {
        let s = k.stream() as usize;
        if s >= self.streams() {
            return false;
        }
        let c = class_of(k.size());
        let bin = &mut self.bins[s * BINS + c];
        let pos = position(bin, k.size(), k.ptr());
        if bin.get(pos).is_none_or(|e| e.size != k.size() || e.ptr != k.ptr()) {
            return false;
        }
        bin.remove(pos);
        if bin.is_empty() {
            self.nonempty[s][c / 64] &= !(1 << (c % 64));
        }
        self.len -= 1;
        true
    }

    /// The first entry of `stream` not below (size, ptr), in set order.
    #[inline(always)]
    fn first_from(&self, stream: u32, size: u64, ptr: u64) -> Option<(FreeKey, u32)> {
        let s = stream as usize;
        if s >= self.streams() {
            return None;
        }
        let c = class_of(size);
        let bin = &self.bins[s * BINS + c];
        let pos = position(bin, size, ptr);
        let e = match bin.get(pos) {
            Some(e) => e,
            None => self.bins[s * BINS + self.next_bin(s, c + 1)?].first()?,
        };
        Some((e.key(stream), e.block))
    }

    /// lower_bound(stream, size, 0) restricted to `stream`: the smallest block ≥ size, lowest address first.
    #[inline]
    pub fn first_at_least(&self, stream: u32, size: u64) -> Option<(FreeKey, u32)> {
        self.first_from(stream, size, 0)
    }

    /// The entry after `k` in set order, on the same stream.
    pub fn next_after(&self, k: FreeKey) -> Option<(FreeKey, u32)> {
        match k.ptr().checked_add(1) {
            Some(ptr) => self.first_from(k.stream(), k.size(), ptr),
            None => self.first_from(k.stream(), k.size().checked_add(1)?, 0),
        }
    }

    /// The bins of `stream` in set order with the stream's id.
    fn stream_entries(&self, stream: usize) -> impl DoubleEndedIterator<Item = (FreeKey, u32)> + '_ {
        self.bins[stream * BINS..(stream + 1) * BINS].iter().flat_map(move |b| b.iter().map(move |e| (e.key(stream as u32), e.block)))
    }

    /// Entries of `stream` below (stream, size, 0), largest first.
    pub fn below_descending(&self, stream: u32, size: u64) -> Vec<(FreeKey, u32)> {
        if stream as usize >= self.streams() {
            return Vec::new();
        }
        self.stream_entries(stream as usize).rev().filter(|e| e.0.size() < size).collect()
    }

    /// All entries in set order (stream, size, address).
    pub fn iter(&self) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        (0..self.streams()).flat_map(|s| self.stream_entries(s))
    }

    /// The block indices in set order, collected (callers mutate the set while walking).
    pub fn blocks_in_order(&self) -> Vec<u32> {
        self.iter().map(|(_, i)| i).collect()
    }

    pub fn max_size(&self) -> u64 {
        (0..self.streams())
            .filter_map(|s| {
                let top = (0..BINS).rev().find(|&c| self.nonempty[s][c / 64] & (1 << (c % 64)) != 0)?;
                self.bins[s * BINS + top].last().map(|e| e.size)
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn keys_hold_any_stream_and_size() {
        // BlockComparatorSize (c10/cuda/CUDACachingAllocator.cpp) orders by (stream, size, ptr)
        // with no bound on either: stream ids past the old 13-bit field and sizes past 2^51 keep
        // their values and their order.
        for (s, size, ptr) in [(1u32 << 13, 1u64 << 60, 7u64), (u32::MAX - 1, u64::MAX, u64::MAX), (9000, 3 << 51, 0)] {
            let k = FreeKey::new(s, size, ptr);
            assert_eq!((k.stream(), k.size(), k.ptr()), (s, size, ptr));
        }
        assert!(FreeKey::new(8192, 512, 0) > FreeKey::new(8191, u64::MAX, u64::MAX));
        assert!(FreeKey::new(1, 1 << 52, 0) > FreeKey::new(1, 1 << 51, u64::MAX));
        let mut set = FreeSet::default();
        set.insert(FreeKey::new(10_000, 1 << 52, 4096), 3);
        assert_eq!(set.first_at_least(10_000, 1 << 51).map(|e| e.1), Some(3));
        assert_eq!(set.first_at_least(10_000, (1 << 52) + 1), None);
        assert_eq!(set.max_size(), 1 << 52);
    }

    #[test]
    fn classes_are_monotonic() {
        // Every size up to 2^17, then each power of two and its neighbours up to 2^60: the class
        // never decreases, and a power of two opens a class of its own.
        let mut sizes: Vec<u64> = (1..(1 << 17)).collect();
        for l in 17..60 {
            sizes.extend([(1u64 << l) - 1, 1 << l, (1 << l) + 1, (1 << l) + (1 << (l - 1))]);
        }
        let mut last = 0;
        for &s in &sizes {
            let c = class_of(s);
            assert!(c >= last, "class_of({s}) = {c} < {last}");
            assert!(c < BINS, "class_of({s}) = {c} is past the last bin");
            if s.is_power_of_two() && s > 1 {
                assert!(c > class_of(s - 1), "{s} shares a class with {}", s - 1);
            }
            last = c;
        }
    }

    proptest! {
        /// Every query answers exactly as the ordered set (a BTreeMap) does.
        #[test]
        fn agrees_with_an_ordered_map(ops in proptest::collection::vec((0u32..3, 1u64..5000, 0u64..64, any::<bool>()), 1..300),
                                      queries in proptest::collection::vec((0u32..3, 1u64..6000), 1..50)) {
            let mut set = FreeSet::default();
            let mut map: BTreeMap<FreeKey, u32> = BTreeMap::new();
            for (i, (s, size, ptr, insert)) in ops.into_iter().enumerate() {
                let k = FreeKey::new(s, size * 512, ptr << 21);
                if insert && !map.contains_key(&k) {
                    set.insert(k, i as u32);
                    map.insert(k, i as u32);
                } else if !insert {
                    prop_assert_eq!(set.remove(k), map.remove(&k).is_some());
                }
            }
            prop_assert_eq!(set.len(), map.len());
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), map.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
            for (s, size) in queries {
                let want = map.range(FreeKey::new(s, size * 512, 0)..).next().filter(|(k, _)| k.stream() == s).map(|(k, v)| (*k, *v));
                let got = set.first_at_least(s, size * 512);
                prop_assert_eq!(got, want);
                if let Some((k, _)) = got {
                    let want_next = map.range(k..).nth(1).filter(|(n, _)| n.stream() == s).map(|(k, v)| (*k, *v));
                    prop_assert_eq!(set.next_after(k), want_next);
                }
                let want_below: Vec<_> = map.range(..FreeKey::new(s, size * 512, 0)).rev().filter(|(k, _)| k.stream() == s).map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(set.below_descending(s, size * 512), want_below);
            }
        }
    }
}
