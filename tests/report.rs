//! Reports: SVGs are XML with the expected series, rendering is deterministic, and results of
//! another schema version are refused with a clear error.

use std::path::{Path, PathBuf};

use allocbench::report;

fn fixture() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/results-small.jsonl"))
}

/// Renders the fixture's report into `dir`, every page of which must reach no network.
fn render(dir: &Path) -> Vec<String> {
    let records = report::load(&[fixture()]).unwrap();
    let files = report::render(&records, dir, "fixture report").unwrap().into_iter().map(|c| c.file).collect();
    assert_no_network(dir);
    files
}

#[test]
fn svgs_parse_and_name_their_series() {
    let dir = tempfile::tempdir().unwrap();
    let files = render(dir.path());
    for want in [
        "gpu-memory-model-switch.svg",
        "gpu-overhead.svg",
        "gpu-device-calls-model-switch.svg",
        "cpu-rss-python-objects.svg",
        "cpu-throughput-python-objects.svg",
        "cpu-drift-retained-python-objects.svg",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} missing from {files:?}");
    }
    assert!(files.iter().any(|f| f.starts_with("gpu-segments-model-switch-pytorch")), "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{f} is not XML: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<String> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text().map(str::to_string)).collect();
        assert!(!texts.is_empty(), "{f} has no text");
        let has = |s: &str| texts.iter().any(|t| t.contains(s));
        match f.as_str() {
            "gpu-memory-model-switch.svg" => {
                assert!(has("reserved: pytorch") && has("reserved: pytorch expandable_segments:True") && has("reserved: ideal"), "{texts:?}");
                assert!(has("allocated (live tensors)") && has("memory (GiB)") && has("step"), "{texts:?}");
            }
            "gpu-memory-pinned.svg" => assert!(has("OOM"), "the OOM point is marked: {texts:?}"),
            "cpu-rss-python-objects.svg" => assert!(has("glibc") && has("mimalloc") && has("time (s)") && has("RSS (MiB)"), "{texts:?}"),
            "cpu-throughput-python-objects.svg" => {
                assert!(has("M ops/s") && has("ns"), "{texts:?}")
            }
            "gpu-overhead.svg" => assert!(has("ideal = 1.0") && has("pytorch default") && has("expandable"), "{texts:?}"),
            _ => {}
        }
    }
    let index = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
    for f in &files {
        assert!(index.contains(&format!("]({f})")), "index embeds {f}");
    }
    assert!(index.contains("#### model-switch") && index.contains("| `pytorch expandable_segments:True` | 1 |"), "{index}");
    assert!(index.contains("/lib/x86_64-linux-gnu/libc.so.6") || index.contains("libc.so"), "the live malloc is named");
    roxmltree::Document::parse(&std::fs::read_to_string(dir.path().join("index.html")).unwrap().replace("<!DOCTYPE html>", ""))
        .expect("index.html is well-formed");
}

#[test]
fn rendering_is_byte_identical_twice() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = render(a.path());
    assert_eq!(files, render(b.path()));
    for f in files.iter().map(String::as_str).chain(["README.md", "index.html"]) {
        assert_eq!(std::fs::read(a.path().join(f)).unwrap(), std::fs::read(b.path().join(f)).unwrap(), "{f} differs");
    }
}

#[test]
fn a_file_named_twice_is_read_once() {
    // By its own name, another spelling and a link: still one file, its runs counted once.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(fixture(), &link).unwrap();
    let respelled = fixture().parent().unwrap().join("../fixtures/results-small.jsonl");
    let once = report::load(&[fixture()]).unwrap();
    let named_thrice = report::load(&[fixture(), respelled, link]).unwrap();
    assert!(once.len() > 1);
    assert_eq!(named_thrice.len(), once.len());
    // Two files with the same content are two sets of runs.
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(fixture(), &copy).unwrap();
    assert_eq!(report::load(&[fixture(), copy]).unwrap().len(), 2 * once.len());
}

