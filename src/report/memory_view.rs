//! The interactive memory view: one self-contained HTML page (inline JS and CSS, no network) in
//! the manner of `torch.cuda._memory_viz`: the memory timeline (allocated and reserved over the
//! steps, the peak or the OOM marked) and the segment map at the peak or at the OOM, every
//! segment laid out in address order, hover for a block's size, request, state, stream, segment
//! and, where the input recorded one (PyTorch snapshots, captures), its allocation site. A selector switches
//! between the configs that replayed the workload.
//!
//! It reads only what a results record holds (`timeline`, `segments_at_peak`,
//! `segments_at_oom`, `oom`); the sites come from the input, when the caller has it
//! (`allocbench replay --html`, and `allocbench report` for the inputs it finds:
//! [`Source::find_recorded`]).

use std::path::Path;

use serde_json::{json, Value};

use super::html;
use super::spread::fold;
use crate::gpu::build::DeviceSpec;
use crate::gpu::config::AllocatorConfig;
use crate::input::Source;
use crate::results::{Backend, GpuRunResult, SegmentSnapshot};
use crate::trace::Sites;

/// The allocation site of each block of a segment map where known (`[segment][block]`, an index
/// into the page's site names).
pub type BlockSites = Vec<Vec<Option<u32>>>;

/// The site of each block of a segment map, from its owner's allocation id (`ids[segment][block]`,
/// as [`crate::gpu::replay::BlockOwners`] gives them).
pub fn block_sites(ids: &[Vec<Option<u64>>], sites: &Sites) -> BlockSites {
    ids.iter().map(|row| row.iter().map(|id| id.and_then(|id| sites.of_id.get(&id).copied())).collect()).collect()
}

/// One run shown in the view, with its blocks' allocation sites where known.
pub struct ViewRun<'a> {
    pub run: &'a GpuRunResult,
    pub sites: Option<BlockSites>,
}

/// The segment map the view shows: at the OOM when the run had one, else at the peak.
pub fn shown_segments(r: &GpuRunResult) -> (&'static str, &[SegmentSnapshot]) {
    if r.segments_at_oom.is_empty() {
        ("peak", &r.segments_at_peak)
    } else {
        ("OOM", &r.segments_at_oom)
    }
}

fn run_json(v: &ViewRun) -> Value {
    let r = v.run;
    let use_steps = r.work.steps >= 10;
    let x = |event: u64, step: u64| if use_steps { step } else { event };
    let timeline: Vec<Value> = r.timeline.iter().map(|p| json!([x(p.event, p.step), p.allocated_max, p.reserved_max])).collect();
    let (at, segments) = shown_segments(r);
    // The moment the map was taken: the OOM's, or the sample where reserved peaked.
    let at_x = match &r.oom {
        Some(o) if at == "OOM" => x(o.event, o.step),
        _ => r.timeline.iter().max_by_key(|p| (p.reserved_max, std::cmp::Reverse(p.event))).map(|p| x(p.event, p.step)).unwrap_or(0),
    };
    let segs: Vec<Value> = segments
        .iter()
        .enumerate()
        .map(|(si, s)| {
            let blocks: Vec<Value> = s
                .blocks
                .iter()
                .enumerate()
                .map(|(bi, b)| {
                    let site = v.sites.as_ref().and_then(|t| t.get(si)).and_then(|row| row.get(bi)).copied().flatten();
                    json!([b.size, b.requested_size, u8::from(b.is_allocated()), site.map(i64::from).unwrap_or(-1)])
                })
                .collect();
            json!([s.address, s.total_size, s.stream, s.segment_type.as_str(), s.is_expandable, blocks])
        })
        .collect();
    json!({
        "label": r.label(),
        "capacity": r.capacity,
        "x_label": if use_steps { "step" } else { "event" },
        "timeline": timeline,
        "at": at,
        "at_x": at_x,
        "peak_reserved": r.summary.peak_reserved,
        "allocated_at_peak": r.summary.allocated_at_peak_reserved,
        "peak_live": r.work.peak_live_bytes,
        "oom": r.oom.as_ref().map(|o| json!({"x": x(o.event, o.step), "requested": o.requested, "cause": o.cause.as_str()})),
        "segments": segs,
    })
}

