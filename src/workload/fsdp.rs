//! FSDP2's parameter groups and the sizes it allocates for them (`fully_shard` on each block,
//! then on the root, as `torch/distributed/fsdp/_fully_shard` in torch 2.15 lays them out).
//!
//! Each parameter is sharded on dim 0, padded to a multiple of the world size
//! (`_fsdp_param.py`: `padded_sharded_param_size`); a group all-gathers the concatenation of its
//! shards and copies the result out into one unsharded tensor per parameter
//! (`split_with_sizes_copy`), and reduce-scatters the concatenation of its gradients
//! (`_chunk_cat`). Both copies launch one kernel whose metadata PyTorch packs into a device
//! tensor (`aten/src/ATen/native/cuda/TensorShape.cu`, `pack_vecs`): its size depends on the
//! card's multiprocessors, here an H100's.

use super::model::ParamLayout;

/// `TensorShape.cu`'s `detail::BLOCK_SIZE` and `BYTES_PER_THREAD`.
const BLOCK_SIZE: u64 = 128;
const BYTES_PER_THREAD: u64 = 16;
/// H100 SXM: 132 multiprocessors of 2,048 threads (what `split_with_sizes_copy` sizes its grid by).
const MULTIPROCESSORS: u64 = 132;
const THREADS_PER_MULTIPROCESSOR: u64 = 2048;

/// One `fully_shard` unit: its parameters in module order, each one's padded shard.
pub struct FsdpGroup {
    pub params: Vec<usize>,
    pub shard_elems: Vec<u64>,
}

impl FsdpGroup {
    /// Elements of the group's shard on one rank (the all-gather input, the reduce-scatter
    /// output).
    pub fn shard_total(&self) -> u64 {
        self.shard_elems.iter().sum()
    }

    /// Bytes of the device tensor `split_with_sizes_copy` packs its pointers and grid into
    /// when copying out an all-gather of `world` ranks in a dtype of `elem_bytes`:
    /// destination and source addresses, chunk sizes and block cumsums per split, plus one
    /// entry per block of its jagged grid.
    pub fn copy_out_metadata_bytes(&self, world: u64, elem_bytes: u64) -> u64 {
        let chunk_bytes: Vec<u64> = self.shard_elems.iter().map(|&e| e * elem_bytes).collect();
        let per_block = BLOCK_SIZE * BYTES_PER_THREAD;
        let first: u64 = chunk_bytes.iter().map(|&c| c.div_ceil(per_block)).sum();
        let max_blocks = MULTIPROCESSORS * THREADS_PER_MULTIPROCESSOR / BLOCK_SIZE * 2;
        let iter_factor = (first * world).div_ceil(max_blocks).max(1);
        let chunks_per_block = ((iter_factor as f64).sqrt().ceil() as u64).min(world).max(1);
        let iters_per_chunk = iter_factor.div_ceil(chunks_per_block);
        let blocks: u64 = chunk_bytes.iter().map(|&c| c.div_ceil(per_block * iters_per_chunk)).sum();
        let n = self.params.len() as u64;
        (4 * n + 1 + blocks) * 8
    }

    /// Bytes of the device tensor `_chunk_cat` packs its metadata into when concatenating the
    /// group's gradients into the reduce-scatter input (`elem_bytes`: the reduce dtype): seven
    /// per-tensor vectors (two with a leading zero) and one entry per block.
    pub fn chunk_cat_metadata_bytes(&self, elem_bytes: u64) -> u64 {
        let per_block = BLOCK_SIZE * BYTES_PER_THREAD;
        let blocks: u64 = self.shard_elems.iter().map(|&e| (e * elem_bytes).div_ceil(per_block)).sum();
        let n = self.params.len() as u64;
        (6 * n + 2 + blocks) * 8
    }
}

/// The groups of a model under FSDP2: index 0 the root (embeddings, final norm, output
/// projection), then one per block.
pub struct FsdpLayout {
    pub world: u64,
    pub groups: Vec<FsdpGroup>,
    /// How many of the root's parameters (the embeddings) come before the blocks.
    root_before_blocks: usize,
}