#[test]
fn other_schema_versions_and_broken_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture()).unwrap();
    let old = dir.path().join("old.jsonl");
    std::fs::write(&old, text.replacen("\"schema_version\":1", "\"schema_version\":0", 1)).unwrap();
    let e = report::load(&[old]).unwrap_err().to_string();
    assert!(e.contains("old.jsonl:1: results schema version 0"), "{e}");
    let broken = dir.path().join("broken.jsonl");
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1] = "{\"schema_version\": 1, \"type\": \"gpu_replay\"";
    std::fs::write(&broken, lines.join("\n")).unwrap();
    let e = report::load(&[broken]).unwrap_err().to_string();
    assert!(e.contains("broken.jsonl:2"), "{e}");
    let foreign = dir.path().join("foreign.json");
    std::fs::write(&foreign, "{\"hello\": 1}").unwrap();
    assert!(report::load(&[foreign]).unwrap_err().to_string().contains("not an allocbench results record"));
    let out = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args(["report", dir.path().join("old.jsonl").to_str().unwrap(), "-o", dir.path().join("r").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The fixture's records with `edit` applied to each (as JSON), written to a results file.
fn edited_fixture(dir: &Path, name: &str, edit: impl Fn(&mut serde_json::Value) -> Vec<serde_json::Value>) -> PathBuf {
    let text = std::fs::read_to_string(fixture()).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        for rec in edit(&mut v) {
            out += &rec.to_string();
            out.push('\n');
        }
    }
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    path
}

fn bytes(v: &serde_json::Value) -> String {
    allocbench::units::format_bytes(v.as_u64().unwrap())
}

/// A run stopped by an OOM saw live bytes only up to it: the table's heading gives the workload's
/// peak live, the most any of its runs saw.
#[test]
fn a_tables_peak_live_is_the_workloads_not_an_oomed_runs() {
    let dir = tempfile::tempdir().unwrap();
    let results = edited_fixture(dir.path(), "stopped.jsonl", |v| {
        if v["type"] == "gpu_replay" && v["workload"]["name"] == "model-switch" && v["conf"] == "" && v["allocator"] == "pytorch" {
            v["work"]["peak_live_bytes"] = serde_json::json!(1u64 << 30);
        }
        vec![v.clone()]
    });
    let records = report::load(&[results]).unwrap();
    report::render(&records, &dir.path().join("r"), "stopped").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let heading = md.lines().skip_while(|l| *l != "#### model-switch").nth(2).unwrap();
    assert!(heading.ends_with(&format!("peak live {}.", allocbench::units::format_bytes(14_780_630_912))), "{heading}");
}

#[test]
fn findings_come_first_with_numbers_from_the_results() {
    let dir = tempfile::tempdir().unwrap();
    render(dir.path());
    let md = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
    // What to set leads (one line per family of workloads), then the findings.
    assert!(
        md.starts_with("# fixture report\n\n## What to set\n\n- **Model switching** (model-switch): set `expandable_segments:True`: peak reserved "),
        "{md}"
    );
    let findings: Vec<&str> = md.lines().skip_while(|l| *l != "## Findings").skip(2).take_while(|l| l.starts_with("- ")).collect();
    // The numbers of the sentence are the records': defaults and expandable segments on model-switch.
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(fixture()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let run = |conf: &str| recs.iter().find(|r| r["workload"]["name"] == "model-switch" && r["allocator"] == "pytorch" && r["conf"] == conf).unwrap();
    let (base, best) = (run(""), run("expandable_segments:True"));
    let cut = 1.0 - best["summary"]["peak_reserved"].as_f64().unwrap() / base["summary"]["peak_reserved"].as_f64().unwrap();
    let want = format!(
        "- model-switch: `expandable_segments:True` cuts peak reserved most, {} → {} (−{:.1} %",
        bytes(&base["summary"]["peak_reserved"]),
        bytes(&best["summary"]["peak_reserved"]),
        100.0 * cut
    );
    assert!(findings.iter().any(|f| f.starts_with(&want)), "{want}\n{findings:#?}");
    let mallocs = format!("at {} device mallocs instead of {}", best["summary"]["device_mallocs"], base["summary"]["device_mallocs"]);
    assert!(findings.iter().any(|f| f.contains(&mallocs)), "{mallocs}\n{findings:#?}");
    // The OOM of the 'pinned' scenario is a finding too, with its step and cause.
    let pinned = recs.iter().find(|r| r["workload"]["name"] == "pinned").unwrap();
    let oom = format!("out of memory with PyTorch's defaults at step {} ({}", pinned["oom"]["step"], pinned["oom"]["cause"].as_str().unwrap());
    assert!(findings.iter().any(|f| f.starts_with("- pinned on ") && f.contains(&oom)), "{oom}\n{findings:#?}");
    assert!(findings.iter().any(|f| f.contains("python-objects: ") && f.contains("is fastest")), "{findings:#?}");
    // The HTML opens with the same list.
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    let list = &html[html.find("<ul id=\"findings\">").expect("an id=findings list")..];
    assert_eq!(list[..list.find("</ul>").unwrap()].matches("<li>").count(), findings.len());
    assert!(html.find("id=\"findings\"").unwrap() < html.find("<table>").unwrap(), "findings before the tables");
}

#[test]
fn repetitions_fold_into_one_row_with_a_95_percent_ci() {
    let dir = tempfile::tempdir().unwrap();
    // Three runs of each CPU allocator: ops/s 10, 11 and 12 M (mean 11, CI half-width
    // t(0.975, 2)·1/√3 = 2.48), glibc's three times slower.
    let results = edited_fixture(dir.path(), "reps.jsonl", |v| {
        if v["type"] != "cpu_run" {
            return vec![v.clone()];
        }
        let slow = if v["allocator"] == "glibc" { 3.0 } else { 1.0 };
        [10e6, 11e6, 12e6]
            .iter()
            .map(|ops| {
                let mut r = v.clone();
                r["ops_per_s"] = serde_json::json!(ops / slow);
                r
            })
            .collect()
    });
    let records = report::load(&[results]).unwrap();
    report::render(&records, &dir.path().join("r"), "reps").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| mimalloc |")).collect();
    assert_eq!(rows.len(), 1, "one row for three runs: {rows:?}");
    assert!(rows[0].contains("| 3 | 11.00 ± 2.48 | +200.0 % |"), "{}", rows[0]);
    assert!(md.lines().any(|l| l.starts_with("| glibc |") && l.contains("| 3 | 3.67 ± 0.83 | baseline |")), "{md}");
    let finding = md.lines().find(|l| l.contains("is fastest")).unwrap();
    assert!(finding.contains("mimalloc is fastest, 11.00 ± 2.48 M ops/s (95 % CI over 3 runs), 3.00× glibc (3.67 ± 0.83 M ops/s)"), "{finding}");
    // The spread is drawn as whiskers in the throughput chart.
    let svg = std::fs::read_to_string(dir.path().join("r/cpu-throughput-python-objects.svg")).unwrap();
    let whiskers = |svg: &str| svg.matches("stroke=\"#000000\" stroke-width=\"2\"").count();
    assert_eq!(whiskers(&svg), 4, "a whisker per allocator in each of the two panels");
    // The RSS chart draws every run and names each allocator once in its legend.
    let rss = std::fs::read_to_string(dir.path().join("r/cpu-rss-python-objects.svg")).unwrap();
    let doc = roxmltree::Document::parse(&rss).unwrap();
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).map(str::trim).collect();
    assert_eq!(texts.iter().filter(|t| **t == "mimalloc (3 runs, the first solid)").count(), 1, "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains("(run ")), "{texts:?}");
    let entries: Vec<&&str> = texts.iter().filter(|t| t.ends_with("(3 runs, the first solid)")).collect();
    assert!(entries.len() >= 2 && entries.iter().all(|e| entries.iter().filter(|o| o == &e).count() == 1), "one entry per allocator: {entries:?}");
    render(&dir.path().join("single"));
    assert_eq!(whiskers(&std::fs::read_to_string(dir.path().join("single/cpu-throughput-python-objects.svg")).unwrap()), 0, "one run: no whisker");
}

#[test]
fn charts_are_inline_and_memory_views_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let files = render(dir.path());
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    let xml = html.replace("<!DOCTYPE html>", "");
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let inline_svgs = doc.descendants().filter(|n| n.has_tag_name("figure")).filter(|f| f.descendants().any(|n| n.tag_name().name() == "svg")).count();
    // Every chart inline, the key chart twice (beside the decision, and in its section).
    assert_eq!(inline_svgs, files.len() + 1, "every chart inline");
    for view in ["memory-model-switch.html", "memory-pinned.html"] {
        assert!(html.contains(&format!("href=\"{view}\"")), "index links {view}");
        let page = std::fs::read_to_string(dir.path().join(view)).unwrap();
        assert_eq!(remote_references(&page), Vec::<String>::new(), "{view}: no network");
        let data = &page[page.find("id=\"data\">").unwrap() + 10..];
        let data: serde_json::Value = serde_json::from_str(&data[..data.find("</script>").unwrap()]).unwrap();
        let runs = data["runs"].as_array().unwrap();
        assert!(!runs.is_empty() && runs.iter().all(|r| !r["timeline"].as_array().unwrap().is_empty()), "{view}");
        if view == "memory-pinned.html" {
            // The fixture's record predates `segments_at_oom`: the peak's map, the OOM marked.
            assert_eq!((runs[0]["at"].as_str(), runs[0]["oom"]["cause"].as_str()), (Some("peak"), Some("fragmentation")));
            assert_eq!(runs[0]["oom"]["x"], 8, "the OOM's event (a run of 2 steps is drawn over events)");
        }
    }
}

/// Namespace names: identifiers that are never fetched (`createElementNS`'s first argument).
const NAMESPACES: [&str; 6] = [
    "http://www.w3.org/2000/svg",
    "http://www.w3.org/1999/xlink",
    "http://www.w3.org/1999/xhtml",
    "http://www.w3.org/1998/Math/MathML",
    "http://www.w3.org/XML/1998/namespace",
    "http://www.w3.org/2000/xmlns/",
];

/// The remote URLs in `code` (an attribute's value, a script or a style sheet): every
/// `scheme://` but `file://` (`http`, `https`, `ws`, … in any case) except a namespace name
/// standing alone as a string literal, and every protocol-relative `//host` that starts a value,
/// a string literal or a `url(...)` (so `fetch('//cdn…')`, `import "//…"`, `url(//…)`,
/// `@import '//…'`, and in a value a `srcset` candidate; a `// comment` in a script starts none
/// of them). Each is returned with up to 40 bytes of what precedes it on its line.
fn remote_urls_in(code: &str, whole_value: bool) -> Vec<String> {
    let lower = code.to_ascii_lowercase();
    let b = lower.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = lower[i..].find("//").map(|k| k + i) {
        i = at + 2;
        let scheme = (at > 0 && b[at - 1] == b':').then(|| {
            let from = lower[..at - 1].rfind(|c: char| !(c.is_ascii_alphanumeric() || "+.-".contains(c))).map_or(0, |k| k + 1);
            &lower[from..at - 1]
        });
        let scheme = scheme.filter(|s| s.starts_with(|c: char| c.is_ascii_alphabetic()));
        let start = at - scheme.map_or(0, |s| s.len() + 1);
        let end = lower[start..].find(|c: char| c.is_whitespace() || "\"'`)<>;,".contains(c)).map_or(lower.len(), |k| k + start);
        let before = lower[..start].trim_end_matches([' ', '\t']);
        let remote = match scheme {
            Some("file") => false,
            // A namespace name alone in quotes: `var NS = "http://www.w3.org/2000/svg";`.
            Some(_) => !(NAMESPACES.contains(&&code[start..end]) && start > 0 && b"\"'`".contains(&b[start - 1]) && b.get(end) == Some(&b[start - 1])),
            None => {
                let opens: &[u8] = if whole_value { b"\"'`(," } else { b"\"'`(" };
                b.get(at + 2).is_some_and(|c| c.is_ascii_alphanumeric())
                    && ((whole_value && before.is_empty()) || before.as_bytes().last().is_some_and(|c| opens.contains(c)) || before.ends_with("@import"))
            }
        };
        if remote {
            let mut from = code[..start].rfind('\n').map_or(0, |k| k + 1).max(start.saturating_sub(40));
            while !code.is_char_boundary(from) {
                from += 1;
            }
            found.push(code[from..end].trim().to_string());
        }
    }
    found
}

/// Every reference in a rendered page (HTML, SVG, or Markdown) that would make a browser reach
/// the network: a remote URL ([`remote_urls_in`]) in any attribute's value (`src`, `href`,
/// `xlink:href`, `srcset`, `style`'s `url(...)`, an `on…` handler), in a `<script>` (`fetch`,
/// `import`, `new Worker`, …) or a `<style>` (`url(...)`, `@import`), or a Markdown link or
/// image. Namespace declarations (`xmlns`, `xmlns:*`) are identifiers, not fetches, and are
/// skipped; so are a `<script type="application/json">`'s data (never run), comments and the
/// text of the page (words a reader sees, not a reference).
fn remote_references(page: &str) -> Vec<String> {
    let mut found = Vec::new();
    let lower = page.to_ascii_lowercase();
    // Markdown links and images: `[text](URL)`, `![alt](URL)`.
    for (at, _) in page.match_indices("](") {
        found.extend(remote_urls_in(&page[at + 2..at + 2 + page[at + 2..].find([')', '\n']).unwrap_or(page.len() - at - 2)], true));
    }
    let mut i = 0;
    while let Some(lt) = page[i..].find('<').map(|k| k + i) {
        let rest = &page[lt..];
        if rest.starts_with("<!--") {
            i = lt + rest.find("-->").map_or(rest.len(), |k| k + 3);
            continue;
        }
        if rest.starts_with("<![CDATA[") {
            // Outside a script or style: text.
            i = lt + rest.find("]]>").map_or(rest.len(), |k| k + 3);
            continue;
        }
        let name_len = rest[1..].find(|c: char| !(c.is_ascii_alphanumeric() || c == ':' || c == '-')).map_or(rest.len() - 1, |k| k);
        if name_len == 0 || !rest.as_bytes()[1].is_ascii_alphabetic() {
            // `</tag>`, `<!DOCTYPE …>`, `<?xml …?>` (the declarations' identifiers are checked as
            // attribute values would be) or a `<` in text.
            if rest.starts_with("<!") || rest.starts_with("<?") {
                let end = rest.find('>').map_or(rest.len(), |k| k + 1);
                found.extend(remote_urls_in(&rest[..end], false));
                i = lt + end;
            } else {
                i = lt + 1;
            }
            continue;
        }
        let tag = lower[lt + 1..lt + 1 + name_len].to_string();
        // The attributes, to the tag's `>` (not one inside a quoted value).
        let mut j = lt + 1 + name_len;
        let bytes = page.as_bytes();
        let mut attributes = Vec::new();
        loop {
            while j < page.len() && (bytes[j].is_ascii_whitespace() || bytes[j] == b'/') {
                j += 1;
            }
            if j >= page.len() || bytes[j] == b'>' {
                j += 1;
                break;
            }
            let name_end = page[j..].find(|c: char| c.is_whitespace() || c == '=' || c == '>' || c == '/').map_or(page.len(), |k| k + j);
            let name = lower[j..name_end].to_string();
            j = name_end;
            while j < page.len() && bytes[j].is_ascii_whitespace() {
                j += 1;
            }
            let mut value = "";
            if j < page.len() && bytes[j] == b'=' {
                j += 1;
                while j < page.len() && bytes[j].is_ascii_whitespace() {
                    j += 1;
                }
                if j < page.len() && (bytes[j] == b'"' || bytes[j] == b'\'') {
                    let close = page[j + 1..].find(bytes[j] as char).map_or(page.len(), |k| k + j + 1);
                    value = &page[j + 1..close];
                    j = close + 1;
                } else {
                    let end = page[j..].find(|c: char| c.is_whitespace() || c == '>').map_or(page.len(), |k| k + j);
                    value = &page[j..end];
                    j = end;
                }
            }
            if name.is_empty() {
                j += 1;
                continue;
            }
            attributes.push((name, value));
        }
        for (name, value) in &attributes {
            if name != "xmlns" && !name.starts_with("xmlns:") {
                found.extend(remote_urls_in(value, true).into_iter().map(|u| format!("<{tag} {name}=…{u}")));
            }
        }
        if tag == "script" || tag == "style" {
            let close = lower[j.min(page.len())..].find(&format!("</{tag}")).map_or(page.len(), |k| k + j);
            let data = tag == "script" && attributes.iter().any(|(n, v)| n == "type" && v.trim().eq_ignore_ascii_case("application/json"));
            if !data {
                found.extend(remote_urls_in(&page[j.min(close)..close], false).into_iter().map(|u| format!("<{tag}>…{u}")));
            }
            j = close;
        }
        i = j.min(page.len());
    }
    found
}

/// Every rendered page in `dir`: HTML, SVG and Markdown.
fn assert_no_network(dir: &Path) {
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "html" || e == "svg" || e == "md") {
            let page = std::fs::read_to_string(&path).unwrap();
            assert_eq!(remote_references(&page), Vec::<String>::new(), "{} reaches the network", path.display());
            checked += 1;
        }
    }
    assert!(checked > 0, "no page in {}", dir.display());
}

