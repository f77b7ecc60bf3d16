//! A sharded job's traces, one per rank: `capture --nproc-per-node` writes `DIR/rank-R.csv` and
//! `DIR/ranks.json` (which rank has which trace; under `--ranks distinct`, which ranks had the
//! same role as another and were not captured on); replay, diagnose, advise and sweep plan read
//! the folder (docs/capture.md, "Sharded jobs").

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::InputError;

/// The manifest's name inside the folder.
pub const MANIFEST: &str = "ranks.json";

/// `DIR/ranks.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RankManifest {
    pub world_size: u32,
    pub nproc_per_node: u32,
    pub nnodes: u32,
    /// `all`, `distinct` or the list asked for.
    pub ranks_asked: String,
    pub ranks: Vec<RankEntry>,
}

/// One captured rank.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RankEntry {
    pub rank: u32,
    /// Its trace, relative to the folder (none when `same_as` holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// The earlier rank whose allocations this one's equalled through step 1 (`--ranks distinct`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_as: Option<u32>,
    /// The fingerprint of its alloc and free rows through step 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The capture's state (`complete`, `script_error`, ...).
    pub state: String,
}

impl RankManifest {
    /// Written whole after each rank, so a folder is readable while its capture goes on or after
    /// it stopped.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(MANIFEST);
        let text = serde_json::to_string_pretty(self)? + "\n";
        let tmp = dir.join(format!(".{MANIFEST}.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| InputError::new(path.display().to_string(), format!("cannot write: {e}")))?;
        Ok(())
    }
}

/// One trace of a folder and the ranks it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct RankTrace {
    pub rank: u32,
    pub path: PathBuf,
    /// The other ranks of the same role (their traces would be this one's).
    pub same_role: Vec<u32>,
}

impl RankTrace {
    /// Every rank the trace stands for, in order.
    pub fn ranks(&self) -> Vec<u32> {
        let mut all = vec![self.rank];
        all.extend(&self.same_role);
        all.sort_unstable();
        all
    }

    /// "rank 0" or "ranks 0, 1-7 (one role)".
    pub fn label(&self) -> String {
        if self.same_role.is_empty() {
            return format!("rank {}", self.rank);
        }
        format!("ranks {} (one role)", ranges(&self.ranks()))
    }
}

/// How a rank's run ranks against the others', least first: the first to run out of memory (the
/// earliest step, then the earliest event in it), else the most on the card. The rank that
/// decides a sharded job's verdict is the least.
pub fn worst_first(oom_step_event: Option<(u64, u64)>, on_card: u64) -> (bool, u64, u64, std::cmp::Reverse<u64>) {
    let (step, event) = oom_step_event.unwrap_or((0, 0));
    (oom_step_event.is_none(), step, event, std::cmp::Reverse(on_card))
}

/// "0-3, 5, 7-8".
pub fn ranges(ranks: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j == i { ranks[i].to_string() } else { format!("{}-{}", ranks[i], ranks[j]) });
        i = j + 1;
    }
    parts.join(", ")
}

