//! Cards by name, with their memory as PyTorch sees it, and what a job holds on the card outside
//! the caching allocator. One card, one number: `--card H100-80GB`, the default capacity, the
//! fake card of a capture and every report use the same bytes.
//!
//! A card's bytes are `torch.cuda.get_device_properties(0).total_memory` (CUDA's
//! `totalGlobalMem`): less than `nvidia-smi`'s total, which counts memory the driver keeps, and
//! a little different from driver to driver. Each figure names where it was read (docs/cards.md).

pub use crate::results::{NcclBudget, Outside, CUDA_CONTEXT_BYTES};
use crate::units::MIB;

/// A card in the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Card {
    /// The name `--card` takes (matched without regard to case, `-`, `_` or spaces).
    pub name: &'static str,
    /// The name torch prints (`get_device_properties(0).name`).
    pub torch_name: &'static str,
    /// `total_memory` in bytes.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Where the figure was read.
    pub source: &'static str,
}

/// The default card: an H100 80 GB SXM.
pub const DEFAULT_CARD: &str = "H100-80GB";

/// The cards `--card` knows ([`by_size`] gives them smallest first). A figure in MiB is torch's own printout
/// (`total_memory=NMB`, bytes floored to MiB: the card has up to 1 MiB more); one in bytes is
/// exact (a GPU run of this project, or deviceQuery's byte count).
pub const CARDS: &[Card] = &[
    Card {
        name: "T4",
        torch_name: "Tesla T4",
        total_memory: 14_930 * MIB,
        compute_capability: (7, 5),
        source: "torch printout, CUDA 11.8 (the lowest of 14,930-15,109 MiB seen across drivers)",
    },
    Card {
        name: "V100-16GB",
        torch_name: "Tesla V100-SXM2-16GB",
        total_memory: 16_160 * MIB,
        compute_capability: (7, 0),
        source: "torch printout (torch 1.8)",
    },
    Card { name: "A10G", torch_name: "NVIDIA A10G", total_memory: 22_587 * MIB, compute_capability: (8, 6), source: "torch printout (torch 2.15 dev)" },
    Card { name: "A10", torch_name: "NVIDIA A10", total_memory: 23_609_475_072, compute_capability: (8, 6), source: "deviceQuery bytes, driver 12.2" },
    Card { name: "L4", torch_name: "NVIDIA L4", total_memory: 23_612_293_120, compute_capability: (8, 9), source: "deviceQuery bytes, driver 12.0" },
    Card {
        name: "RTX-3090",
        torch_name: "NVIDIA GeForce RTX 3090",
        total_memory: 24_259 * MIB,
        compute_capability: (8, 6),
        source: "torch printout (24,259-24,268 MiB seen)",
    },
    Card {
        name: "RTX-4090",
        torch_name: "NVIDIA GeForce RTX 4090",
        total_memory: 25_756_696_576,
        compute_capability: (8, 9),
        source: "deviceQuery bytes; torch prints 24563MB",
    },
    Card {
        name: "V100-32GB",
        torch_name: "Tesla V100-SXM2-32GB",
        total_memory: 34_072_559_616,
        compute_capability: (7, 0),
        source: "deviceQuery bytes, driver 12.9",
    },
    Card {
        name: "A100-40GB-PCIe",
        torch_name: "NVIDIA A100-PCIE-40GB",
        total_memory: 40_326 * MIB,
        compute_capability: (8, 0),
        source: "torch printout (torch 1.9)",
    },
    Card {
        name: "A100-40GB",
        torch_name: "NVIDIA A100-SXM4-40GB",
        total_memory: 42_298_834_944,
        compute_capability: (8, 0),
        source: "deviceQuery bytes, driver 12.2",
    },
    Card {
        name: "L40S",
        torch_name: "NVIDIA L40S",
        total_memory: 47_576_711_168,
        compute_capability: (8, 9),
        source: "deviceQuery bytes, driver 12.4 (a torch printout elsewhere: 45589MB)",
    },
    Card { name: "RTX-A6000", torch_name: "NVIDIA RTX A6000", total_memory: 48_676 * MIB, compute_capability: (8, 6), source: "torch printout" },
    Card {
        name: "A100-80GB-PCIe",
        torch_name: "NVIDIA A100 80GB PCIe",
        total_memory: 81_049 * MIB,
        compute_capability: (8, 0),
        source: "mixbench printout, driver 12.3",
    },
    Card { name: "H100-PCIe", torch_name: "NVIDIA H100 PCIe", total_memory: 81_008 * MIB, compute_capability: (9, 0), source: "torch printout" },
    Card {
        name: "A100-80GB",
        torch_name: "NVIDIA A100-SXM4-80GB",
        total_memory: 84_987_740_160,
        compute_capability: (8, 0),
        source: "deviceQuery bytes, driver 12.2 (85,100,068,864 under 12.5)",
    },
    Card {
        name: "H100-80GB",
        torch_name: "NVIDIA H100 80GB HBM3",
        total_memory: 85_017_493_504,
        compute_capability: (9, 0),
        source: "this project's GPU run, driver 580.159.04 (reports/gpu-h100/data/cuda-runs.jsonl)",
    },
    Card {
        name: "GH200-96GB",
        torch_name: "NVIDIA GH200 480GB",
        total_memory: 102_005_473_280,
        compute_capability: (9, 0),
        source: "deviceQuery bytes, driver 12.2",
    },
    Card { name: "H200", torch_name: "NVIDIA H200", total_memory: 143_156 * MIB, compute_capability: (9, 0), source: "torch printout" },
    Card {
        name: "B200",
        torch_name: "NVIDIA B200",
        total_memory: 182_631 * MIB,
        compute_capability: (10, 0),
        source: "torch printout (182,631-182,642 MiB seen)",
    },
    Card {
        name: "MI300X",
        torch_name: "AMD Instinct MI300X",
        total_memory: 196_592 * MIB,
        compute_capability: (9, 4),
        source: "torch printout, ROCm (ROCm/ROCm #4203)",
    },
];