/// The no-network check finds what a page would fetch (a remote script, image, style sheet, a
/// script's fetch or import, protocol-relative ones too) and lets namespace names be: on small
/// pages, and on copies of rendered pages with a remote script or image put in.
#[test]
fn the_no_network_check_catches_remote_references() {
    let clean = r##"<!DOCTYPE html>
<html><head><style>body{background:url(data:image/png;base64,AAAA)}</style>
<script>
//<![CDATA[
var NS = "http://www.w3.org/2000/svg"; // a namespace name, never fetched
var x = 1 < 2 ? "a" : "b";
//]]>
</script>
<script type="application/json" id="data">{"command": ["curl", "https://example.com/data"]}</script></head>
<body><p>Runs of <code>curl https://example.com</code> (the program's own words).</p>
<a href="memory-x.html">view</a> <img src="chart.svg" alt="a chart" />
<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"><use xlink:href="#dot"/></svg>
<!-- http://example.com in a comment is not fetched -->
</body></html>"##;
    assert_eq!(remote_references(clean), Vec::<String>::new());
    let injected = [
        r#"<script src="https://cdn.example.com/x.js"></script>"#,
        r#"<img src="http://example.com/a.png">"#,
        r#"<IMG SRC=HTTP://example.com/a.png>"#,
        r#"<img srcset="a.png 1x, //cdn.example.com/a2.png 2x">"#,
        r#"<link rel="stylesheet" href="//cdn.example.com/s.css" />"#,
        r#"<a href='https://example.com/'>out</a>"#,
        r#"<svg xmlns="http://www.w3.org/2000/svg"><image xlink:href="https://example.com/i.png"/></svg>"#,
        r#"<svg xmlns="http://www.w3.org/2000/svg"><image href="http://www.w3.org/2000/svg"/></svg>"#,
        r#"<div style="background: url( //example.com/b.png )"></div>"#,
        r#"<iframe src="https://example.com"></iframe>"#,
        r#"<object data="ftp://example.com/o.swf"></object>"#,
        r#"<style>@import "https://example.com/s.css";</style>"#,
        r#"<style>@import '//example.com/s.css';</style>"#,
        r#"<style>p{background:url('http://example.com/p.png')}</style>"#,
        r#"<script>fetch("https://example.com/api").then(r => r.json());</script>"#,
        r#"<script>import("//cdn.example.com/m.js");</script>"#,
        r#"<script>new WebSocket("wss://example.com/live");</script>"#,
        r#"<script type="module">import x from 'https://esm.example.com/x';</script>"#,
        r#"<script>var u = `https://example.com/${id}`; new Image().src = u;</script>"#,
        r#"<script>var NS = "http://www.w3.org/2000/svg/evil.js";</script>"#,
        r#"<button onclick="fetch('//example.com/x')">go</button>"#,
        "![chart](https://example.com/c.png)",
    ];
    for bad in injected {
        let page = clean.replace("</body>", &format!("{bad}\n</body>"));
        assert_eq!(remote_references(&page).len(), 1, "{bad}: {:?}", remote_references(&page));
    }
    // The real pages: clean as rendered, caught with a remote script or image put in.
    let dir = tempfile::tempdir().unwrap();
    render(dir.path());
    for page in ["index.html", "memory-model-switch.html", "gpu-memory-model-switch.svg"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert_eq!(remote_references(&text), Vec::<String>::new(), "{page}");
        let end = text.rfind("</").unwrap();
        for bad in [r#"<script src="https://cdn.example.com/x.js"></script>"#, r#"<img src="http://example.com/a.png"/>"#] {
            let copy = format!("{}{bad}{}", &text[..end], &text[end..]);
            assert_eq!(remote_references(&copy).len(), 1, "{page} with {bad}");
        }
    }
}

