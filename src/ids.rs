//! Maps keyed by trace ids, built for the ids traces have.
//!
//! Trace ids are nearly always small integers handed out in order (captures, generators and the
//! snapshot importer number allocations 1, 2, 3, ...), so ids below 2^32 live in pages of a
//! direct-indexed table: two loads per lookup instead of a hash probe (the hash maps of live ids
//! were a third of a bookkeeping-only replay's time). A page is dropped once every id in it has
//! died, so memory follows the live ids, not the length of the trace. Larger ids go to a hash map.
//!
//! A slot is its value, with one value standing for "no id" ([`Slot::EMPTY`]): no tag beside
//! each value to write and test on the path of every allocation and free of a replay.

use rustc_hash::FxHashMap;

const PAGE_BITS: u32 = 12;
const PAGE_LEN: usize = 1 << PAGE_BITS;

/// A value an [`IdMap`] holds, with the one value it never holds, which marks an empty slot.
pub trait Slot: Copy + PartialEq {
    const EMPTY: Self;

    /// Whether this is [`Slot::EMPTY`] (a type whose values differ from it in one field tests
    /// that field alone).
    #[inline(always)]
    fn is_empty(&self) -> bool {
        *self == Self::EMPTY
    }

    /// Makes this slot empty (a type that tests one field may write that field alone).
    #[inline(always)]
    fn clear(&mut self) {
        *self = Self::EMPTY;
    }
}

/// The value of a set: a live id's slot holds `true`.
impl Slot for bool {
    const EMPTY: Self = false;
}

struct Page<V> {
    slots: Box<[V; PAGE_LEN]>,
    live: u32,
}

impl<V: Slot> Page<V> {
    fn new() -> Self {
        let slots = vec![V::EMPTY; PAGE_LEN].into_boxed_slice().try_into().unwrap_or_else(|_| unreachable!("PAGE_LEN slots"));
        Page { slots, live: 0 }
    }

    #[inline(always)]
    fn get(&self, s: usize) -> Option<V> {
        let v = self.slots[s];
        (!v.is_empty()).then_some(v)
    }
}

/// id → `V` for the ids that are live (`V` is never [`Slot::EMPTY`]).
pub struct IdMap<V: Slot> {
    pages: Vec<Option<Page<V>>>,
    /// The last page dropped (all its slots empty), for the next new page: ids move through
    /// pages in order, so one is emptied about as often as one is made.
    spare: Option<Page<V>>,
    sparse: FxHashMap<u64, V>,
}

/// The set of live ids.
pub type IdSet = IdMap<bool>;

impl<V: Slot> Default for IdMap<V> {
    fn default() -> Self {
        IdMap { pages: Vec::new(), spare: None, sparse: FxHashMap::default() }
    }
}

impl<V: Slot> IdMap<V> {
    #[inline]
    fn split(id: u64) -> Option<(usize, usize)> {
        (id >> 32 == 0).then_some(((id >> PAGE_BITS) as usize, (id as usize) & (PAGE_LEN - 1)))
    }

    /// (Counted when asked, from the pages: a count kept beside them was a write at every
    /// insert and remove, and a replay never asks.)
    pub fn len(&self) -> usize {
        self.pages.iter().flatten().map(|p| p.live as usize).sum::<usize>() + self.sparse.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sparse.is_empty() && self.pages.iter().flatten().all(|p| p.live == 0)
    }

    #[inline]
    pub fn get(&self, id: u64) -> Option<V> {
        match Self::split(id) {
            Some((p, s)) => self.pages.get(p)?.as_ref()?.get(s),
            None => self.sparse.get(&id).copied(),
        }
    }

