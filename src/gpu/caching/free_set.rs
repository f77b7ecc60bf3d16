//! The free-block set of a pool, ordered by (stream, size, tie) exactly as PyTorch's
//! `std::set<Block*, BlockComparatorSize>`, but built for speed (the tie is the address, or
//! from torch 2.12 the segment's creation number and the address packed in 64 bits: the
//! caller's `key`): per stream, blocks sit in
//! size-class bins (16 classes per power of two; class order follows size order), unsorted, with
//! a bitmap of the non-empty bins. Insert is a push, remove a swap with the bin's last entry
//! (the caller keeps each block's slot). Best fit is the least fitting entry of the first bin
//! (a block or two), else the least entry of the next non-empty bin: the same answer as a
//! lower_bound on the ordered set. A bin past `SHORT_BIN` entries is kept as an ordered tree
//! instead, so one crowded size class costs O(log n), as the std::set does.

use std::collections::BTreeMap;
use std::hint::select_unpredictable;

use rustc_hash::FxHashMap;

/// The order (stream, size, tie): the stream first, then size and tie packed into one u128
/// (size in the high 64 bits, the tie in the low 64), so neither the number of streams nor a
/// size is limited by the packing (BlockComparatorSize has no such limits either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FreeKey {
    stream: u32,
    size_ptr: u128,
}

/// (size, address) as one u128, size in the high half: compares as the pair does.
#[inline(always)]
fn order_key(size: u64, ptr: u64) -> u128 {
    (size as u128) << 64 | ptr as u128
}

impl FreeKey {
    #[inline]
    pub fn new(stream: u32, size: u64, tie: u64) -> Self {
        FreeKey { stream, size_ptr: order_key(size, tie) }
    }
    #[inline]
    pub fn stream(self) -> u32 {
        self.stream
    }
    #[inline]
    pub fn size(self) -> u64 {
        (self.size_ptr >> 64) as u64
    }
    /// What orders equal sizes: the address, or what the caller packs ([`FreeKey`]).
    #[inline]
    pub fn tie(self) -> u64 {
        self.size_ptr as u64
    }
}

/// A slot packs an entry's bin (its size class) and its index in the bin as `class << 8 | index`,
/// so a remove does not recompute the class. An entry of a long bin has index `LONG_INDEX` (its
/// place there means nothing).
const LONG_INDEX: u32 = 0xFF;
const _: () = assert!(SHORT_BIN < LONG_INDEX as usize, "a short bin's index fits below LONG_INDEX");

#[inline(always)]
fn slot_of(class: usize, index: u32) -> u32 {
    (class as u32) << 8 | index
}

/// Size classes per power of two (2^SUB_BITS): fine enough that a bin holds a block or two.
const SUB_BITS: u32 = 4;
const BINS: usize = 64 << SUB_BITS;
const WORDS: usize = BINS / 64;
/// A bin longer than this becomes an ordered tree: scans stay short, and a pathological bin
/// (thousands of free blocks in one size class) costs O(log n) an operation, as PyTorch's set does.
const SHORT_BIN: usize = 64;
const _: () = assert!(WORDS <= 64, "one summary word covers the bitmap");

/// Monotonic in size: a ≤ b implies class(a) ≤ class(b). From 2^SUB_BITS up, each power of
/// two opens 2^SUB_BITS classes: the top SUB_BITS + 1 bits of the size (a leading 1, then the
/// sub-class), offset by the octave; smaller sizes (no block is under 512 bytes) share a class.
#[inline]
fn class_of(size: u64) -> usize {
    let size = size.max(1 << SUB_BITS);
    let octave = size.ilog2() - SUB_BITS;
    ((size >> octave) + ((octave as u64) << SUB_BITS)) as usize
}

/// A bin entry: the stream is the bin's, so an entry holds (size, address) and the block.
#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    ptr: u64,
    block: u32,
}

impl Entry {
    #[inline]
    fn key(&self, stream: u32) -> FreeKey {
        FreeKey::new(stream, self.size, self.ptr)
    }
}

/// The running least distance of a scan ([`least_from`]) and the index of its entry.
#[derive(Clone, Copy)]
struct Least {
    lo: u64,
    hi: u64,
    index: usize,
}