/// Configs that reserve the same least are a tie, and the finding says so: the one with the
/// fewest device mallocs is named (the first given on equal counts), with the others beside it.
/// (A garbage-collection threshold without a memory fraction is ignored, so it ties.)
#[test]
fn a_tie_for_the_least_reserved_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("tie.jsonl");
    let w = format!("{}/workloads/model-switch.toml", env!("CARGO_MANIFEST_DIR"));
    let gc = "garbage_collection_threshold:0.8,expandable_segments:True";
    let run = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args([
            "run",
            &w,
            "--allocators",
            "pytorch",
            "--conf",
            "",
            "--conf",
            gc,
            "--conf",
            "expandable_segments:True",
            "-q",
            "--jsonl",
            results.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    report::render(&report::load(&[results]).unwrap(), &dir.path().join("r"), "tie").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let line = md.lines().find(|l| l.starts_with("- model-switch: ")).unwrap_or_else(|| panic!("{md}"));
    let mallocs = line.split(" at ").nth(1).and_then(|t| t.split(' ').next()).unwrap();
    assert!(
        line.starts_with(&format!(
            "- model-switch: `{gc}` (tied on peak reserved with `expandable_segments:True` at {mallocs} device mallocs) cuts peak reserved most"
        )),
        "{line}"
    );
}

#[test]
fn without_a_defaults_run_the_finding_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let results = edited_fixture(dir.path(), "no-defaults.jsonl", |v| {
        if v["type"] == "gpu_replay" && v["allocator"] == "pytorch" && v["conf"] == "" {
            vec![]
        } else {
            vec![v.clone()]
        }
    });
    report::render(&report::load(&[results]).unwrap(), &dir.path().join("r"), "no defaults").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let line = md.lines().find(|l| l.starts_with("- model-switch: ")).unwrap_or_else(|| panic!("{md}"));
    assert!(line.contains("no run with PyTorch's defaults to compare against; `expandable_segments:True` reserves least"), "{line}");
    assert!(md.contains("| `pytorch expandable_segments:True` | 1 |") && md.contains("| n/a |"), "relative columns without a baseline: {md}");
}