/// The table, smallest card first.
pub fn by_size() -> Vec<&'static Card> {
    let mut cards: Vec<&Card> = CARDS.iter().collect();
    cards.sort_by_key(|c| c.total_memory);
    cards
}

fn folded(name: &str) -> String {
    name.chars().filter(|c| !matches!(c, '-' | '_' | ' ')).flat_map(char::to_lowercase).collect()
}

/// The card named `name` (`H100-80GB`, `h100_80gb`, or torch's own name), or an error listing the names.
pub fn find(name: &str) -> Result<&'static Card, String> {
    let want = folded(name);
    CARDS.iter().find(|c| folded(c.name) == want || folded(c.torch_name) == want).ok_or_else(|| {
        let names: Vec<&str> = CARDS.iter().map(|c| c.name).collect();
        format!("no card '{name}' in the table: one of {} (`allocbench cards` lists them), or give --capacity SIZE", names.join(", "))
    })
}

/// The default card.
pub fn default_card() -> &'static Card {
    find(DEFAULT_CARD).expect("the default card is in the table")
}

/// The card of the table with exactly `bytes` of memory, if one has.
pub fn with_memory(bytes: u64) -> Option<&'static Card> {
    CARDS.iter().find(|c| c.total_memory == bytes)
}

/// The device as a sentence names it: "H100-80GB (79.2 GiB)", or "a 73.0 GiB device" for a raw size.
pub fn describe_capacity(bytes: u64) -> String {
    match with_memory(bytes) {
        Some(c) => format!("{} ({})", c.name, crate::units::format_bytes(bytes)),
        None => format!("{} device", crate::units::format_bytes(bytes)),
    }
}

/// The card as `allocbench` flags name it: `--card H100-80GB`, or `--capacity 61440MiB`.
pub fn flag_for(bytes: u64) -> String {
    match with_memory(bytes) {
        Some(c) => format!("--card {}", c.name),
        None if bytes.is_multiple_of(crate::units::MIB) => format!("--capacity {}MiB", bytes / crate::units::MIB),
        None => format!("--capacity {bytes}B"),
    }
}

/// "H100-80GB (79.2 GiB)", or "a 73.0 GiB device": a card in a sentence.
pub fn in_sentence(bytes: u64) -> String {
    match with_memory(bytes) {
        Some(_) => describe_capacity(bytes),
        None => format!("a {}", describe_capacity(bytes)),
    }
}

/// The table as Markdown (docs/cards.md embeds it; `allocbench cards --markdown`).
pub fn markdown_table() -> String {
    let mut s = String::from("| `--card` | torch's name | `total_memory` (bytes) | GiB | compute capability | source |\n|---|---|---:|---:|---|---|\n");
    for c in by_size() {
        s += &format!(
            "| `{}` | {} | {} | {:.1} | {}.{} | {} |\n",
            c.name,
            c.torch_name,
            c.total_memory,
            c.total_memory as f64 / (1u64 << 30) as f64,
            c.compute_capability.0,
            c.compute_capability.1,
            c.source
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_are_found_by_any_spelling_and_unknown_ones_list_the_names() {
        assert_eq!(find("h100_80gb").unwrap().total_memory, 85_017_493_504);
        assert_eq!(find("NVIDIA H100 80GB HBM3").unwrap().name, "H100-80GB");
        assert_eq!(find("a100-40GB").unwrap().torch_name, "NVIDIA A100-SXM4-40GB");
        let err = find("H300").unwrap_err();
        assert!(err.contains("no card 'H300'") && err.contains("A100-80GB") && err.contains("--capacity"), "{err}");
    }

    #[test]
    fn the_table_has_distinct_names_and_a_default() {
        assert!(by_size().windows(2).all(|w| w[0].total_memory <= w[1].total_memory), "smallest first");
        let mut names: Vec<String> = CARDS.iter().map(|c| folded(c.name)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CARDS.len());
        assert_eq!(default_card().name, DEFAULT_CARD);
        assert_eq!(describe_capacity(85_017_493_504), "H100-80GB (79.2 GiB)");
        assert_eq!(describe_capacity(73 << 30), "73.0 GiB device");
    }
}