/// The page for `runs` (one workload), with `site_names` for the blocks' sites.
pub fn page(title: &str, runs: &[ViewRun], site_names: &[String]) -> String {
    let data = json!({ "runs": runs.iter().map(run_json).collect::<Vec<_>>(), "sites": site_names });
    // Safe inside <script> and in XML: JSON allows these escapes inside strings, the only place
    // the characters can occur.
    let data = data.to_string().replace('&', "\\u0026").replace('<', "\\u003c").replace('>', "\\u003e");
    let body = format!(
        "<p>Like <code>torch.cuda._memory_viz</code>: memory over the run, and every segment at the peak (or at the OOM) in address order, one strip per row. Hover for a block: its size, the request, its state, stream, segment and allocation site where the input recorded one.</p>\n\
<p><label>run: <select id=\"run\"></select></label> <span id=\"summary\"></span></p>\n\
<h2>Memory timeline</h2>\n<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"280\"></svg>\n\
<h2 id=\"map-title\">Segment map</h2>\n<p class=\"legend\"><span class=\"sw free\"></span> free (cached) piece; a dark tick starts each segment; a live block is coloured by its allocation site, else its request size:</p>\n<p class=\"legend\" id=\"key\"></p>\n<svg id=\"segments\" xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"40\"></svg>\n\
<div id=\"tip\" hidden=\"hidden\"></div>\n\
<script type=\"application/json\" id=\"data\">{data}</script>\n"
    );
    html::page(title, VIEW_CSS, &body, VIEW_SCRIPT)
}

/// Writes `memory-<file_slug>.html` for a workload's runs (one per config; repetitions replay
/// the same policy) into `out`; returns the file name. With the workload's `input` (a capture
/// or snapshot that recorded sites), blocks name their allocation sites (see [`sites_of_run`]).
pub fn write_for_runs(out: &Path, workload: &str, file_slug: &str, runs: &[&GpuRunResult], input: Option<&Source>) -> anyhow::Result<String> {
    let sites = match input {
        Some(source) => source.sites()?,
        None => None,
    };
    let mut view = Vec::new();
    for (_, reps) in fold(runs.iter().copied(), |r| (r.allocator, r.conf.clone())) {
        let run = reps[0];
        let block_sites = match (input, &sites) {
            (Some(source), Some(sites)) => sites_of_run(run, source, sites)?,
            _ => None,
        };
        view.push(ViewRun { run, sites: block_sites });
    }
    let names = sites.map(|s| s.into_owned().names).unwrap_or_default();
    let file = format!("memory-{file_slug}.html");
    super::write_file(out, &file, &page(&format!("{workload}: memory view"), &view, &names))?;
    Ok(file)
}

/// The sites of the blocks a record's segment map shows: a replay of the record's policy on a
/// fresh simulated device (deterministic) tells which allocation owns each block. `None` when
/// the record was not made on the simulator, was interrupted, or that replay's map is not the
/// record's (another address order, say): then no site is shown rather than a wrong one.
pub fn sites_of_run(run: &GpuRunResult, source: &Source, sites: &Sites) -> anyhow::Result<Option<BlockSites>> {
    if run.backend != Backend::Sim || run.summary.interrupted {
        return Ok(None);
    }
    // A record whose conf does not parse (edited by hand) cannot be replayed: no sites.
    let Ok(conf) = AllocatorConfig::parse(&run.conf) else {
        return Ok(None);
    };
    let spec = DeviceSpec { addresses: source.address_script(), ..DeviceSpec::sim(run.capacity) };
    let owners = crate::gpu_run::segment_owners(run.allocator, &conf, &spec, source.events()?, run.on_oom)?;
    let (at, shown) = shown_segments(run);
    let (segments, ids) = if at == "OOM" { (owners.at_oom, owners.oom_owners) } else { (owners.at_peak.segments, owners.at_peak.owners) };
    Ok((segments == shown).then(|| block_sites(&ids, sites)))
}