/// The traces of a folder, by rank: from its `ranks.json`, else every `rank-R.*` file in it.
pub fn read_folder(dir: &Path) -> Result<Vec<RankTrace>, InputError> {
    let manifest = dir.join(MANIFEST);
    let mut traces: Vec<RankTrace> = Vec::new();
    if manifest.is_file() {
        let at = manifest.display().to_string();
        let text = std::fs::read_to_string(&manifest).map_err(|e| InputError::new(&at, format!("cannot read: {e}")))?;
        let m: RankManifest = serde_json::from_str(&text).map_err(|e| InputError::new(format!("{at}:{}", e.line()), format!("not a rank manifest: {e}")))?;
        for entry in m.ranks.iter().filter(|e| e.same_as.is_none()) {
            let Some(name) = &entry.trace else {
                return Err(InputError::new(&at, format!("rank {} has neither a trace nor a same_as", entry.rank)));
            };
            let path = dir.join(name);
            if !path.is_file() {
                return Err(InputError::new(&at, format!("rank {}'s trace {} is missing", entry.rank, path.display())));
            }
            traces.push(RankTrace { rank: entry.rank, path, same_role: Vec::new() });
        }
        for entry in m.ranks.iter() {
            let Some(of) = entry.same_as else { continue };
            let Some(t) = traces.iter_mut().find(|t| t.rank == of) else {
                return Err(InputError::new(&at, format!("rank {} is the same as rank {of}, which has no trace", entry.rank)));
            };
            t.same_role.push(entry.rank);
        }
    } else {
        let listing = std::fs::read_dir(dir).map_err(|e| InputError::new(dir.display().to_string(), format!("cannot read the folder: {e}")))?;
        for entry in listing.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rank) = name.strip_prefix("rank-").and_then(|r| r.split('.').next()).and_then(|r| r.parse::<u32>().ok()) else { continue };
            if entry.path().is_file() && !name.ends_with(".tmp") {
                if let Some(other) = traces.iter().find(|t| t.rank == rank) {
                    return Err(InputError::new(
                        dir.display().to_string(),
                        format!("two traces for rank {rank}: {} and {name}", other.path.file_name().unwrap_or_default().to_string_lossy()),
                    ));
                }
                traces.push(RankTrace { rank, path: entry.path(), same_role: Vec::new() });
            }
        }
    }
    if traces.is_empty() {
        return Err(InputError::new(
            dir.display().to_string(),
            "a folder with no rank-R traces: give one trace, or the folder `allocbench capture --nproc-per-node N -o DIR` wrote",
        ));
    }
    traces.sort_by_key(|t| t.rank);
    Ok(traces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_join_consecutive_ranks() {
        assert_eq!(ranges(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(ranges(&[4]), "4");
    }

    #[test]
    fn a_folder_reads_from_its_manifest_or_its_rank_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rank-0.csv"), "op,id,bytes,stream\n").unwrap();
        std::fs::write(dir.path().join("rank-3.csv"), "op,id,bytes,stream\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        let listed = read_folder(dir.path()).unwrap();
        assert_eq!(listed.iter().map(|t| t.rank).collect::<Vec<_>>(), [0, 3]);
        let m = RankManifest {
            world_size: 4,
            nproc_per_node: 4,
            nnodes: 1,
            ranks_asked: "distinct".into(),
            ranks: vec![
                RankEntry { rank: 0, trace: Some("rank-0.csv".into()), role: Some("ab".into()), state: "complete".into(), ..Default::default() },
                RankEntry { rank: 1, same_as: Some(0), state: "complete".into(), ..Default::default() },
                RankEntry { rank: 2, same_as: Some(0), state: "complete".into(), ..Default::default() },
                RankEntry { rank: 3, trace: Some("rank-3.csv".into()), role: Some("cd".into()), state: "complete".into(), ..Default::default() },
            ],
        };
        m.write(dir.path()).unwrap();
        let read = read_folder(dir.path()).unwrap();
        assert_eq!(read[0].same_role, [1, 2]);
        assert_eq!(read[0].label(), "ranks 0-2 (one role)");
        assert_eq!(read[1].label(), "rank 3");
        // A manifest naming a trace that is not there, or a rank of the same role as nothing.
        std::fs::remove_file(dir.path().join("rank-3.csv")).unwrap();
        let e = read_folder(dir.path()).unwrap_err().to_string();
        assert!(e.contains("ranks.json") && e.contains("rank 3's trace"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        assert!(read_folder(empty.path()).unwrap_err().to_string().contains("no rank-R traces"));
        std::fs::write(dir.path().join(MANIFEST), "{\"world_size\": 2,\n \"ranks\": [}").unwrap();
        assert!(read_folder(dir.path()).unwrap_err().to_string().contains("ranks.json:2"));
    }
}
