//! The diagnosis section (`diagnose` records): `allocbench diagnose`'s summary, its first line a
//! finding.

use std::fmt::Write as _;
use std::path::Path;

use super::Section;
use crate::results::ResultRecord;
use crate::units::format_bytes;

pub fn section(records: &[ResultRecord], _out: &Path) -> anyhow::Result<Option<Section>> {
    let mut sec = Section::new("Diagnosis");
    for r in records {
        if let ResultRecord::Diagnose(d) = r {
            let conf = if d.conf.is_empty() { "default conf" } else { &d.conf };
            let _ = writeln!(sec.body, "#### {} on {} [{conf}]\n", d.workload.name, format_bytes(d.capacity));
            for line in &d.summary {
                let _ = writeln!(sec.body, "- {line}");
            }
            sec.body.push('\n');
            if let Some(first) = d.summary.first() {
                sec.findings.push(format!("{} on {} [{conf}]: {first}", d.workload.name, format_bytes(d.capacity)));
            }
        }
    }
    Ok((!sec.body.is_empty()).then_some(sec))
}