const VIEW_CSS: &str = "#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #888;padding:4px 8px;font-size:12px;white-space:pre;box-shadow:0 1px 4px rgba(0,0,0,.2)}svg{border:1px solid #eee;display:block}.legend{font-size:13px}.sw{display:inline-block;width:14px;height:10px;margin:0 4px 0 10px}.sw.live{background:#4c78a8}.sw.free{background:#ddd}#summary{font-size:13px;color:#444}";

const VIEW_SCRIPT: &str = r##"<script>
//<![CDATA[
(function () {
  var NS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("data").textContent);
  var tip = document.getElementById("tip");
  function fmt(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = b;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(v) : v.toFixed(v >= 100 ? 1 : 2)) + " " + u[i];
  }
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function show(text, ev) {
    tip.textContent = text; tip.hidden = false;
    tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
  }
  function hide() { tip.hidden = true; }
  function colour(key) {
    var h = 2166136261;
    for (var i = 0; i < key.length; i++) { h = Math.imul(h ^ key.charCodeAt(i), 16777619) >>> 0; }
    return "hsl(" + (h % 360) + ",55%," + (45 + (h >> 9) % 20) + "%)";
  }

  function drawTimeline(run) {
    var svg = document.getElementById("timeline");
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var W = 1000, H = 280, L = 70, R = 20, T = 14, B = 36;
    var pts = run.timeline;
    var xmax = Math.max(1, pts.length ? pts[pts.length - 1][0] : 1, run.at_x, run.oom ? run.oom.x : 0);
    var ymax = Math.max(1, run.peak_reserved, run.capacity < 4 * run.peak_reserved ? run.capacity : 0) * 1.05;
    function X(v) { return L + (W - L - R) * v / xmax; }
    function Y(v) { return T + (H - T - B) * (1 - v / ymax); }
    for (var i = 0; i <= 4; i++) {
      var v = ymax * i / 4;
      el("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: "#eee" }, svg);
      el("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11 }, svg).textContent = fmt(v);
    }
    el("text", { x: (L + W) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12 }, svg).textContent = run.x_label;
    for (var j = 0; j <= 5; j++) {
      var xv = Math.round(xmax * j / 5);
      el("text", { x: X(xv), y: H - B + 14, "text-anchor": "middle", "font-size": 11 }, svg).textContent = String(xv);
    }
    if (run.capacity <= ymax) {
      el("line", { x1: L, x2: W - R, y1: Y(run.capacity), y2: Y(run.capacity), stroke: "#c00", "stroke-dasharray": "5,4" }, svg);
      el("text", { x: W - R - 4, y: Y(run.capacity) - 4, "text-anchor": "end", "font-size": 11, fill: "#c00" }, svg).textContent = "capacity " + fmt(run.capacity);
    }
    function line(k, c, name) {
      var d = pts.map(function (p, n) { return (n ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[k]).toFixed(1); }).join("");
      el("path", { d: d, fill: "none", stroke: c, "stroke-width": 2, "data-series": name }, svg);
    }
    line(2, "#4c78a8", "reserved");
    line(1, "#f58518", "allocated");
    function marker(x, colour, dy, text) {
      el("line", { x1: X(x), x2: X(x), y1: T, y2: H - B, stroke: colour, "stroke-dasharray": "3,3" }, svg);
      el("text", { x: X(x) + 4, y: T + dy, "font-size": 11, fill: colour }, svg).textContent = text;
    }
    if (run.at !== "OOM") {
      // The moment itself, as the headline and the map give it (the lines are each sample's maxima).
      marker(run.at_x, "#333", 12, "peak reserved " + fmt(run.peak_reserved) + ", " + fmt(run.allocated_at_peak) + " allocated at that moment" + (run.segments.length ? " (segment map below)" : ""));
      el("circle", { cx: X(run.at_x), cy: Y(run.peak_reserved), r: 4, fill: "#4c78a8", stroke: "#fff" }, svg);
      el("circle", { cx: X(run.at_x), cy: Y(run.allocated_at_peak), r: 4, fill: "#f58518", stroke: "#fff", "data-series": "allocated-at-peak" }, svg);
    }
    if (run.oom) {
      marker(run.oom.x, "#c00", run.at === "OOM" ? 12 : 26, "OOM at " + run.x_label + " " + run.oom.x + " (" + run.oom.cause + ", " + fmt(run.oom.requested) + " requested)" + (run.at === "OOM" ? ": segment map below" : ""));
    }
    el("text", { x: W - R - 8, y: H - B - 26, "text-anchor": "end", "font-size": 12, fill: "#4c78a8" }, svg).textContent = "reserved (max within each sample)";
    el("text", { x: W - R - 8, y: H - B - 10, "text-anchor": "end", "font-size": 12, fill: "#f58518" }, svg).textContent = "allocated (max within each sample; dots: at the peak moment)";
    var cursor = el("line", { x1: 0, x2: 0, y1: T, y2: H - B, stroke: "#999", visibility: "hidden" }, svg);
    svg.onmousemove = function (ev) {
      var box = svg.getBoundingClientRect();
      var xv = (ev.clientX - box.left - L) / (W - L - R) * xmax;
      var best = null;
      pts.forEach(function (p) { if (best === null || Math.abs(p[0] - xv) < Math.abs(best[0] - xv)) { best = p; } });
      if (!best) { return; }
      cursor.setAttribute("x1", X(best[0])); cursor.setAttribute("x2", X(best[0])); cursor.setAttribute("visibility", "visible");
      show(run.x_label + " " + best[0] + "\nreserved " + fmt(best[2]) + "\nallocated " + fmt(best[1]), ev);
    };
    svg.onmouseleave = function () { cursor.setAttribute("visibility", "hidden"); hide(); };
  }

  function drawSegments(run) {
    var svg = document.getElementById("segments");
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var segs = run.segments;
    var total = segs.reduce(function (a, s) { return a + s[1]; }, 0);
    var W = 1000, ROW = 18, GAP = 6;
    var rows = Math.max(1, Math.min(48, Math.ceil(segs.length / 2) || 1));
    // Whole bytes per row, so the row arithmetic below is exact.
    var per = Math.max(1, Math.ceil(total / rows));
    var drawn = 0, offset = 0, held = 0, pinned = 0;
    segs.forEach(function (s, si) {
      var live = s[5].some(function (b) { return b[2] === 1; });
      var start = offset;
      s[5].forEach(function (b, bi) {
        if (b[2] === 1) { held += b[0]; } else if (live) { pinned += b[0]; }
        var a = offset, z = offset + b[0];
        while (a < z) {
          var row = Math.floor(a / per), e = Math.min(z, (row + 1) * per);
          if (e <= a) { e = z; }
          var x = W * (a - row * per) / per, w = Math.max(0.5, W * (e - a) / per);
          var site = b[3] >= 0 ? data.sites[b[3]] : null;
          var r = el("rect", { x: x.toFixed(2), y: row * (ROW + GAP), width: w.toFixed(2), height: ROW,
            fill: b[2] === 1 ? colour(site || String(b[1])) : "#ddd", stroke: "#fff", "stroke-width": 0.3, "data-seg": si, "data-block": bi }, svg);
          r.onmousemove = hover;
          drawn++;
          a = e;
        }
        offset = z;
      });
      var row0 = Math.floor(start / per);
      el("rect", { x: (W * (start - row0 * per) / per).toFixed(2), y: row0 * (ROW + GAP) - 2, width: 1.5, height: ROW + 4, fill: "#222" }, svg);
    });
    svg.setAttribute("height", Math.max(40, Math.ceil(total / per) * (ROW + GAP)));
    // The colour key: the colours holding the most live bytes, with what each stands for.
    var byKey = {}, colourOf = {};
    segs.forEach(function (s) {
      s[5].forEach(function (b) {
        if (b[2] !== 1) { return; }
        var site = b[3] >= 0 ? data.sites[b[3]] : null;
        var k = site || "requests of " + fmt(b[1]);
        byKey[k] = (byKey[k] || 0) + b[0];
        colourOf[k] = colour(site || String(b[1]));  // (as the blocks are drawn)
      });
    });
    var keys = Object.keys(byKey).sort(function (a, b) { return byKey[b] - byKey[a]; });
    var keyEl = document.getElementById("key");
    while (keyEl.firstChild) { keyEl.removeChild(keyEl.firstChild); }
    keys.slice(0, 10).forEach(function (k) {
      var sw = document.createElement("span");
      sw.className = "sw";
      sw.style.background = colourOf[k];
      keyEl.appendChild(sw);
      keyEl.appendChild(document.createTextNode(k + " (" + fmt(byKey[k]) + ") "));
    });
    if (keys.length > 10) { keyEl.appendChild(document.createTextNode("… and " + (keys.length - 10) + " more (hover a block)")); }
    document.documentElement.setAttribute("data-key-entries", String(Math.min(10, keys.length)));
    svg.onmouseleave = hide;
    document.getElementById("map-title").textContent = "Segment map at the " + run.at + " (" + segs.length + " segments, " + fmt(total) + " reserved, " + fmt(per) + " per row)";
    document.getElementById("summary").textContent = segs.length
      ? "at the " + run.at + ": " + fmt(total) + " reserved = " + fmt(held) + " in live blocks + " + fmt(pinned) + " free inside segments that hold live blocks + " + fmt(total - held - pinned) + " in wholly free segments"
      : "this policy keeps no segments (nothing to map)";
    return drawn;
  }

  function hover(ev) {
    var run = data.runs[Number(document.getElementById("run").value)];
    var s = run.segments[Number(ev.target.getAttribute("data-seg"))];
    var b = s[5][Number(ev.target.getAttribute("data-block"))];
    var off = 0;
    for (var i = 0; i < Number(ev.target.getAttribute("data-block")); i++) { off += s[5][i][0]; }
    var lines = [
      "block " + fmt(b[0]) + (b[2] === 1 ? " (requested " + fmt(b[1]) + ")" : ""),
      "state " + (b[2] === 1 ? "active_allocated" : "inactive (free, cached)"),
      "stream " + s[2],
      "segment 0x" + s[0].toString(16) + " + " + fmt(off) + ", " + s[3] + " pool, " + fmt(s[1]) + (s[4] ? ", expandable" : ""),
    ];
    if (b[3] >= 0) { lines.push("allocated at " + data.sites[b[3]]); }
    show(lines.join("\n"), ev);
  }

  var select = document.getElementById("run");
  data.runs.forEach(function (r, i) {
    var o = document.createElement("option");
    o.value = String(i); o.textContent = r.label + (r.oom ? " (OOM)" : "");
    select.appendChild(o);
  });
  function draw() {
    var run = data.runs[Number(select.value)];
    drawTimeline(run);
    var n = drawSegments(run);
    document.documentElement.setAttribute("data-blocks-drawn", String(n));
    // Hovers over the first block, and the first with an allocation site, must name them
    // (checked by the browser test).
    var rects = document.querySelectorAll("#segments rect[data-block]");
    function probe(r, attr, line) {
      r.dispatchEvent(new MouseEvent("mousemove", { clientX: 1, clientY: 1, bubbles: true }));
      var lines = tip.textContent.split("\n");
      document.documentElement.setAttribute(attr, line < 0 ? lines[lines.length - 1] : lines[line]);
      hide();
    }
    if (rects.length) { probe(rects[0], "data-hover", 0); }
    for (var i = 0; i < rects.length; i++) {
      var s = run.segments[Number(rects[i].getAttribute("data-seg"))];
      if (s[5][Number(rects[i].getAttribute("data-block"))][3] >= 0) { probe(rects[i], "data-hover-site", -1); break; }
    }
  }
  select.onchange = draw;
  draw();
  document.documentElement.setAttribute("data-runs", String(data.runs.length));
  document.documentElement.setAttribute("data-ready", "1");
})();
//]]>
</script>"##;
