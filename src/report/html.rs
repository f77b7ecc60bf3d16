//! The HTML pages of a report: self-contained (inline CSS, JS and SVG; no network), with a small
//! script that records any JavaScript error or missing file into the page (`#js-errors`), so a
//! headless browser's `--dump-dom` shows what went wrong. Pages are well-formed XML too (scripts
//! in CDATA), so tests can parse them.

use std::fmt::Write as _;

use super::Section;

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// First in `<head>`: every error event (a script's, or a resource's that failed to load) is
/// written into `<pre id="js-errors">` and counted in `data-errors` on `<html>`.
pub const ERROR_RECORDER: &str = r##"<script>
//<![CDATA[
(function () {
  function record(msg) {
    var root = document.documentElement;
    root.setAttribute("data-errors", String(Number(root.getAttribute("data-errors") || "0") + 1));
    var pre = document.getElementById("js-errors");
    if (pre) { pre.textContent += msg + "\n"; pre.hidden = false; } else { (window.__pendingErrors = window.__pendingErrors || []).push(msg); }
  }
  window.addEventListener("error", function (e) {
    var t = e.target;
    if (t && t !== window && (t.src || t.href)) { record("missing file: " + (t.src || t.href)); }
    else { record("JavaScript error: " + e.message + " at " + e.filename + ":" + e.lineno); }
  }, true);
  window.addEventListener("unhandledrejection", function (e) { record("JavaScript error: " + e.reason); });
  document.addEventListener("DOMContentLoaded", function () {
    (window.__pendingErrors || []).forEach(function (m) { record(m); });
  });
})();
//]]>
</script>"##;

/// The error list every page carries (hidden while empty).
pub const ERROR_LIST: &str = "<pre id=\"js-errors\" hidden=\"hidden\"></pre>\n";

const CSS: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;overflow-wrap:anywhere}#decision{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start;background:#f6f9fc;border:1px solid #dde6ee;padding:.5em 1em}#decision .say{flex:1 1 420px;min-width:0}#decision figure{flex:1 1 420px;min-width:0;margin:.5em 0}#decisions li{margin:.5em 0}pre{white-space:pre-wrap}table{display:block;overflow-x:auto;max-width:100%;border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}td.num{text-align:right;white-space:nowrap}th{background:#f3f3f3}figure{margin:1.5em 0}figure svg{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:13px;color:#555}#findings li{margin:.4em 0}#findings{background:#f6f9fc;border:1px solid #dde6ee;padding:.8em 1em .8em 2.2em}#js-errors{color:#b00;background:#fee;padding:.5em}code{background:#f3f3f3;padding:0 2px}";