    #[inline]
    pub fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Records `id` → `v` (not [`Slot::EMPTY`]); false (and nothing changed) when `id` is
    /// already there.
    #[inline(always)]
    pub fn insert(&mut self, id: u64, v: V) -> bool {
        debug_assert!(!v.is_empty(), "the empty slot's value is not a value");
        let Some((p, s)) = Self::split(id) else {
            return self.insert_sparse(id, v);
        };
        let page = match self.pages.get_mut(p) {
            Some(Some(page)) => page,
            _ => self.new_page(p),
        };
        if !page.slots[s].is_empty() {
            return false;
        }
        page.slots[s] = v;
        page.live += 1;
        true
    }

    #[cold]
    fn insert_sparse(&mut self, id: u64, v: V) -> bool {
        match self.sparse.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(v);
                true
            }
        }
    }

    /// Page `p`, made (empty) where there is none.
    #[cold]
    fn new_page(&mut self, p: usize) -> &mut Page<V> {
        if self.pages.len() <= p {
            self.pages.resize_with(p + 1, || None);
        }
        let spare = &mut self.spare;
        self.pages[p].get_or_insert_with(|| spare.take().unwrap_or_else(Page::new))
    }

    #[inline(always)]
    pub fn remove(&mut self, id: u64) -> Option<V> {
        let v = self.take(id);
        (!v.is_empty()).then_some(v)
    }

    /// [`IdMap::remove`], answering [`Slot::EMPTY`] for an id that is not there (no option to
    /// build and take apart on the path of every free).
    #[inline(always)]
    pub fn take(&mut self, id: u64) -> V {
        let Some((p, s)) = Self::split(id) else {
            return self.remove_sparse(id).unwrap_or(V::EMPTY);
        };
        let Some(Some(page)) = self.pages.get_mut(p) else {
            return V::EMPTY;
        };
        let slot = &mut page.slots[s];
        let v = *slot;
        if v.is_empty() {
            return V::EMPTY;
        }
        slot.clear();
        page.live -= 1;
        if page.live == 0 {
            self.drop_page(p);
        }
        v
    }

    #[cold]
    fn remove_sparse(&mut self, id: u64) -> Option<V> {
        self.sparse.remove(&id)
    }

    /// Page `p` holds no live id: kept as the spare for the next new page.
    #[cold]
    fn drop_page(&mut self, p: usize) {
        self.spare = self.pages[p].take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Value(u32, u64);

    impl Slot for Value {
        const EMPTY: Self = Value(u32::MAX, 0);
    }

    proptest! {
        /// Answers exactly as a hash map does, for dense, page-crossing and huge ids.
        #[test]
        fn agrees_with_a_map(ops in proptest::collection::vec((0u8..3, 0u64..3, 0u64..20_000, 1u64..1000), 1..2000)) {
            let mut ids: IdMap<Value> = IdMap::default();
            let mut map: HashMap<u64, Value> = HashMap::new();
            for (i, (op, hi, lo, bytes)) in ops.into_iter().enumerate() {
                let id = [0, 1 << 20, u64::MAX - 30_000][hi as usize] + lo;
                match op {
                    0 => {
                        let fresh = !map.contains_key(&id);
                        prop_assert_eq!(ids.insert(id, Value(i as u32, bytes)), fresh);
                        if fresh {
                            map.insert(id, Value(i as u32, bytes));
                        }
                    }
                    1 => prop_assert_eq!(ids.remove(id), map.remove(&id)),
                    _ => prop_assert_eq!(ids.get(id), map.get(&id).copied()),
                }
                prop_assert_eq!(ids.len(), map.len());
            }
            // A page whose ids have all died is dropped.
            for id in map.keys().copied().collect::<Vec<_>>() {
                prop_assert!(ids.remove(id).is_some());
            }
            prop_assert!(ids.pages.iter().all(Option::is_none));
            prop_assert!(ids.spare.as_ref().is_none_or(|p| p.live == 0 && p.slots.iter().all(|&v| v == Value::EMPTY)));
            prop_assert!(ids.sparse.is_empty() && ids.is_empty());
        }
    }
}
