//! The published reports in a real browser: headless Chromium (Debian's `chromium`) loads each
//! report's `index.html` and memory views and dumps the DOM after their scripts ran. The pages
//! record every JavaScript error and every file that failed to load into the DOM (`data-errors`
//! on `<html>`, `#js-errors`), and say what their scripts drew (`data-findings`,
//! `data-inline-charts`, `data-blocks-drawn`, `data-hover`).
//!
//! Skipped (with a message) where Chromium is not installed, unless
//! `ALLOCBENCH_REQUIRE_CHROMIUM=1` (CI sets it); `ALLOCBENCH_CHROMIUM` names another binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ALLOCBENCH_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n))).find(|p| p.is_file())
}

/// The browser, or `None` (the test then returns) where it is absent and not required.
fn browser() -> Option<PathBuf> {
    match chromium() {
        Some(b) => Some(b),
        None => {
            common::skip("browser", "chromium is not installed (apt-get install chromium)", "ALLOCBENCH_REQUIRE_CHROMIUM");
            None
        }
    }
}

/// Loads `page` in headless Chromium (a fresh profile, nothing reached over the network) and
/// returns the DOM after its scripts ran.
fn dump_dom(browser: &Path, page: &Path) -> String {
    dump_dom_at(browser, page, None)
}