impl Least {
    /// No entry yet: the largest distance there is.
    const NONE: Least = Least { lo: u64::MAX, hi: u64::MAX, index: usize::MAX };

    /// Entry `index` at distance `d` replaces the least if it is not farther. (Distances of
    /// distinct keys are distinct: `<=` differs from `<` only at the largest, where it lets a key
    /// at that distance replace the empty answer.)
    #[inline(always)]
    fn consider(&mut self, index: usize, d: u128) {
        let wins = d <= order_key(self.hi, self.lo);
        // (Word-sized selects: a u128 one compiles to a branch.)
        self.lo = select_unpredictable(wins, d as u64, self.lo);
        self.hi = select_unpredictable(wins, (d >> 64) as u64, self.hi);
        self.index = select_unpredictable(wins, index, self.index);
    }
}

/// The least entry of `bin` not below (size, ptr), and its index. Bins are unsorted (insert is
/// a push, remove a swap with the last entry) and short, so the order is found by a scan where
/// it is asked. (size, address) compares as one u128 and the running minimum is a select, not a
/// branch: which entry wins is data, and a branch on it mispredicts about every other scan.
#[inline(always)]
fn least_from(bin: &[Entry], size: u64, ptr: u64) -> Option<(usize, &Entry)> {
    debug_assert!(!bin.is_empty(), "only occupied bins are scanned");
    let from = order_key(size, ptr);
    // The least key not below `from` is the one whose distance above it, `key − from`, is least:
    // a key below `from` wraps to a distance above every key's, so one compare per entry does.
    let distance = |e: &Entry| order_key(e.size, e.ptr).wrapping_sub(from);
    let mut least = Least::NONE;
    if bin.len() <= 2 {
        // Most bins hold a block or two: two steps, the last entry standing in for a missing
        // second (a repeat cannot change the least), so the scan's end is no branch that
        // mispredicts with every change of a bin's length.
        let last = bin.len() - 1;
        // SAFETY: `bin` is not empty (only occupied bins are scanned: `least_in` passes a short
        // bin's `entries`, which have `len` ≥ 1), so 0 and `last` = len − 1 are in it.
        least.consider(0, distance(unsafe { bin.get_unchecked(0) }));
        // SAFETY: as above.
        least.consider(last, distance(unsafe { bin.get_unchecked(last) }));
    } else {
        // Two running minima, of the even and the odd entries, merged at the end: each select
        // waits for the one before it in its chain, and two chains take half as long.
        let mut odd = Least::NONE;
        let pairs = bin.chunks_exact(2);
        let rest = pairs.remainder();
        for (j, pair) in pairs.enumerate() {
            least.consider(2 * j, distance(&pair[0]));
            odd.consider(2 * j + 1, distance(&pair[1]));
        }
        if let [e] = rest {
            least.consider(bin.len() - 1, distance(e));
        }
        least.consider(odd.index, order_key(odd.hi, odd.lo));
    }
    // (With every key below `from`, the least distance is a wrapped one.)
    let best = least.index;
    bin.get(best).filter(|e| order_key(e.size, e.ptr) >= from).map(|e| (best, e))
}

/// An entry a query found: its key, its block, and its slot (what `insert` answered for it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Found {
    pub key: FreeKey,
    pub block: u32,
    pub slot: u32,
}

/// Non-empty bins of one stream: a bit per bin, and a summary bit per non-zero word.
#[derive(Clone, Copy)]
struct Occupancy {
    summary: u64,
    words: [u64; WORDS],
}

impl Occupancy {
    const EMPTY: Occupancy = Occupancy { summary: 0, words: [0; WORDS] };

    #[inline(always)]
    fn has(&self, c: usize) -> bool {
        self.words[c / 64] & (1 << (c % 64)) != 0
    }

    /// Clears bin `c`'s bit when `empty`; branch-free, as whether a bin empties is data.
    #[inline(always)]
    fn clear_if(&mut self, c: usize, empty: bool) {
        // SAFETY: `c` is a class, below BINS = 64 · WORDS (see Note [unchecked indexing]; the
        // callers pass one from a slot `insert` made), so `c / 64` < WORDS.
        let word = unsafe { self.words.get_unchecked_mut(c / 64) };
        *word &= !((empty as u64) << (c % 64));
        self.summary &= !(((*word == 0) as u64) << (c / 64));
    }

