//! Numbers in the README and docs/ are produced, not typed: the README's demo table is what
//! `allocbench demo` prints (rewritten by `scripts/readme_demo.py`), its quick-start output what
//! `allocbench diagnose` prints (`scripts/readme_quickstart.py`), its findings are the published
//! report's (copied by `scripts/readme_findings.py`), and docs/capture.md's blind-spot table is
//! what `scripts/blind_spots.py` prints. The README stays short.

use std::path::PathBuf;

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

#[test]
fn readme_stays_short() {
    let lines = read("README.md").lines().count();
    assert!(lines <= 200, "README.md has {lines} lines: at most 200; move the detail into docs/");
}
