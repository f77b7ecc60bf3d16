//! `expandable_segments:True`: one VA reservation per (stream, pool), mapped page by page
//! (PR #96995; CUDACachingAllocator.cpp `ExpandableSegment`, `try_allocate_expandable_block`,
//! `map_block`, `unmap_block`, `release_expandable_segment`).

use super::{Block, CachingAllocator, ExpandableSegment, NIL, SMALL_BUFFER_BYTES};
use crate::gpu::device::{Device, DeviceError};
use crate::gpu::stats::PoolKind;

use super::PoolId;

impl<D: Device> CachingAllocator<D> {
    /// find_expandable_block: the lowest-address run of free-or-unmapped blocks on this stream
    /// that covers `size` (starting at a free mapped block just before an unmapped one when there
    /// is one), else a new segment, else (the request is larger than a segment's reserve) NIL.
    fn find_expandable_block(&mut self, stream: u32, pool: PoolId, size: u64) -> Result<u32, DeviceError> {
        // allocatable: not allocated, and no event outstanding (`event_count == 0`: a block
        // awaiting another stream's work is not free yet).
        let allocatable = |s: &Self, i: u32| i != NIL && !s.blocks[i as usize].allocated && !s.events.is_pending(i);
        let unmapped: Vec<u32> = self.pools[pool.index()].unmapped.range((stream, 0)..).take_while(|(k, _)| k.0 == stream).map(|(_, &i)| i).collect();
        for u in unmapped {
            let mut c = u;
            let prev = self.blocks[u as usize].prev;
            if allocatable(self, prev) {
                c = prev;
            }
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < size && allocatable(self, b) {
                bytes += self.blocks[b as usize].size;
                b = self.blocks[b as usize].next;
            }
            if bytes >= size {
                return Ok(c);
            }
        }
        // A new segment: G × ceil(1.125 × totalGlobalMem / G) of address space, all unmapped (or
        // what expandable_segments_reserve asks, torch 2.15).
        let page_size = if pool.kind() == PoolKind::Small { SMALL_BUFFER_BYTES } else { self.cfg.large_segment_size };
        let total = self.device.capacity();
        let pages = self.cfg.expandable_segments_reserve.bytes(total).div_ceil(page_size);
        // "This allocation exceeds the expandable-segment reserve ... a single allocation cannot
        // span expandable segments" (torch 2.15, a reserve set smaller than the request): no
        // segment, and the request takes the OOM path.
        if pages * page_size < size {
            return Ok(NIL);
        }
        let base = self.device.reserve_address(pages * page_size)?;
        let seg = ExpandableSegment { base, page_size, mapped: vec![false; pages as usize] };
        let va = seg.va_size();
        let seg_index = match self.expandable_segments.iter().position(Option::is_none) {
            Some(free) => {
                self.expandable_segments[free] = Some(seg);
                free
            }
            None => {
                self.expandable_segments.push(Some(seg));
                self.expandable_segments.len() - 1
            }
        } as u32;
        // (torch 2.12+ numbers an expandable segment's blocks by the segment, as it does an
        // ordinary segment's: not yet checked against the oracle, which has no VMM calls.)
        let tie_units = self.segment_tie_units(base, va);
        let i = self.new_block(Block {
            ptr: base,
            size: va,
            requested: 0,
            prev: NIL,
            next: NIL,
            stream,
            pool,
            allocated: false,
            mapped: false,
            segment: seg_index,
            gc_count_base: 0,
            tie_units,
            slot: NIL,
        });
        self.pools[pool.index()].unmapped.insert((stream, base), i);
        if pool.is_private() {
            self.owner_private_pool(pool).cuda_malloc_count += 1;
        }
        Ok(i)
    }