    /// The first non-empty bin at or after class `from`.
    #[inline(always)]
    fn first_from(&self, from: usize) -> Option<usize> {
        let w = from / 64;
        if w >= WORDS {
            return None;
        }
        // SAFETY: `w` < WORDS, tested just above.
        let bits = unsafe { *self.words.get_unchecked(w) } & (!0u64 << (from % 64));
        // In this word, else in the first later occupied one (a select, not a branch: where the
        // next occupied bin lies is data). With none later, `trailing_zeros` is 64.
        let in_word = bits != 0;
        let later = self.summary & ((!1u64) << w);
        let w = select_unpredictable(in_word, w, later.trailing_zeros() as usize);
        if w >= WORDS {
            return None;
        }
        // SAFETY: `w` < WORDS, tested just above.
        let bits = select_unpredictable(in_word, bits, unsafe { *self.words.get_unchecked(w) });
        Some(w * 64 + bits.trailing_zeros() as usize)
    }

    /// The last non-empty bin.
    fn last(&self) -> Option<usize> {
        let w = self.summary.checked_ilog2()? as usize;
        Some(w * 64 + self.words[w].ilog2() as usize)
    }
}

// Note [unchecked indexing]: unchecked indexing on the hot paths (bounds checks were 4 % of a
// replay's instructions) rests on three facts: a class is below BINS (`class_of(u64::MAX)`, the
// largest, is (65 − SUB_BITS) · 2^SUB_BITS − 1 < BINS, and `first_from` stops at WORDS), a
// stream's bins and occupancy exist once `insert` has seen it (`first_from` checks, and `remove`
// takes keys `insert` answered), and a short bin with entries has its array, with its slot
// indices below its length (the caller keeps slots current). `bins` and `lens` hold BINS entries
// per stream of `occupied` (`add_streams` grows all three together; nothing shrinks them). The
// caller's part holds as the caching allocator (the only caller) files a block once and removes
// only blocks it filed, under the key and slot last answered for them (a block leaves the set
// before its size or address changes), and refuses to free a block that is not allocated (a
// second free would file a block twice, and a slot could then outlive its entry).

/// A short bin's entries: room for [`SHORT_BIN`], the first `lens[bin]` in use. Fixed, so an
/// insert is a store at a known place (no capacity to test, no vector header to read).
type Entries = Box<[Entry; SHORT_BIN]>;

/// The `lens` value of a long bin (its entries are in `long_bins`); above every short length.
const LONG: u8 = u8::MAX;
const _: () = assert!(SHORT_BIN < LONG as usize, "a short bin's length is below LONG");

/// Free blocks of one pool: key → block index. The bins of stream `s` are
/// `s * BINS..(s + 1) * BINS` of `lens` (their lengths, one byte each) and `bins` (their entry
/// arrays, made at a bin's first insert), with the non-empty ones marked per stream. `insert`
/// answers the entry's slot in its bin, which the caller keeps with the block, so a remove needs
/// no search. A bin that grows past [`SHORT_BIN`] moves into `long_bins`, ordered by (size,
/// address), and its length reads [`LONG`] until the tree empties.
#[derive(Default, Clone)]
pub struct FreeSet {
    bins: Vec<Option<Entries>>,
    lens: Vec<u8>,
    long_bins: FxHashMap<usize, BTreeMap<(u64, u64), u32>>,
    occupied: Vec<Occupancy>,
    len: usize,
}

impl FreeSet {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn streams(&self) -> usize {
        self.occupied.len()
    }

    /// The used entries of short bin `bin` (of `len` ≥ 1 entries).
    #[inline(always)]
    fn entries(&self, bin: usize, len: u8) -> &[Entry] {
        debug_assert!(len >= 1 && len as usize <= SHORT_BIN, "bin {bin} of length {len} is not a short bin with entries");
        // SAFETY: a short bin with entries has its array (made at its first insert, never
        // dropped), and `bin` is below `bins.len()` (see Note [unchecked indexing]).
        unsafe { &self.bins.get_unchecked(bin).as_ref().unwrap_unchecked()[..len as usize] }
    }

