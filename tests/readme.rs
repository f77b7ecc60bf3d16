//! Numbers in the README are produced, not typed: its demo table is what `allocbench demo` prints
//! (rewritten by `scripts/readme_demo.py`), its findings are the published report's (copied by
//! `scripts/readme_findings.py`).

use assert_cmd::Command;

#[test]
fn readme_demo_table_is_what_the_demo_prints() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("demo.jsonl");
    let out = Command::cargo_bin("allocbench").unwrap().current_dir(dir.path()).args(["demo", "--jsonl", jsonl.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let table = stdout.split("\n\n").nth(1).expect("the demo prints its table after a blank line").trim_matches('\n');
    assert!(table.lines().count() >= 7, "a header and a row per allocator x conf: {table}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let begin = readme.find("<!-- demo:begin").expect("README has the demo block");
    let end = readme.find("<!-- demo:end -->").expect("README has the demo block's end");
    assert!(
        readme[begin..end].contains(&format!("```\n{table}\n```")),
        "README's demo table is stale: run `python3 scripts/readme_demo.py`\n--- demo prints ---\n{table}"
    );
}

#[test]
fn readme_findings_are_the_published_reports() {
    let root = env!("CARGO_MANIFEST_DIR");
    let report = std::fs::read_to_string(format!("{root}/reports/comparison/README.md")).unwrap();
    let after = report.split("## Findings\n").nth(1).expect("the report opens with its findings");
    let listed: Vec<&str> = after.lines().take_while(|l| !l.starts_with("## ")).filter(|l| l.starts_with("- ")).collect();
    assert!(listed.len() >= 4, "findings for the GPU and CPU workloads: {listed:?}");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let begin = readme.find("<!-- findings:begin").expect("README has the findings block");
    let end = readme.find("<!-- findings:end -->").expect("README has the findings block's end");
    let block: Vec<&str> = readme[begin..end].lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(block, listed, "README's findings are stale: run `python3 scripts/readme_findings.py`");
}