/// Real-program runs render RSS-over-time and time/peak charts, a table with the spread over
/// repetitions and a verdict; in-process runs with a drain get their drift and drain table.
#[test]
fn cpu_exec_and_drain_runs_render_with_spread_and_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let exec = dir.path().join("exec.jsonl");
    let script = format!("{}/workloads/python/serving_loop.py", env!("CARGO_MANIFEST_DIR"));
    let allocators = if Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2").exists() { "glibc,mimalloc" } else { "glibc" };
    let run = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args(["cpu", "--exec", "--allocator", allocators, "--reps", "2", "--jsonl", exec.to_str().unwrap(), "--", "python3", &script, "--bursts", "1"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let inproc = dir.path().join("cpu.jsonl");
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let run = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        // (Sampled every 1 ms: the drift needs 10 samples of a run that lasts about 0.1 s.)
        .args([
            "cpu",
            &w,
            "--allocator",
            "system",
            "--reps",
            "2",
            "--iterations",
            "50",
            "--sample-ms",
            "1",
            "--drain",
            "0.2",
            "--jsonl",
            inproc.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let out = dir.path().join("report");
    let records: Vec<_> = [&exec, &inproc].iter().flat_map(|p| allocbench::results::read_results(p).unwrap()).collect();
    report::render(&records, &out, "t").unwrap();
    assert_no_network(&out);
    for f in ["cpu-exec-rss-serving-loop-py.svg", "cpu-exec-time-peak-serving-loop-py.svg"] {
        let svg = std::fs::read_to_string(out.join(f)).unwrap();
        roxmltree::Document::parse(&svg).unwrap();
    }
    let md = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(md.contains("**Verdict (serving_loop.py)**: lowest peak RSS: "), "{md}");
    assert!(md.contains("**Verdict (python-objects)**: least retained at the end of the drain: glibc"), "{md}");
    // Two repetitions: every figure has its CI and its min–max.
    let row = md.lines().find(|l| l.starts_with("| glibc | 2 | ") && l.contains(" s ± ")).expect("the glibc exec row");
    assert!(row.contains('–'), "{row}");
    let drain_row = md.lines().find(|l| l.starts_with("| glibc | 2 | ") && l.contains("MiB") && !l.contains(" s ± ")).expect("the drain row");
    assert_eq!(drain_row.matches("n/a").count(), 2, "retained at 1 s and 10 s are past a 0.2 s drain: {drain_row}");
}

#[test]
fn cpu_exec_runs_of_one_program_with_other_arguments_are_compared_apart() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!("{}/workloads/python/serving_loop.py", env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for bursts in ["1", "2"] {
        let jsonl = dir.path().join(format!("exec-{bursts}.jsonl"));
        let run = assert_cmd::Command::cargo_bin("allocbench")
            .unwrap()
            .args(["cpu", "--exec", "--allocator", "glibc", "--jsonl", jsonl.to_str().unwrap(), "--", "python3", &script, "--bursts", bursts])
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        files.push(jsonl);
    }
    let records: Vec<_> = files.iter().flat_map(|p| allocbench::results::read_results(p).unwrap()).collect();
    let out = dir.path().join("report");
    report::render(&records, &out, "t").unwrap();
    let md = std::fs::read_to_string(out.join("README.md")).unwrap();
    for bursts in ["1", "2"] {
        let title = format!("serving_loop.py (python3 {script} --bursts {bursts})");
        assert!(md.contains(&format!("#### {title}\n")), "a section per command: {md}");
        assert!(md.contains(&format!("**Verdict ({title})**")), "{md}");
        let row = md.lines().filter(|l| l.starts_with("| glibc | ")).count();
        assert_eq!(row, 2, "one row per command, never both runs in one: {md}");
    }
    let rss_charts = std::fs::read_dir(&out).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("cpu-exec-rss-")).count();
    assert_eq!(rss_charts, 2, "a chart per command");
}

/// A run that crashed (or exited unlike the command's other runs) under one allocator is set apart:
/// named under its command, left out of the rows and the verdict; a program whose every run
/// exits 1 is still compared.
#[test]
fn cpu_exec_runs_that_crash_are_set_apart_from_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!("{}/workloads/python/serving_loop.py", env!("CARGO_MANIFEST_DIR"));
    let jsonl = dir.path().join("exec.jsonl");
    let run = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args(["cpu", "--exec", "--allocator", "glibc", "--jsonl", jsonl.to_str().unwrap(), "--", "python3", &script, "--bursts", "1"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let Some(allocbench::results::ResultRecord::CpuExec(base)) = allocbench::results::read_results(&jsonl).unwrap().into_iter().next() else {
        panic!("a cpu_exec record")
    };
    let glibc_peak = base.peak_rss_bytes;
    // Runs of one command: glibc twice; jemalloc once at a higher peak, once killed by SIGSEGV at
    // a tiny one (counted, it would make jemalloc's mean the lowest).
    let variant = |allocator: &str, rep: u32, command: &[&str], exit_code: i32, error: Option<&str>, peak: u64| {
        let mut r = base.as_ref().clone();
        r.allocator = allocator.into();
        r.served_by = Some(allocator.into());
        r.rep = rep;
        r.command = command.iter().map(|c| c.to_string()).collect();
        r.name = command[1].rsplit('/').next().unwrap().into();
        r.exit_code = exit_code;
        r.error = error.map(str::to_string);
        r.peak_rss_bytes = peak;
        allocbench::results::ResultRecord::CpuExec(Box::new(r))
    };
    let serving = ["python3", "serving.py"];
    let failing = ["python3", "always_exits_1.py"];
    let records = vec![
        variant("glibc", 1, &serving, 0, None, glibc_peak),
        variant("jemalloc", 1, &serving, 0, None, glibc_peak * 2),
        variant("glibc", 2, &serving, 0, None, glibc_peak),
        variant("jemalloc", 2, &serving, 139, Some("killed by signal 11"), 1),
        variant("glibc", 1, &failing, 1, None, glibc_peak),
        variant("jemalloc", 1, &failing, 1, None, glibc_peak / 2),
    ];
    let out = dir.path().join("report");
    report::render(&records, &out, "t").unwrap();
    let md = std::fs::read_to_string(out.join("README.md")).unwrap();
    let section = |title: &str| md.split(&format!("#### {title}\n")).nth(1).unwrap().split("####").next().unwrap().to_string();
    let serving_md = section("serving.py");
    assert!(
        serving_md.contains("Set apart, not in the figures or the verdict (1 run(s) that ended otherwise, where this command's other runs exit 0): jemalloc run 2: exit 139 (killed by signal 11)."),
        "{serving_md}"
    );
    assert!(serving_md.lines().any(|l| l.starts_with("| jemalloc | 1 | ")), "the crashed run is not in jemalloc's row: {serving_md}");
    assert!(serving_md.contains("lowest peak RSS: glibc"), "{serving_md}");
    // The finding says so too.
    let finding = md.lines().find(|l| l.starts_with("- serving.py: ")).unwrap_or_else(|| panic!("{md}"));
    assert!(finding.contains("; ended otherwise, set apart: jemalloc (exit 139, killed by signal 11)"), "{finding}");
    let failing_md = section("always_exits_1.py");
    assert!(!failing_md.contains("Set apart"), "{failing_md}");
    assert!(failing_md.contains("lowest peak RSS: jemalloc"), "a program that always exits 1 is compared: {failing_md}");
}

/// The `#data` JSON of a memory view page.
fn view_data(page: &Path) -> serde_json::Value {
    let html = std::fs::read_to_string(page).unwrap();
    let start = html.find("id=\"data\">").unwrap() + "id=\"data\">".len();
    serde_json::from_str(&html[start..start + html[start..].find("</script>").unwrap()]).unwrap()
}

/// Replays `trace` through two policies (`allocbench run`), then renders the report of the records.
fn report_of_run(trace: &Path, dir: &Path) -> serde_json::Value {
    let records = dir.join("r.jsonl");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allocbench"))
        .arg("run")
        .arg(trace)
        .args(["--allocators", "pytorch,nocache", "--conf", "", "--conf", "expandable_segments:True", "--quiet", "--jsonl"])
        .arg(&records)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out_dir = dir.join("report");
    report::render(&report::load(&[records]).unwrap(), &out_dir, "sites").unwrap();
    assert_no_network(&out_dir);
    view_data(&out_dir.join("memory-sites.html"))
}

/// (live blocks, live blocks with a site) over every run of a view.
fn live_blocks_with_sites(data: &serde_json::Value) -> (usize, usize) {
    let blocks: Vec<&serde_json::Value> =
        data["runs"].as_array().unwrap().iter().flat_map(|r| r["segments"].as_array().unwrap()).flat_map(|s| s[5].as_array().unwrap()).collect();
    let live: Vec<_> = blocks.into_iter().filter(|b| b[2] == 1).collect();
    (live.len(), live.iter().filter(|b| b[3].as_i64().unwrap() >= 0).count())
}

/// A report of a captured trace's runs names each live block's allocation site in its memory
/// view, when it finds the trace again (here at the records' origin, by its sha256); without
/// the trace it shows none rather than guessing.
#[test]
fn a_captured_traces_memory_view_in_a_report_names_sites() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/capture/sites.csv");
    let data = report_of_run(&fixture, dir.path());
    let names: Vec<&str> = data["sites"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(names.contains(&"sites_lib/blocks.py:6 in make"), "{names:?}");
    assert_eq!(data["runs"].as_array().unwrap().len(), 3, "pytorch twice, nocache once");
    let (live, with_site) = live_blocks_with_sites(&data);
    assert!(live >= 10, "every run maps its live blocks: {live}");
    // The caching allocator forks, so its map is the exact peak's and every block there has its
    // site. nocache cannot fork: its map is taken near the peak (here after the matmul's
    // workspace went), which a replay cannot match to owners, so it names no site, not a wrong one.
    for run in data["runs"].as_array().unwrap() {
        let blocks: Vec<&serde_json::Value> = run["segments"].as_array().unwrap().iter().flat_map(|s| s[5].as_array().unwrap()).filter(|b| b[2] == 1).collect();
        let named = blocks.iter().filter(|b| b[3].as_i64().unwrap() >= 0).count();
        let expected = if run["label"] == "nocache" { 0 } else { blocks.len() };
        assert_eq!(named, expected, "{}: {} live blocks", run["label"], blocks.len());
    }
    assert!(with_site >= 10, "{with_site}");

    // Moved away: the report cannot find the trace, and names no site.
    let moved = dir.path().join("moved.csv");
    std::fs::copy(&fixture, &moved).unwrap();
    let other = tempfile::tempdir().unwrap();
    let records_dir = other.path();
    let renamed = records_dir.join("sites.csv");
    std::fs::rename(&moved, &renamed).unwrap();
    let data = report_of_run(&renamed, records_dir);
    std::fs::remove_file(&renamed).unwrap();
    let out_dir = records_dir.join("report");
    report::render(&report::load(&[records_dir.join("r.jsonl")]).unwrap(), &out_dir, "sites").unwrap();
    let gone = view_data(&out_dir.join("memory-sites.html"));
    assert!(live_blocks_with_sites(&data).1 > 0, "found at its origin while it is there");
    assert_eq!(live_blocks_with_sites(&gone).1, 0, "no site once the trace is gone");
    assert!(gone["sites"].as_array().unwrap().is_empty());
}

/// A CPU run stopped by Ctrl-C covers only part of the workload: it is left out of the rows and
/// findings (and said to be), not folded in as a repetition.
#[test]
fn interrupted_cpu_runs_are_left_out_of_rows_and_findings() {
    let dir = tempfile::tempdir().unwrap();
    let results = edited_fixture(dir.path(), "int.jsonl", |v| {
        if v["type"] != "cpu_run" || v["allocator"] != "glibc" {
            return vec![v.clone()];
        }
        let mut stopped = v.clone();
        stopped["interrupted"] = serde_json::json!(true);
        stopped["ops_per_s"] = serde_json::json!(1e12);
        vec![v.clone(), stopped]
    });
    let records = report::load(&[results]).unwrap();
    report::render(&records, &dir.path().join("r"), "int").unwrap();
    render(&dir.path().join("plain"));
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let plain = std::fs::read_to_string(dir.path().join("plain/README.md")).unwrap();
    let glibc_row = |md: &str| md.lines().find(|l| l.starts_with("| glibc |") && l.contains("(in-process)")).map(str::to_string);
    assert!(glibc_row(&md).is_some() && glibc_row(&md) == glibc_row(&plain), "{md}");
    let fastest = |md: &str| md.lines().filter(|l| l.contains("is fastest")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(fastest(&md), fastest(&plain));
    let n = records.iter().filter(|r| matches!(r, allocbench::results::ResultRecord::CpuRun(c) if c.interrupted)).count();
    assert!(n > 0 && md.contains(&format!("{n} interrupted run(s) left out.")), "{md}");
}

/// A preloaded allocator and the compiled-in one of the same name (`cpu --allocator all
/// --preload jemalloc`) are two rows, not two repetitions of one.
#[test]
fn preloaded_and_in_process_runs_of_one_allocator_are_separate_rows() {
    let dir = tempfile::tempdir().unwrap();
    let results = edited_fixture(dir.path(), "modes.jsonl", |v| {
        if v["type"] != "cpu_run" || v["allocator"] != "mimalloc" {
            return vec![v.clone()];
        }
        let mut preloaded = v.clone();
        preloaded["mode"] = serde_json::json!("preload");
        preloaded["ops_per_s"] = serde_json::json!(v["ops_per_s"].as_f64().unwrap() * 2.0);
        vec![v.clone(), preloaded]
    });
    let records = report::load(&[results]).unwrap();
    report::render(&records, &dir.path().join("r"), "modes").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| mimalloc | `")).collect();
    assert_eq!(rows.len(), 2, "{md}");
    assert!(rows.iter().all(|r| r.contains(") | 1 | 1 | 1 |")), "one run each: {rows:?}");
}

/// Runs that measured different things are not folded into one row: a `--no-touch` run, and a
/// run of an edited copy of the workload under the same name (told apart by its sha256). A run
/// that sampled no operation shows its latency as n/a, not 0 ns; "retained" is what the drain
/// ended with, in the table and the finding alike.
#[test]
fn cpu_runs_that_measured_other_things_are_compared_apart() {
    let dir = tempfile::tempdir().unwrap();
    let results = edited_fixture(dir.path(), "apart.jsonl", |v| {
        if v["type"] != "cpu_run" {
            return vec![v.clone()];
        }
        let mut drained = v.clone();
        drained["retained"] = serde_json::json!(50 << 20);
        let end = if v["allocator"] == "glibc" { 1 << 20 } else { 40 << 20 };
        drained["retained_after_drain"] = serde_json::json!([{"after_s": 0.1, "retained": 50 << 20}, {"after_s": 10.0, "retained": end}]);
        if v["allocator"] != "mimalloc" {
            return vec![drained];
        }
        let mut untouched = drained.clone();
        untouched["touch"] = serde_json::json!(false);
        let mut edited = drained.clone();
        edited["workload"]["sha256"] = serde_json::json!("0123456789abcdef0123456789abcdef");
        edited["alloc_ns"] = serde_json::json!({"count": 0, "mean": 0.0, "p50": 0, "p99": 0, "p999": 0, "max": 0});
        vec![drained, untouched, edited]
    });
    let records = report::load(&[results]).unwrap();
    report::render(&records, &dir.path().join("r"), "apart").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let name = records.iter().find_map(|r| if let allocbench::results::ResultRecord::CpuRun(c) = r { Some(c.workload.name.clone()) } else { None }).unwrap();
    assert!(md.contains(&format!("#### {name} (sha256 0123456789ab)")), "the edited copy has a table of its own: {md}");
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| mimalloc | `")).collect();
    assert_eq!(rows.len(), 3, "{md}");
    assert_eq!(rows.iter().filter(|r| r.contains(" no-touch |")).count(), 1, "{rows:?}");
    assert!(rows.iter().all(|r| r.contains("| 1 |")), "one run each: {rows:?}");
    assert!(rows.iter().any(|r| r.contains("| n/a | ")), "no sampled malloc: {rows:?}");
    assert!(rows.iter().all(|r| r.contains("| 40.0 MiB |")), "retained at the drain's end: {rows:?}");
    assert!(md.lines().any(|l| l.contains("): glibc retains least at the end of the drain, 1.00 MiB")), "{md}");
}

/// Runs of one workload on two capacities are two cases, each compared with its own defaults:
/// one table mixed them under the first capacity, against the wrong baseline, and dropped rows.
#[test]
fn runs_on_other_capacities_are_compared_apart() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited_fixture(dir.path(), "two-cards.jsonl", |v| {
        if v["workload"]["name"] != "model-switch" {
            return vec![v.clone()];
        }
        // The same runs on a card twice as large, where expandable segments reserve 3× more.
        let mut bigger = v.clone();
        bigger["capacity"] = (v["capacity"].as_u64().unwrap() * 2).into();
        if v["conf"] == "expandable_segments:True" {
            bigger["summary"]["peak_reserved"] = (v["summary"]["peak_reserved"].as_u64().unwrap() * 3).into();
        }
        vec![v.clone(), bigger]
    });
    let records = report::load(std::slice::from_ref(&path)).unwrap();
    report::render(&records, &dir.path().join("r"), "t").unwrap();
    let md = std::fs::read_to_string(dir.path().join("r/README.md")).unwrap();
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let runs: Vec<&serde_json::Value> = recs.iter().filter(|r| r["workload"]["name"] == "model-switch").collect();
    let capacities: std::collections::BTreeSet<u64> = runs.iter().map(|r| r["capacity"].as_u64().unwrap()).collect();
    assert_eq!(capacities.len(), 2);
    for capacity in &capacities {
        let heading = format!("#### model-switch on {}\n", bytes(&(*capacity).into()));
        let table = &md[md.find(&heading).unwrap_or_else(|| panic!("{heading} in {md}"))..];
        let table = &table[..table[heading.len()..].find("####").map_or(table.len(), |i| i + heading.len())];
        let rows = table.lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(rows, runs.iter().filter(|r| r["capacity"] == *capacity).count(), "every run of the case is a row: {table}");
    }
    // Each case has its own memory view.
    let views: Vec<&str> = md.lines().filter(|l| l.starts_with("- [model-switch on ")).collect();
    assert_eq!(views.len(), 2, "{md}");
    assert_ne!(views[0].split('(').nth(1), views[1].split('(').nth(1), "{views:?}");
    // On the larger card expandable segments reserve more than the defaults there: no cut is claimed.
    let large = bytes(&(*capacities.iter().last().unwrap()).into());
    let finding = md.lines().find(|l| l.starts_with(&format!("- model-switch on {large}: "))).unwrap_or_else(|| panic!("{md}"));
    assert!(!finding.contains("`expandable_segments:True` cuts"), "{finding}");
}

/// A search where every configuration runs out of memory has no memory-time front: the report
/// says which gets furthest instead of drawing an empty chart. One workload thousands of times
/// over its live bytes (a 1-byte tensor in a 2 MiB segment) puts the overhead chart on a log axis.
#[test]
fn an_all_oom_search_and_an_outlier_overhead_stay_readable() {
    let dir = tempfile::tempdir().unwrap();
    let bin = || assert_cmd::Command::cargo_bin("allocbench").unwrap();
    let (one, big) = (dir.path().join("one.csv"), dir.path().join("big.csv"));
    std::fs::write(&one, "op,id,bytes,stream\nalloc,1,1,0\nfree,1,,\n").unwrap();
    std::fs::write(&big, "op,id,bytes,stream\nalloc,1,3000000000,0\nfree,1,,\n").unwrap();
    let runs = dir.path().join("runs.jsonl");
    let sawtooth = format!("{}/workloads/scenario-sawtooth.toml", env!("CARGO_MANIFEST_DIR"));
    for input in [one.to_str().unwrap(), &sawtooth] {
        assert!(bin().args(["run", input, "-q", "--jsonl", runs.to_str().unwrap()]).output().unwrap().status.success());
    }
    let search = dir.path().join("advise.jsonl");
    assert!(bin().args(["advise", big.to_str().unwrap(), "--capacity", "1GiB", "--jsonl", search.to_str().unwrap()]).output().unwrap().status.success());
    let out = dir.path().join("report");
    report::render(&report::load(&[runs, search]).unwrap(), &out, "t").unwrap();
    let md = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        md.contains("- advise (big, 1.00 GiB card, 1216 configurations): every configuration runs out of memory; `(PyTorch's defaults)` gets furthest"),
        "{md}"
    );
    assert!(!out.join("advise-front-big.svg").exists(), "no empty front chart");
    assert!(std::fs::read_to_string(out.join("gpu-overhead.svg")).unwrap().contains("peak reserved / peak live (log scale)"));
}

/// A long workload name is clipped in file names before the case's capacity is added, so two
/// cases never write one file.
#[test]
fn cases_of_a_long_workload_name_get_files_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let long = "a-workload-name-far-longer-than-the-sixty-characters-a-file-name-slug-keeps";
    let path = edited_fixture(dir.path(), "long.jsonl", |v| {
        if v["workload"]["name"] != "model-switch" {
            return vec![v.clone()];
        }
        let mut v = v.clone();
        v["workload"]["name"] = long.into();
        let mut bigger = v.clone();
        bigger["capacity"] = (v["capacity"].as_u64().unwrap() * 2).into();
        vec![v, bigger]
    });
    report::render(&report::load(&[path]).unwrap(), &dir.path().join("r"), "t").unwrap();
    let views: Vec<String> = std::fs::read_dir(dir.path().join("r"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("memory-a-workload"))
        .collect();
    assert_eq!(views.len(), 2, "{views:?}");
}