    /// Adds `block` under `k` (a key is in the set at most once); returns its slot.
    #[inline(always)]
    pub fn insert(&mut self, k: FreeKey, block: u32) -> u32 {
        let s = k.stream() as usize;
        if self.streams() <= s {
            self.add_streams(s + 1);
        }
        let c = class_of(k.size());
        let bin = s * BINS + c;
        // SAFETY: the stream's bins exist now (`add_streams` above), so `lens` holds
        // (s + 1) · BINS > s · BINS + c = `bin` entries (`c` < BINS: `class_of`'s largest is 975).
        let len = unsafe { *self.lens.get_unchecked(bin) };
        // A full short bin (SHORT_BIN) or a long one (LONG): one test.
        if len as usize >= SHORT_BIN {
            self.insert_long(bin, k, block);
            return slot_of(c, LONG_INDEX);
        }
        // SAFETY: `occupied` has a stream past `s` (`add_streams` above).
        let occupancy = unsafe { self.occupied.get_unchecked_mut(s) };
        // SAFETY: `c` < BINS, so `c / 64` < WORDS.
        *unsafe { occupancy.words.get_unchecked_mut(c / 64) } |= 1 << (c % 64);
        occupancy.summary |= 1 << (c / 64);
        // SAFETY: `bins` is as long as `lens`, which has `bin` (see above).
        let entries = match unsafe { self.bins.get_unchecked_mut(bin) } {
            Some(entries) => entries,
            None => self.new_bin(bin),
        };
        debug_assert!(entries[..len as usize].iter().all(|e| e.size != k.size() || e.ptr != k.tie()), "duplicate free key");
        // SAFETY: `len` < SHORT_BIN (a longer bin took the branch above), the array's length.
        unsafe { *entries.get_unchecked_mut(len as usize) = Entry { size: k.size(), ptr: k.tie(), block } };
        // SAFETY: `bin` is in `lens` (see above).
        unsafe { *self.lens.get_unchecked_mut(bin) = len + 1 };
        self.len += 1;
        slot_of(c, len as u32)
    }

    /// Bins (empty) for streams up to `streams`.
    #[cold]
    fn add_streams(&mut self, streams: usize) {
        self.occupied.resize(streams, Occupancy::EMPTY);
        self.bins.resize_with(streams * BINS, || None);
        self.lens.resize(streams * BINS, 0);
    }

    /// The entry array of `bin`, at its first insert.
    #[cold]
    fn new_bin(&mut self, bin: usize) -> &mut Entries {
        self.bins[bin].insert(Box::new([Entry { size: 0, ptr: 0, block: 0 }; SHORT_BIN]))
    }

    /// Insert into a long bin, making it one when its short bin is full.
    #[cold]
    fn insert_long(&mut self, bin: usize, k: FreeKey, block: u32) {
        let len = std::mem::replace(&mut self.lens[bin], LONG);
        let tree = self.long_bins.entry(bin).or_default();
        if len != LONG {
            let entries = self.bins[bin].as_ref().expect("a full short bin has its entries");
            tree.extend(entries[..len as usize].iter().map(|e| ((e.size, e.ptr), e.block)));
        }
        tree.insert((k.size(), k.tie()), block);
        self.len += 1;
    }

