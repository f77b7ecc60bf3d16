//! Numbers in the README and docs/ are produced, not typed: the README's demo table is what
//! `allocbench demo` prints (rewritten by `scripts/readme_demo.py`), its quick-start output what
//! `allocbench diagnose` prints (`scripts/readme_quickstart.py`), its findings are the published
//! report's (copied by `scripts/readme_findings.py`), and docs/capture.md's blind-spot table is
//! what `scripts/blind_spots.py` prints. Every relative link of the README, CONTRIBUTING.md and
//! docs/ resolves, and the README stays short.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text between `begin` (a marker's start) and `end` in `text`.
fn block<'a>(text: &'a str, begin: &str, end: &str, what: &str) -> &'a str {
    let b = text.find(begin).unwrap_or_else(|| panic!("{what} has no {begin}"));
    let e = text[b..].find(end).unwrap_or_else(|| panic!("{what} has no {end}"));
    &text[b..b + e]
}

#[test]
fn readme_demo_table_is_what_the_demo_prints() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("demo.jsonl");
    let out = Command::cargo_bin("allocbench").unwrap().current_dir(dir.path()).args(["demo", "--jsonl", jsonl.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let table = stdout.split("\n\n").nth(1).expect("the demo prints its table after a blank line").trim_matches('\n');
    assert!(table.lines().count() >= 7, "a header and a row per allocator x conf: {table}");
    let readme = read("README.md");
    assert!(
        block(&readme, "<!-- demo:begin", "<!-- demo:end -->", "README").contains(&format!("```\n{table}\n```")),
        "README's demo table is stale: run `python3 scripts/readme_demo.py`\n--- demo prints ---\n{table}"
    );
}

#[test]
fn readme_findings_are_the_published_reports() {
    let report = read("reports/comparison/README.md");
    let after = report.split("## Findings\n").nth(1).expect("the report opens with its findings");
    let listed: Vec<&str> = after.lines().take_while(|l| !l.starts_with("## ")).filter(|l| l.starts_with("- ")).collect();
    assert!(listed.len() >= 4, "findings for the GPU and CPU workloads: {listed:?}");
    let readme = read("README.md");
    let found: Vec<&str> = block(&readme, "<!-- findings:begin", "<!-- findings:end -->", "README").lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(found, listed, "README's findings are stale: run `python3 scripts/readme_findings.py`");
}

#[test]
fn readme_quickstart_output_is_what_diagnose_prints() {
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .current_dir(root())
        .args(["diagnose", "workloads/captured/gpt3-xl-1.3b.csv.gz", "--capacity", "73GiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let printed = printed.trim_matches('\n');
    assert!(printed.lines().count() >= 5, "diagnose says what happened, why, and the smallest device: {printed}");
    let readme = read("README.md");
    let quick = block(&readme, "<!-- quickstart:begin", "<!-- quickstart:end -->", "README");
    assert!(
        quick.contains(&format!("```\n{printed}\n```")),
        "README's quick-start output is stale: run `python3 scripts/readme_quickstart.py`\n--- diagnose prints ---\n{printed}"
    );
    // The capture shown is the one scripts/capture_workloads.sh makes of the shipped trace.
    let script = read("scripts/capture_workloads.sh");
    let args = script.lines().find_map(|l| l.trim().strip_prefix("gpt3-xl-1.3b) args=(")).expect("capture_workloads.sh captures gpt3-xl-1.3b");
    let args = args.strip_suffix(") ;;").expect("one line of arguments");
    assert!(
        quick.contains(&format!("-- scripts/models/train.py {args}\n")),
        "README's capture command is not scripts/capture_workloads.sh's: run `python3 scripts/readme_quickstart.py`"
    );
}

#[test]
fn capture_blind_spot_table_is_what_the_script_prints() {
    let out = match std::process::Command::new("python3").arg(root().join("scripts/blind_spots.py")).output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: no python3 to run scripts/blind_spots.py ({e})");
            return;
        }
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let doc = read("docs/capture.md");
    let table = block(&doc, "<!-- blind-spots:begin", "<!-- blind-spots:end -->", "docs/capture.md");
    let table = table.split_once('\n').expect("the marker is a line of its own").1;
    assert_eq!(table.trim_end(), printed.trim_end(), "docs/capture.md's blind-spot table is stale: run `python3 scripts/blind_spots.py --write`");
}

/// Each generated block sits in the file its script rewrites (a block moved without its script
/// would make the script fail, or rewrite nothing).
#[test]
fn generated_blocks_are_where_their_scripts_write_them() {
    let blocks = [
        ("README.md", "scripts/readme_demo.py", "<!-- demo:begin (scripts/readme_demo.py) -->"),
        ("README.md", "scripts/readme_quickstart.py", "<!-- quickstart:begin (scripts/readme_quickstart.py) -->"),
        ("README.md", "scripts/readme_findings.py", "<!-- findings:begin (scripts/readme_findings.py) -->"),
        ("docs/benchmarks.md", "scripts/bench_readme.py", "<!-- bench:begin (scripts/bench_readme.py) -->"),
        ("docs/sweeps.md", "scripts/sweep_example.sh", "<!-- sweep:begin (scripts/sweep_example.sh) -->"),
        ("docs/capture.md", "scripts/blind_spots.py", "<!-- blind-spots:begin (scripts/blind_spots.py) -->"),
    ];
    for (file, script, begin) in blocks {
        assert!(read(file).contains(begin), "{file} has no {begin}");
        let source = read(script);
        assert!(source.contains(begin), "{script} writes another marker than {begin}");
        let parts: Vec<&str> = file.split('/').collect();
        let named = match parts.as_slice() {
            [name] => format!("\"{name}\""),
            [dir, name] => format!("\"{dir}\", \"{name}\""),
            _ => unreachable!(),
        };
        assert!(source.contains(&named), "{script} does not write {file} (no {named} in it)");
    }
}

/// docs/cards.md's table is what `allocbench cards --markdown` prints (the card table in code).
#[test]
fn the_card_table_in_the_docs_is_the_codes() {
    let out = Command::cargo_bin("allocbench").unwrap().args(["cards", "--markdown"]).output().unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let doc = read("docs/cards.md");
    let table = block(&doc, "<!-- cards:begin", "<!-- cards:end -->", "docs/cards.md");
    assert!(table.contains(&printed), "docs/cards.md's card table is stale: paste `allocbench cards --markdown` between its markers\n{printed}");
    assert!(printed.contains("| `H100-80GB` | NVIDIA H100 80GB HBM3 | 85017493504 |"), "{printed}");
}

#[test]
fn readme_stays_short() {
    let lines = read("README.md").lines().count();
    assert!(lines <= 200, "README.md has {lines} lines: at most 200; move the detail into docs/");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped but `-` and `_`, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A markdown file's lines outside code fences (a fence's own lines left out too).
fn unfenced_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors of a markdown file's headings (outside code fences), numbered as GitHub numbers
/// repeated ones.
fn anchors(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for line in unfenced_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut anchor = base.clone();
            let mut n = 0;
            while out.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            out.insert(anchor);
        }
    }
    out
}

/// The targets of the inline links and images of a markdown file, outside code fences and spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in unfenced_lines(text) {
        let mut in_code = false;
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '`' {
                in_code = !in_code;
            } else if !in_code && chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
                let rest: String = chars[i + 2..].iter().collect();
                if let Some(end) = rest.find(')') {
                    out.push(rest[..end].to_string());
                }
            }
            i += 1;
        }
    }
    out
}

#[test]
fn relative_links_resolve() {
    let mut files: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md"].iter().map(|f| root().join(f)).collect();
    let mut docs: Vec<PathBuf> =
        std::fs::read_dir(root().join("docs")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect();
    docs.sort();
    files.extend(docs);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target: PathBuf = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let is_md = target.extension().is_some_and(|e| e == "md");
                if !is_md || !anchors(&std::fs::read_to_string(&target).unwrap()).contains(anchor) {
                    broken.push(format!("{}: {link} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken relative links:\n{}", broken.join("\n"));
    assert!(files.iter().any(|f| f.ends_with(Path::new("docs/README.md"))), "docs/ has its index");
}