impl FsdpLayout {
    pub fn new(layout: &ParamLayout, world: u64) -> Self {
        let named = &layout.named;
        let shard = |i: usize| layout.dim0[i].div_ceil(world) * (layout.elems[i] / layout.dim0[i].max(1));
        let group = |params: Vec<usize>| FsdpGroup { shard_elems: params.iter().map(|&i| shard(i)).collect(), params };
        let mut root: Vec<usize> = std::iter::once(named.tok_embed).chain(named.pos_embed).collect();
        let root_before_blocks = root.len();
        root.push(named.final_norm.weight);
        root.extend(named.final_norm.bias);
        if named.lm_head.weight != named.tok_embed {
            root.push(named.lm_head.weight);
        }
        let mut groups = vec![group(root)];
        groups.extend(named.blocks.iter().map(|b| group(b.module_order())));
        FsdpLayout { world, groups, root_before_blocks }
    }

    /// Every parameter in module order (how `to_empty` allocates the shards and
    /// `model.parameters()` lists them): embeddings, the blocks, then the head.
    pub fn module_order(&self) -> Vec<(usize, u64)> {
        let root = &self.groups[0];
        let head_from = self.root_before_blocks;
        let mut order: Vec<(usize, u64)> = (0..head_from).map(|k| (root.params[k], root.shard_elems[k])).collect();
        for g in &self.groups[1..] {
            order.extend(g.params.iter().copied().zip(g.shard_elems.iter().copied()));
        }
        order.extend((head_from..root.params.len()).map(|k| (root.params[k], root.shard_elems[k])));
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::transformer::outer_sum_scratch;
    use crate::workload::Workload;

    fn seven_b() -> FsdpLayout {
        let w = Workload::load(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/llama2-7b-fsdp2-8xh100.toml"))).unwrap();
        FsdpLayout::new(&ParamLayout::new(&w.file.transformer.unwrap().model), 8)
    }

    /// The sizes the committed 7B capture (PyTorch's own CUDA path on an H100-sized fake card)
    /// recorded: a block's bf16 all-gather input and its copy-out metadata, its fp32
    /// reduce-scatter concatenation's metadata; the root's the same.
    #[test]
    fn group_sizes_are_the_ones_pytorch_allocated_for_the_7b_capture() {
        let l = seven_b();
        assert_eq!(l.groups.len(), 33);
        let (root, block) = (&l.groups[0], &l.groups[1]);
        assert_eq!(block.params.len(), 9);
        assert_eq!(block.shard_total() * 2, 50_595_840);
        assert_eq!(root.shard_total() * 2, 65_537_024);
        assert_eq!(block.copy_out_metadata_bytes(8, 2), 28_576);
        assert_eq!(root.copy_out_metadata_bytes(8, 2), 32_112);
        assert_eq!(block.chunk_cat_metadata_bytes(4), 395_728);
        assert_eq!(root.chunk_cat_metadata_bytes(4), 512_168);
        // RMSNorm's weight gradient over 18 × 4096 tokens: 144 MiB of staging, 32 semaphores.
        assert_eq!(outer_sum_scratch(4096, 18 * 4096), Some((150_994_944, 128)));
        // Too few inputs per output to split across blocks (the small captures' norms).
        assert_eq!(outer_sum_scratch(64, 128), None);
    }

    /// Module order is state-dict order as llama.py registers it (the norm before the
    /// projections), the embeddings first and the head last; shards pad dim 0 up to the ranks.
    #[test]
    fn parameters_are_sharded_on_dim_0_padded_in_module_order() {
        let l = seven_b();
        let order = l.module_order();
        assert_eq!(order.len(), 291);
        let elems: Vec<u64> = order.iter().map(|&(_, e)| e).collect();
        assert_eq!(elems[..3], [32000 * 4096 / 8, 4096 / 8, 4096 * 4096 / 8]);
        assert_eq!(elems[elems.len() - 2..], [4096 / 8, 32000 * 4096 / 8]);
        let mut w = Workload::load(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/llama2-7b-fsdp2-8xh100.toml"))).unwrap();
        let model = &mut w.file.transformer.as_mut().unwrap().model;
        model.vocab = 32001;
        let odd = FsdpLayout::new(&ParamLayout::new(model), 8);
        assert_eq!(odd.groups[0].shard_elems[0], 4001 * 4096, "32,001 rows over 8 ranks: 4,001 each, the last padded");
    }
}