    /// Removes the entry filed under `k` at `slot` (what `insert` answered, or a later move).
    /// The bin's last entry takes its place: returns that entry's block, whose slot is now
    /// `slot` (the removed block itself when it was the last, or in a long bin).
    #[inline(always)]
    pub fn remove(&mut self, k: FreeKey, slot: u32) -> u32 {
        let (s, c, index) = (k.stream() as usize, (slot >> 8) as usize, slot & 0xFF);
        // (The module is the caching allocator's own: it removes only entries `insert` made.)
        debug_assert!(s < self.streams(), "stream {s} was never inserted");
        debug_assert_eq!(c, class_of(k.size()), "slot {slot:#x} is not in the class of {k:?}");
        let bin = s * BINS + c;
        // SAFETY: `k` was inserted, so stream `s` has its bins, and `c` comes from the slot
        // `insert` answered, below BINS: `bin` is in `lens` (see Note [unchecked indexing]).
        let len = unsafe { *self.lens.get_unchecked(bin) };
        if len == LONG {
            return self.remove_long(s, c, k);
        }
        debug_assert!(
            self.entries(bin, len).get(index as usize).is_some_and(|e| e.size == k.size() && e.ptr == k.tie()),
            "no free entry {k:?} at slot {slot:#x}"
        );
        // The last entry fills the hole unconditionally (a self-copy when the hole is the last):
        // whether it was is data, not worth a branch.
        // SAFETY: the entry at `slot` is in this short bin, so the bin has entries (1 ≤ `len` ≤
        // SHORT_BIN) and therefore its array; `bin` is in `bins` as in `lens`.
        let entries = unsafe { self.bins.get_unchecked_mut(bin).as_mut().unwrap_unchecked() };
        // SAFETY: 1 ≤ `len` ≤ SHORT_BIN, the array's length.
        let last = unsafe { *entries.get_unchecked(len as usize - 1) };
        // SAFETY: the caller's slot is current: `index` < `len` ≤ SHORT_BIN.
        unsafe { *entries.get_unchecked_mut(index as usize) = last };
        // SAFETY: `bin` is in `lens` (see above).
        unsafe { *self.lens.get_unchecked_mut(bin) = len - 1 };
        self.len -= 1;
        // SAFETY: stream `s` has its occupancy, as it has its bins.
        unsafe { self.occupied.get_unchecked_mut(s) }.clear_if(c, len == 1);
        last.block
    }

    #[cold]
    fn remove_long(&mut self, s: usize, c: usize, k: FreeKey) -> u32 {
        let tree = self.long_bins.get_mut(&(s * BINS + c)).expect("a free entry is in its bin");
        let block = tree.remove(&(k.size(), k.tie())).expect("a free entry is in its bin");
        if tree.is_empty() {
            self.long_bins.remove(&(s * BINS + c));
            self.lens[s * BINS + c] = 0;
            self.occupied[s].clear_if(c, true);
        }
        self.len -= 1;
        block
    }

    /// The least entry of bin `c` of stream `s` not below (size, ptr): (size, address, block,
    /// slot).
    #[inline(always)]
    /// (Bin `c` is occupied: a short bin with entries, or a long bin.)
    fn least_in(&self, s: usize, c: usize, size: u64, ptr: u64) -> Option<(u64, u64, u32, u32)> {
        // SAFETY: `s` < `streams()`, which `first_from`, the only caller, tested.
        debug_assert!(unsafe { self.occupied.get_unchecked(s) }.has(c), "bin {c} is not occupied");
        let bin = s * BINS + c;
        // SAFETY: stream `s` has its bins, and `c` < BINS (`Occupancy::first_from` answers a bit
        // of its WORDS words): `bin` is in `lens`.
        let len = unsafe { *self.lens.get_unchecked(bin) };
        if len == LONG {
            return self.least_in_long(bin, size, ptr).map(|(size, ptr, block)| (size, ptr, block, slot_of(c, LONG_INDEX)));
        }
        least_from(self.entries(bin, len), size, ptr).map(|(i, e)| (e.size, e.ptr, e.block, slot_of(c, i as u32)))
    }

    #[cold]
    fn least_in_long(&self, bin: usize, size: u64, ptr: u64) -> Option<(u64, u64, u32)> {
        self.long_bins[&bin].range((size, ptr)..).next().map(|(&(size, ptr), &block)| (size, ptr, block))
    }

    /// The first entry of `stream` not below (size, ptr), in set order.
    #[inline(always)]
    fn first_from(&self, stream: u32, size: u64, ptr: u64) -> Option<Found> {
        let s = stream as usize;
        if s >= self.streams() {
            return None;
        }
        // The first occupied bin from the bound's class: the bound's own, or (most requests) a
        // later one, every entry of which is above the bound. Either way its least entry not
        // below the bound answers, unless the bound's own bin holds only smaller entries: then
        // the next occupied bin's does. (No branch on whether the bound's bin is empty: data.)
        // SAFETY: `s` < `streams()`, `occupied`'s length, tested above.
        let occupancy = unsafe { self.occupied.get_unchecked(s) };
        let c = occupancy.first_from(class_of(size))?;
        let (size, ptr, block, slot) = match self.least_in(s, c, size, ptr) {
            Some(e) => e,
            // (The same bound: a constant one would let the scan's selects fold into a branch.)
            None => self.least_in(s, occupancy.first_from(c + 1)?, size, ptr)?,
        };
        Some(Found { key: FreeKey::new(stream, size, ptr), block, slot })
    }