/// Inline Markdown: `code`, [text](link), **strong**; the rest escaped.
pub fn inline(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("**") {
            if let Some(end) = after.find("**") {
                let _ = write!(out, "<strong>{}</strong>", inline(&after[..end]));
                rest = &after[end + 2..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix('`') {
            if let Some(end) = after.find('`') {
                let _ = write!(out, "<code>{}</code>", escape(&after[..end]));
                rest = &after[end + 1..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix('[') {
            if let Some((text, tail)) = after.split_once("](") {
                if let Some(end) = tail.find(')') {
                    if !text.contains(']') {
                        let _ = write!(out, "<a href=\"{}\">{}</a>", escape(&tail[..end]), inline(text));
                        rest = &tail[end + 1..];
                        continue;
                    }
                }
            }
        }
        let first = rest.chars().next().map_or(1, char::len_utf8);
        let next = rest[first..].find(['`', '[', '*']).map(|i| i + first).unwrap_or(rest.len());
        out += &escape(&rest[..next]);
        rest = &rest[next..];
    }
    out
}

/// The Markdown the report writes (tables, `- ` lists, `###`/`####` headings, paragraphs) as
/// HTML. Table cells that hold a number are right-aligned.
pub fn markdown(md: &str) -> String {
    let mut body = String::new();
    let mut table = false;
    let mut list = false;
    for line in md.lines() {
        let is_row = line.starts_with('|');
        let is_item = line.starts_with("- ");
        if table && !is_row {
            body += "</table>\n";
            table = false;
        }
        if list && !is_item {
            body += "</ul>\n";
            list = false;
        }
        if is_row {
            if line.starts_with("|---") {
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            let tag = if table { "td" } else { "th" };
            if !table {
                body += "<table>\n";
                table = true;
            }
            body += "<tr>";
            for c in cells {
                let numeric = tag == "td" && c.starts_with(|ch: char| ch.is_ascii_digit() || ch == '+' || ch == '−' || ch == '-') && !c.contains(' ')
                    || c.contains(" ± ");
                let _ = write!(body, "<{tag}{}>{}</{tag}>", if numeric { " class=\"num\"" } else { "" }, inline(c));
            }
            body += "</tr>\n";
        } else if let Some(item) = line.strip_prefix("- ") {
            if !list {
                body += "<ul>\n";
                list = true;
            }
            let _ = writeln!(body, "<li>{}</li>", inline(item));
        } else if let Some(h) = line.strip_prefix("#### ") {
            let _ = writeln!(body, "<h4>{}</h4>", inline(h));
        } else if let Some(h) = line.strip_prefix("### ") {
            let _ = writeln!(body, "<h3>{}</h3>", inline(h));
        } else if let Some(h) = line.strip_prefix("## ") {
            let _ = writeln!(body, "<h2>{}</h2>", inline(h));
        } else if !line.trim().is_empty() {
            let _ = writeln!(body, "<p>{}</p>", inline(line));
        }
    }
    if table {
        body += "</table>\n";
    }
    if list {
        body += "</ul>\n";
    }
    body
}

/// The index page: the findings first, then the provenance, then each section with its tables
/// and its charts inline (each linked to its SVG file).
pub fn index(title: &str, preamble: &str, sections: &[Section]) -> String {
    let mut body = String::new();
    // The first screen: what to set, per family of workloads, beside the chart that shows it.
    let lead = super::decisions(sections);
    if !lead.is_empty() {
        body += "<div id=\"decision\"><div class=\"say\"><h2>What to set</h2>\n<ul id=\"decisions\">\n";
        for d in lead {
            let _ = writeln!(body, "<li>{}</li>", inline(d));
        }
        body += "</ul></div>\n";
        if let Some(c) = super::key_chart(sections) {
            body += &figure(c);
        }
        body += "</div>\n";
    }
    body += "<h2>Findings</h2>\n<ul id=\"findings\">\n";
    for f in super::findings(sections) {
        let _ = writeln!(body, "<li>{}</li>", inline(f));
    }
    body += "</ul>\n";
    body += &markdown(preamble);
    for sec in sections {
        let _ = writeln!(body, "<section>\n<h2>{}</h2>", inline(&sec.heading));
        body += &markdown(&sec.body);
        let (open, folded): (Vec<_>, Vec<_>) = sec.charts.iter().partition(|c| !c.folded);
        for c in open {
            body += &figure(c);
        }
        if !folded.is_empty() {
            let _ = writeln!(body, "<details><summary>{} more charts (segment maps at the peak or the OOM)</summary>", folded.len());
            for c in folded {
                body += &figure(c);
            }
            body += "</details>\n";
        }
        body += "</section>\n";
    }
    let _ = writeln!(body, "<p>{}</p>", inline(super::DEFINITIONS));
    page(title, "", &body, READY_SCRIPT)
}

fn figure(c: &super::Chart) -> String {
    format!(
        "<figure class=\"chart\" data-file=\"{f}\">\n{svg}\n<figcaption><a href=\"{f}\">{t}</a></figcaption></figure>\n",
        f = escape(&c.file),
        svg = c.svg.trim(),
        t = escape(&c.title)
    )
}

/// Marks the index as read by a browser that ran its scripts: the counts a check compares.
const READY_SCRIPT: &str = r##"<script>
//<![CDATA[
document.addEventListener("DOMContentLoaded", function () {
  var root = document.documentElement;
  root.setAttribute("data-findings", String(document.querySelectorAll("#findings li").length));
  root.setAttribute("data-inline-charts", String(document.querySelectorAll("figure.chart svg").length));
  root.setAttribute("data-decisions", String(document.querySelectorAll("#decisions li").length));
  // Whether the page scrolls sideways at this window's width (a test loads it at 1,400 px).
  root.setAttribute("data-overflow-x", String(Math.max(0, root.scrollWidth - root.clientWidth)));
  root.setAttribute("data-ready", "1");
});
//]]>
</script>"##;

/// A whole page: the error recorder first, `extra_head` (styles), the body, then `tail` scripts.
pub fn page(title: &str, extra_head: &str, body: &str, tail: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\" /><title>{t}</title>\n{ERROR_RECORDER}\n<style>{CSS}{extra_head}</style></head>\n<body><h1>{t}</h1>\n{ERROR_LIST}{body}{tail}\n</body></html>\n",
        t = escape(title)
    )
}
