//! `allocbench trace`: a workload's (or trace's) events as a CSV trace.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;

use super::output;
use crate::event::Event;
use crate::input::Source;
use crate::trace::TraceWriter;

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A workload (.toml), trace (.csv), RMM log (.csv) or PyTorch snapshot (.pickle or .json).
    pub input: PathBuf,
    #[command(flatten)]
    pub snapshot: super::args::SnapshotDeviceArg,
    /// Output CSV file (a .gz name is gzip-compressed; '-' = standard output).
    #[arg(short, long, default_value = "-")]
    pub output: String,
}

pub fn main(a: &TraceArgs) -> anyhow::Result<()> {
    output::check_outputs(&[Some(Path::new(&a.output))], &[Some(&a.input)])?;
    let source = a.snapshot.open(&a.input)?;
    let info = source.info()?;
    let mut comments = vec![
        "allocbench trace v1".to_string(),
        format!("source: {} ({}), sha256 {}", info.origin, info.kind, info.sha256),
        format!("workload: {}{}", info.name, if info.description.is_empty() { String::new() } else { format!(" - {}", info.description) }),
    ];
    // A capture's copy keeps what its readers look for: the header (a capture, from which script)
    // and the closing lines (complete or not, the script's own allocator settings).
    let capture = source.capture_comments();
    let closing = match capture {
        Some((header, closing)) => {
            comments.extend(header);
            closing
        }
        None => Vec::new(),
    };
    let out = output::open(&a.output)?;
    let n = if crate::trace::csv::is_gzip_name(Path::new(&a.output)) {
        let gz = flate2::write::GzEncoder::new(out, flate2::Compression::best());
        let (n, gz) = write_trace(&source, gz, &comments, &closing)?;
        gz.finish()?.flush()?;
        n
    } else {
        write_trace(&source, out, &comments, &closing)?.0
    };
    if a.output != "-" {
        eprintln!("wrote {n} events to {}", a.output);
    }
    let addresses = source.address_script().len();
    if addresses > 0 {
        // A CSV trace has no column for them: a replay of the CSV places segments itself.
        eprintln!(
            "note: the CSV does not keep the {addresses} cudaMalloc address{} the input recorded; where equal-size blocks tie for best fit, a replay of the CSV may differ from one of {} (replay that to keep them)",
            if addresses == 1 { "" } else { "es" },
            a.input.display()
        );
    }
    Ok(())
}

/// Writes every event of `source` as a v1 trace, with the allocation sites it records (`#site`
/// and `#at` lines, numbered anew in order of first use); returns the count and the flushed writer.
fn write_trace<W: Write>(source: &Source, out: W, comments: &[String], closing: &[String]) -> anyhow::Result<(u64, W)> {
    let sites = source.sites()?;
    let mut w = TraceWriter::new(out, comments)?;
    let mut renumbered: FxHashMap<u32, u32> = FxHashMap::default();
    let mut current = None;
    let mut n = 0u64;
    for ev in source.events()? {
        let ev = ev?;
        if let (Event::Alloc { id, .. }, Some(sites)) = (&ev, &sites) {
            current = match sites.of_id.get(id) {
                Some(&site) => {
                    let next = renumbered.len() as u32;
                    Some(match renumbered.entry(site) {
                        Entry::Vacant(e) => {
                            w.site(Some(next), Some(&sites.definition(site)))?;
                            *e.insert(next)
                        }
                        Entry::Occupied(e) => {
                            if current != Some(*e.get()) {
                                w.site(Some(*e.get()), None)?;
                            }
                            *e.get()
                        }
                    })
                }
                None => {
                    if current.is_some() {
                        w.site(None, None)?;
                    }
                    None
                }
            };
        }
        w.write(&ev)?;
        n += 1;
    }
    for c in closing {
        w.comment(c)?;
    }
    Ok((n, w.finish()?))
}