    /// lower_bound(stream, size, 0) restricted to `stream`: the smallest block ≥ size, lowest
    /// address first, with its slot (the caller can remove it without reading the block).
    #[inline(always)]
    pub fn first_fit(&self, stream: u32, size: u64) -> Option<Found> {
        self.first_from(stream, size, 0)
    }

    /// [`FreeSet::first_fit`]'s key and block.
    pub fn first_at_least(&self, stream: u32, size: u64) -> Option<(FreeKey, u32)> {
        self.first_fit(stream, size).map(|f| (f.key, f.block))
    }

    /// The entry after `k` in set order, on the same stream.
    pub fn next_after(&self, k: FreeKey) -> Option<(FreeKey, u32)> {
        match k.tie().checked_add(1) {
            Some(ptr) => self.first_from(k.stream(), k.size(), ptr),
            None => self.first_from(k.stream(), k.size().checked_add(1)?, 0),
        }
        .map(|f| (f.key, f.block))
    }

    /// The entries of `stream` in set order, with the stream's id.
    fn stream_entries(&self, stream: usize) -> Vec<(FreeKey, u32)> {
        let mut out = Vec::new();
        // The occupied bins alone, in class order: a walk of every bin of every stream made a
        // flush of a cache used by thousands of streams take seconds.
        let occupancy = &self.occupied[stream];
        let occupied_classes = std::iter::successors(occupancy.first_from(0), |&c| occupancy.first_from(c + 1));
        for c in occupied_classes {
            let bin = stream * BINS + c;
            match self.lens[bin] {
                LONG => out.extend(self.long_bins[&bin].iter().map(|(&(size, ptr), &block)| (FreeKey::new(stream as u32, size, ptr), block))),
                len => {
                    let from = out.len();
                    out.extend(self.entries(bin, len).iter().map(|e| (e.key(stream as u32), e.block)));
                    out[from..].sort_unstable_by_key(|e| e.0);
                }
            }
        }
        out
    }