    /// try_allocate_expandable_block: map what the chosen run needs, merging as it goes.
    pub(super) fn try_allocate_expandable_block(&mut self, stream: u32, pool: PoolId, size: u64) -> Result<Option<u32>, DeviceError> {
        let mut candidate = self.find_expandable_block(stream, pool, size)?;
        if candidate == NIL {
            return Ok(None);
        }
        if !self.blocks[candidate as usize].mapped {
            let n = self.blocks[candidate as usize].size.min(size);
            if !self.map_block(candidate, n)? {
                return Ok(None);
            }
        }
        while self.blocks[candidate as usize].size < size {
            let remaining = size - self.blocks[candidate as usize].size;
            let next = self.blocks[candidate as usize].next;
            let n = remaining.min(self.blocks[next as usize].size);
            if !self.map_block(next, n)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Ok(Some(candidate))
    }

    /// map_block: map the pages covering [ptr, ptr + size) of an unmapped block; the mapped part
    /// becomes a free block merged with free neighbours, the rest stays unmapped.
    fn map_block(&mut self, i: u32, size: u64) -> Result<bool, DeviceError> {
        let (ptr, block_size, seg_index, pool, stream) = {
            let b = &self.blocks[i as usize];
            (b.ptr, b.size, b.segment as usize, b.pool, b.stream)
        };
        let (base, page) = {
            let seg = self.expandable_segments[seg_index].as_ref().expect("live segment");
            (seg.base, seg.page_size)
        };
        let begin = (ptr - base) / page;
        let end = (ptr + size - base).div_ceil(page);
        let mut done = Vec::new();
        for p in begin..end {
            match self.device.map_page(base + p * page, page) {
                Ok(()) => done.push(p),
                Err(DeviceError::OutOfMemory) => {
                    // Handles created by this call are released; earlier calls' pages stay.
                    for q in done {
                        self.device.unmap_page(base + q * page, page)?;
                    }
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        let seg = self.expandable_segments[seg_index].as_mut().expect("live segment");
        for p in begin..end {
            seg.mapped[p as usize] = true;
        }
        let mapped_size = (end - begin) * page;
        self.pools[pool.index()].unmapped.remove(&(stream, ptr));
        self.blocks[i as usize].mapped = true;
        if mapped_size < block_size {
            let old_next = self.blocks[i as usize].next;
            let tie_units = self.split_tie_units(self.blocks[i as usize].tie_units);
            let rest = self.new_block(Block {
                ptr: ptr + mapped_size,
                size: block_size - mapped_size,
                requested: 0,
                prev: i,
                next: old_next,
                stream,
                pool,
                allocated: false,
                mapped: false,
                segment: seg_index as u32,
                gc_count_base: 0,
                tie_units,
                slot: NIL,
            });
            self.blocks[old_next as usize].prev = rest;
            self.blocks[i as usize].next = rest;
            self.blocks[i as usize].size = mapped_size;
            self.pools[pool.index()].unmapped.insert((stream, ptr + mapped_size), rest);
        }
        let prev = self.blocks[i as usize].prev;
        self.try_merge(i, prev);
        let next = self.blocks[i as usize].next;
        self.try_merge(i, next);
        self.insert_free(i);
        self.stats.change_segments(pool.kind(), 0, mapped_size as i64);
        self.stats.num_device_alloc += 1;
        Ok(true)
    }

    /// unmap_block: unmap every whole page inside a free expandable block; partial edge pages
    /// stay as free mapped blocks.
    pub(super) fn unmap_block(&mut self, i: u32) -> Result<(), DeviceError> {
        let (ptr, size, seg_index, pool, stream) = {
            let b = &self.blocks[i as usize];
            (b.ptr, b.size, b.segment as usize, b.pool, b.stream)
        };
        let (base, page) = {
            let seg = self.expandable_segments[seg_index].as_ref().expect("live segment");
            (seg.base, seg.page_size)
        };
        let begin = (ptr - base).div_ceil(page);
        let end = (ptr + size - base) / page;
        if begin >= end {
            return Ok(());
        }
        for p in begin..end {
            self.device.unmap_page(base + p * page, page)?;
        }
        let seg = self.expandable_segments[seg_index].as_mut().expect("live segment");
        for p in begin..end {
            seg.mapped[p as usize] = false;
        }
        let un_ptr = base + begin * page;
        let un_size = (end - begin) * page;
        self.remove_free(i);
        let template = Block { requested: 0, allocated: false, mapped: true, gc_count_base: 0, ..self.blocks[i as usize] };
        let before = un_ptr - ptr;
        if before > 0 {
            let prev = self.blocks[i as usize].prev;
            let tie_units = self.split_tie_units(template.tie_units);
            let bi = self.new_block(Block { ptr, size: before, prev, next: i, tie_units, ..template });
            self.blocks[prev as usize].next = bi;
            self.blocks[i as usize].prev = bi;
            self.insert_free(bi);
        }
        let after = size - before - un_size;
        if after > 0 {
            let next = self.blocks[i as usize].next;
            let tie_units = self.split_tie_units(template.tie_units);
            let ai = self.new_block(Block { ptr: un_ptr + un_size, size: after, prev: i, next, tie_units, ..template });
            self.blocks[next as usize].prev = ai;
            self.blocks[i as usize].next = ai;
            self.insert_free(ai);
        }
        {
            let b = &mut self.blocks[i as usize];
            b.ptr = un_ptr;
            b.size = un_size;
            b.mapped = false;
        }
        let prev = self.blocks[i as usize].prev;
        self.try_merge(i, prev);
        let next = self.blocks[i as usize].next;
        self.try_merge(i, next);
        let key = (stream, self.blocks[i as usize].ptr);
        self.pools[pool.index()].unmapped.insert(key, i);
        self.stats.change_segments(pool.kind(), 0, -(un_size as i64));
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// release_expandable_segment: the whole VA range is one unmapped block: free the reservation.
    pub(super) fn release_expandable_segment(&mut self, i: u32) -> Result<(), DeviceError> {
        let b = self.blocks[i as usize];
        let seg = self.expandable_segments[b.segment as usize].take().expect("live segment");
        debug_assert_eq!(b.size, seg.va_size());
        self.device.release_address(seg.base, seg.va_size())?;
        self.pools[b.pool.index()].unmapped.remove(&(b.stream, b.ptr));
        if b.pool.is_private() {
            self.owner_private_pool(b.pool).cuda_malloc_count -= 1;
        }
        self.kill(i);
        Ok(())
    }
}