/// [`dump_dom`] in a window of `size` (width, height) pixels.
fn dump_dom_at(browser: &Path, page: &Path, size: Option<(u32, u32)>) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = tempfile::NamedTempFile::new().unwrap();
    let url = format!("file://{}", page.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", page.display())).display());
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(size.map(|(w, h)| format!("--window-size={w},{h}")))
        .arg("--dump-dom")
        .arg(&url)
        .stdout(Stdio::from(out.reopen().unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium failed on {url}: {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish loading {url} in 180 s (a script that never ends?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::read_to_string(out.path()).unwrap()
}

/// The value of attribute `name` of the DOM's `<html>` tag.
fn html_attr(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("<html")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let key = format!(" {name}=\"");
    let at = tag.find(&key)? + key.len();
    Some(tag[at..at + tag[at..].find('"')?].replace("&quot;", "\"").replace("&amp;", "&"))
}

fn number(dom: &str, name: &str) -> usize {
    html_attr(dom, name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// No JavaScript error and no missing file was recorded, and the page's scripts ran to the end.
fn assert_clean(dom: &str, page: &Path) {
    let errors = dom.find("<pre id=\"js-errors\"").map(|i| &dom[i..i + dom[i..].find("</pre>").unwrap_or(0)]).unwrap_or("");
    assert_eq!(html_attr(dom, "data-errors"), None, "{}: errors recorded in the page: {errors}", page.display());
    assert_eq!(html_attr(dom, "data-ready").as_deref(), Some("1"), "{}: the page's scripts did not run to the end", page.display());
}

/// Every local file the page references (`src`/`href`) exists beside it.
fn assert_local_files_exist(page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut refs = Vec::new();
    for key in ["src=\"", "href=\""] {
        let mut rest = text.as_str();
        while let Some(i) = rest.find(key) {
            rest = &rest[i + key.len()..];
            let target = &rest[..rest.find('"').unwrap_or(0)];
            if target.is_empty() || target.starts_with('#') || target.contains("://") || target.starts_with("data:") || target.starts_with("mailto:") {
                continue;
            }
            let file = page.parent().unwrap().join(target.split('#').next().unwrap());
            assert!(file.is_file(), "{} references {target}, which does not exist", page.display());
            refs.push(target.to_string());
        }
    }
    refs
}

#[test]
fn published_indexes_load_with_findings_and_inline_charts() {
    let Some(browser) = browser() else { return };
    for (report, finding) in [("comparison", "cuts peak reserved most"), ("diagnose-gpt3-73g", "73.0 GiB"), ("gpu-h100", "cuts peak reserved most")] {
        let page = root().join("reports").join(report).join("index.html");
        let refs = assert_local_files_exist(&page);
        assert!(refs.iter().any(|r| r.ends_with(".svg")), "{report}: charts link their SVG files: {refs:?}");
        let dom = dump_dom(&browser, &page);
        assert_clean(&dom, &page);
        let findings = number(&dom, "data-findings");
        assert!(findings >= 1, "{report}: a findings list with computed sentences: {findings}");
        let list = &dom[dom.find("<ul id=\"findings\">").unwrap_or_else(|| panic!("{report}: no #findings"))..];
        let list = &list[..list.find("</ul>").unwrap()];
        assert!(list.contains(finding), "{report}: findings say {finding:?}: {list}");
        assert!(number(&dom, "data-inline-charts") >= 3, "{report}: charts inline as SVG: {:?}", html_attr(&dom, "data-inline-charts"));
    }
}

/// Whether the view's first run is shown at its OOM (no peak marker then).
fn text_is_oom(dom: &str) -> bool {
    dom.contains("Segment map at the OOM")
}

/// (width, height) of a PNG file, from its IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[1..4], b"PNG", "{} is a PNG", path.display());
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

/// The published comparison opens with what to set, once per family of workloads, beside its
/// chart, before the findings; at 1,400 px it does not scroll sideways; its first screen at that
/// width is committed beside it (scripts/publish.sh takes it) and taken again here.
#[test]
fn published_comparison_leads_with_the_decision_and_fits_1400_px() {
    let Some(browser) = browser() else { return };
    let page = root().join("reports/comparison/index.html");
    let dom = dump_dom_at(&browser, &page, Some((1400, 900)));
    assert_clean(&dom, &page);
    let decisions = number(&dom, "data-decisions");
    assert!((1..=6).contains(&decisions), "one decision per family of workloads: {decisions}");
    let (decision, findings) = (dom.find("id=\"decision\"").expect("a decision block"), dom.find("id=\"findings\"").unwrap());
    assert!(decision < findings, "the decision comes first");
    assert!(dom[decision..findings].contains("<svg"), "with its chart beside it");
    assert_eq!(html_attr(&dom, "data-overflow-x").as_deref(), Some("0"), "the page scrolls sideways at 1,400 px");
    assert_eq!(png_size(&root().join("reports/comparison/first-screen.png")), (1400, 900));
    let shot = tempfile::tempdir().unwrap();
    let png = shot.path().join("first.png");
    let profile = tempfile::tempdir().unwrap();
    let status = Command::new(&browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,900"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(png_size(&png), (1400, 900));
}

#[test]
fn published_comparison_says_which_allocator_is_fastest_with_its_spread() {
    let Some(browser) = browser() else { return };
    let page = root().join("reports/comparison/index.html");
    let dom = dump_dom(&browser, &page);
    assert_clean(&dom, &page);
    let list = &dom[dom.find("<ul id=\"findings\">").unwrap()..];
    let list = &list[..list.find("</ul>").unwrap()];
    assert!(list.contains("is fastest") && list.contains("retains least at the end of the drain"), "{list}");
    // The CPU findings carry their spread: a ± and the number of repetitions (several) behind it.
    let runs: Vec<u32> = list.split("95 % CI over ").skip(1).filter_map(|t| t.split(' ').next()?.parse().ok()).collect();
    assert!(list.contains(" ± ") && !runs.is_empty() && runs.iter().all(|&n| n >= 2), "the spread over repetitions: {list}");
}

#[test]
fn published_memory_views_draw_the_segments_and_answer_hovers() {
    let Some(browser) = browser() else { return };
    let dir = root().join("reports/comparison");
    let mut pages: Vec<PathBuf> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("memory-")).collect();
    pages.sort();
    assert!(!pages.is_empty(), "the comparison has memory views");
    // The index links every one of them.
    let index = std::fs::read_to_string(dir.join("index.html")).unwrap();
    for p in &pages {
        assert!(index.contains(&format!("href=\"{}\"", p.file_name().unwrap().to_string_lossy())), "index links {}", p.display());
    }
    // The diagnosis's view: the defaults run out of memory on 73 GiB, so its map is the OOM's.
    let oom_view = root().join("reports/diagnose-gpt3-73g/memory-gpt3-xl-1-3b.html");
    let text = std::fs::read_to_string(&oom_view).unwrap();
    assert!(text.contains("\"at\":\"OOM\""), "{}: the map at the OOM", oom_view.display());
    pages.push(oom_view);
    for page in pages.iter().take(2).chain(pages.last()) {
        assert_local_files_exist(page);
        let dom = dump_dom(&browser, page);
        assert_clean(&dom, page);
        assert!(number(&dom, "data-runs") >= 2, "{}: a run per config", page.display());
        assert!(number(&dom, "data-blocks-drawn") > 0, "{}: the segment map is drawn", page.display());
        // The colours have a key, and the timeline marks the peak moment the headline speaks of.
        assert!(number(&dom, "data-key-entries") > 0 && dom.contains("<p class=\"legend\" id=\"key\"><span class=\"sw\""), "{}: a colour key", page.display());
        assert!(dom.contains("allocated at that moment") || text_is_oom(&dom), "{}: the peak moment is marked", page.display());
        let hover = html_attr(&dom, "data-hover").unwrap_or_default();
        assert!(hover.starts_with("block ") && hover.contains("requested"), "{}: hover names the block: {hover:?}", page.display());
    }
}

#[test]
fn a_snapshots_memory_view_names_allocation_sites() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("memory.html");
    let out = Command::new(env!("CARGO_BIN_EXE_allocbench"))
        .args(["replay", "tests/fixtures/snapshot-small.pickle", "-q", "--html"])
        .arg(&page)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&page).unwrap();
    assert!(text.contains("make_snapshot.py:41 in train"), "the snapshot's frames are in the page");
    let Some(browser) = browser() else { return };
    let dom = dump_dom(&browser, &page);
    assert_clean(&dom, &page);
    let site = html_attr(&dom, "data-hover-site").unwrap_or_default();
    assert!(site.starts_with("allocated at make_snapshot.py:"), "hover shows the allocation site: {site:?}");
}

/// A captured trace's memory view names the sites its `#site` lines give
/// (`tests/fixtures/capture/sites.csv`, captured from `sites.py`: tests/capture.rs checks it).
#[test]
fn a_captured_traces_memory_view_names_allocation_sites() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("memory.html");
    let out = Command::new(env!("CARGO_BIN_EXE_allocbench"))
        .args(["replay", "tests/fixtures/capture/sites.csv", "-q", "--html"])
        .arg(&page)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sites = allocbench::trace::read_trace(&root().join("tests/fixtures/capture/sites.csv")).unwrap().read_sites().unwrap();
    assert!(std::fs::read_to_string(&page).unwrap().contains("sites_lib/blocks.py:6 in make"), "the capture's sites are in the page");
    let Some(browser) = browser() else { return };
    let dom = dump_dom(&browser, &page);
    assert_clean(&dom, &page);
    let site = html_attr(&dom, "data-hover-site").unwrap_or_default();
    let named =
        site.strip_prefix("allocated at ").unwrap_or_else(|| panic!("hover shows the allocation site: {site:?}")).replace("&lt;", "<").replace("&gt;", ">");
    assert!(sites.names.contains(&named), "{named:?} is one of {:?}", sites.names);
}

/// A memory view that cannot be written is a clear error (exit 2) after the results were written.
#[test]
fn an_unwritable_memory_view_keeps_the_results() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_allocbench"))
        .args(["replay", "workloads/scenario-sawtooth.toml", "-q", "--json"])
        .arg(&json)
        .arg("--html")
        .arg(dir.path().join("no-such-folder/memory.html"))
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-folder/memory.html: cannot write the memory view"), "{err}");
    assert!(allocbench::results::read_results(&json).is_ok(), "the results were written first");
}

/// The checks catch what they are for: a page with a script error and a missing image.
#[test]
fn a_script_error_and_a_missing_file_are_caught() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("broken.html");
    let body = "<img src=\"no-such-chart.svg\" alt=\"missing\" />\n";
    let tail = "<script>undefinedFunction();</script>";
    std::fs::write(&page, allocbench::report::html::page("broken", "", body, tail)).unwrap();
    let dom = dump_dom(&browser, &page);
    assert_eq!(number(&dom, "data-errors"), 2, "{dom}");
    assert!(
        dom.contains("missing file: ") && dom.contains("no-such-chart.svg") && dom.contains("JavaScript error: ") && dom.contains("undefinedFunction"),
        "{dom}"
    );
    let missing = std::panic::catch_unwind(|| assert_local_files_exist(&page));
    assert!(missing.is_err(), "a missing local file fails the file check");
}