    /// Entries of `stream` below (stream, size, 0), largest first.
    pub fn below_descending(&self, stream: u32, size: u64) -> Vec<(FreeKey, u32)> {
        if stream as usize >= self.streams() {
            return Vec::new();
        }
        self.stream_entries(stream as usize).into_iter().rev().filter(|e| e.0.size() < size).collect()
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
                let bin = s * BINS + self.occupied[s].last()?;
                match self.lens[bin] {
                    LONG => self.long_bins[&bin].keys().next_back().map(|k| k.0),
                    len => self.entries(bin, len).iter().map(|e| e.size).max(),
                }
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
            assert_eq!((k.stream(), k.size(), k.tie()), (s, size, ptr));
        }
        assert!(FreeKey::new(8192, 512, 0) > FreeKey::new(8191, u64::MAX, u64::MAX));
        assert!(FreeKey::new(1, 1 << 52, 0) > FreeKey::new(1, 1 << 51, u64::MAX));
        let mut set = FreeSet::default();
        set.insert(FreeKey::new(10_000, 1 << 52, 4096), 3);
        assert_eq!(set.first_at_least(10_000, 1 << 51).map(|e| e.1), Some(3));
        assert_eq!(set.first_at_least(10_000, (1 << 52) + 1), None);
        assert_eq!(set.max_size(), 1 << 52);
        // The largest key is found from the smallest bound (its distance above it is the
        // largest there is), and a bound above every key finds none.
        set.insert(FreeKey::new(7, u64::MAX, u64::MAX), 4);
        assert_eq!(set.first_at_least(7, 0).map(|e| e.1), Some(4));
        set.insert(FreeKey::new(7, 1 << 20, 0), 5);
        assert_eq!(set.first_at_least(7, 0).map(|e| e.1), Some(5));
        assert_eq!(set.next_after(FreeKey::new(7, 1 << 20, 0)).map(|e| e.1), Some(4));
        assert_eq!(set.next_after(FreeKey::new(7, u64::MAX, u64::MAX)), None);
    }

    #[test]
    fn classes_are_monotonic() {
        // Every size up to 2^17, then each power of two and its neighbours up to u64::MAX: the class
        // never decreases, and a power of two from 2^SUB_BITS up opens a class of its own.
        let mut sizes: Vec<u64> = (1..(1 << 17)).collect();
        for l in 17..64 {
            sizes.extend([(1u64 << l) - 1, 1 << l, (1 << l) + 1, (1 << l) + (1 << (l - 1))]);
        }
        sizes.push(u64::MAX);
        let mut last = 0;
        for &s in &sizes {
            let c = class_of(s);
            assert!(c >= last, "class_of({s}) = {c} < {last}");
            assert!(c < BINS, "class_of({s}) = {c} is past the last bin");
            if s.is_power_of_two() && s > 1 << SUB_BITS {
                assert!(c > class_of(s - 1), "{s} shares a class with {}", s - 1);
            }
            last = c;
        }
    }

    /// Applies `ops` (stream, size / 512, address / 2 MiB, insert or remove) to a free set and to
    /// the ordered set it stands for (a BTreeMap), then asks both every query.
    fn agrees(ops: Vec<(u32, u64, u64, bool)>, queries: Vec<(u32, u64)>) -> Result<(), TestCaseError> {
        let mut set = FreeSet::default();
        let mut map: BTreeMap<FreeKey, u32> = BTreeMap::new();
        // What the allocator keeps with each block: its slot.
        let mut slots: BTreeMap<u32, u32> = BTreeMap::new();
        for (i, (s, size, ptr, insert)) in ops.into_iter().enumerate() {
            let k = FreeKey::new(s, size * 512, ptr << 21);
            if insert && !map.contains_key(&k) {
                slots.insert(i as u32, set.insert(k, i as u32));
                map.insert(k, i as u32);
            } else if !insert && map.contains_key(&k) {
                let block = map.remove(&k).unwrap();
                let slot = slots.remove(&block).unwrap();
                let moved = set.remove(k, slot);
                if moved != block {
                    slots.insert(moved, slot);
                }
            }
        }
        prop_assert_eq!(set.len(), map.len());
        prop_assert_eq!(set.iter().collect::<Vec<_>>(), map.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
        prop_assert_eq!(set.max_size(), map.keys().map(|k| k.size()).max().unwrap_or(0));
        for (s, size) in queries {
            let want = map.range(FreeKey::new(s, size * 512, 0)..).next().filter(|(k, _)| k.stream() == s).map(|(k, v)| (*k, *v));
            let got = set.first_at_least(s, size * 512);
            prop_assert_eq!(got, want);
            // The slot a search answers is the block's (in a long bin, where a slot's index
            // means nothing, its bin): what lets the allocator remove it without reading the block.
            if let Some(found) = set.first_fit(s, size * 512) {
                let kept = slots[&found.block];
                prop_assert!(
                    found.slot == kept || (found.slot >> 8 == kept >> 8 && found.slot & 0xFF == LONG_INDEX),
                    "slot {:#x}, kept {:#x}",
                    found.slot,
                    kept
                );
            }
            if let Some((k, _)) = got {
                let want_next = map.range(k..).nth(1).filter(|(n, _)| n.stream() == s).map(|(k, v)| (*k, *v));
                prop_assert_eq!(set.next_after(k), want_next);
            }
            let want_below: Vec<_> = map.range(..FreeKey::new(s, size * 512, 0)).rev().filter(|(k, _)| k.stream() == s).map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(set.below_descending(s, size * 512), want_below);
        }
        Ok(())
    }

    proptest! {
        /// Every query answers exactly as the ordered set (a BTreeMap) does.
        #[test]
        fn agrees_with_an_ordered_map(ops in proptest::collection::vec((0u32..3, 1u64..5000, 0u64..64, any::<bool>()), 1..300),
                                      queries in proptest::collection::vec((0u32..3, 1u64..6000), 1..50)) {
            agrees(ops, queries)?;
        }

        /// The same with a few sizes at many addresses: bins grow long, become trees, empty and
        /// shrink back to vectors.
        #[test]
        fn long_bins_agree_with_an_ordered_map(ops in proptest::collection::vec((0u32..2, 1u64..4, 0u64..250, proptest::bool::weighted(0.65)), 1..1500),
                                               queries in proptest::collection::vec((0u32..2, 1u64..5), 1..30)) {
            agrees(ops, queries)?;
        }
    }
}
