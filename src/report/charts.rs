//! The charts, each rendered to an SVG string with plotters' SVG backend (text is written as
//! `<text>` elements: no system fonts are needed to render or to view them).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::style::{byte_unit, clip, color_for, wrap};

pub type ChartResult = Result<String, String>;

pub(super) fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("chart rendering failed: {e:?}")
}

/// The legend box every chart draws: `font` px labels on a white panel of opacity `opacity`,
/// with a light grey border, at `at`.
pub(super) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
    font: u32,
    opacity: f64,
) -> Result<(), String>
where
    CT::From: Clone,
{
    chart
        .configure_series_labels()
        .position(at)
        .label_font((FONT, font))
        .background_style(WHITE.mix(opacity))
        .border_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(err)
}

const W: u32 = 960;
const H: u32 = 540;
/// The bar charts' layout, in pixels (the legend's headroom is worked out from it).
const BAR_CAPTION_PX: u32 = 30;
const BAR_MARGIN_PX: u32 = 14;
const BAR_X_LABEL_AREA_PX: u32 = 48;
const BAR_Y_LABEL_AREA_PX: u32 = 64;
/// The height of one legend entry at 12 px text.
const LEGEND_ROW_PX: f64 = 16.0;
pub(super) const FONT: &str = "sans-serif";

/// One line of a line chart.
pub struct Line {
    pub label: String,
    pub color_key: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// A marker with a label (an OOM point).
pub struct Marker {
    pub label: String,
    pub at: (f64, f64),
}

pub(super) fn root(buf: &mut String, size: (u32, u32)) -> DrawingArea<SVGBackend<'_>, Shift> {
    let root = SVGBackend::with_string(buf, size).into_drawing_area();
    let _ = root.fill(&WHITE);
    root
}

/// Where a chart's legend goes (chosen where the data leaves room).
pub use plotters::chart::SeriesLabelPosition as LegendAt;

/// Tick labels with as many decimals as the axis span needs.
fn tick(v: f64, span: f64) -> String {
    if span >= 20.0 {
        format!("{v:.0}")
    } else if span >= 2.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Lines over x; y in bytes (the unit is chosen from the data) unless `y_is_bytes` is false.
pub fn lines(title: &str, x_desc: &str, y_desc: &str, y_is_bytes: bool, series: &[Line], markers: &[Marker], legend_at: LegendAt) -> ChartResult {
    let mut buf = String::new();
    {
        let root = root(&mut buf, (W, H));
        let xs = || series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let x_max = xs().fold(f64::MIN, f64::max);
        let x_min = xs().fold(f64::MAX, f64::min).min(0.0);
        let x_max = if x_max <= x_min { x_min + 1.0 } else { x_max };
        let x_span = x_max - x_min;
        let y_raw_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).chain(markers.iter().map(|m| m.at.1)).fold(1.0f64, f64::max);
        let (div, unit) = if y_is_bytes { byte_unit(y_raw_max) } else { (1.0, "") };
        // Lines that share a label (the repetitions of one run) share one legend entry.
        let mut legend_labels: Vec<&str> = Vec::new();
        for s in series {
            if !legend_labels.contains(&s.label.as_str()) {
                legend_labels.push(&s.label);
            }
        }
        // Headroom above the data for a legend placed at the top.
        let headroom = match legend_at {
            LegendAt::UpperLeft | LegendAt::UpperRight | LegendAt::UpperMiddle => 1.08 + 0.055 * legend_labels.len() as f64,
            _ => 1.08,
        };
        let y_max = y_raw_max / div * headroom;
        let y_label = if unit.is_empty() { y_desc.to_string() } else { format!("{y_desc} ({unit})") };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(x_min..x_max + x_span * 0.02, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_label)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .x_label_formatter(&|v| tick(*v, x_span))
            .y_label_formatter(&|v| tick(*v, y_max))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        let mut labelled: Vec<&str> = Vec::new();
        for s in series {
            let color = color_for(&s.color_key);
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x, y / div)).collect();
            let style = ShapeStyle::from(&color).stroke_width(2);
            let drawn = if s.dashed {
                chart.draw_series(DashedLineSeries::new(pts, 6, 4, style)).map_err(err)?
            } else {
                chart.draw_series(LineSeries::new(pts, style)).map_err(err)?
            };
            if !labelled.contains(&s.label.as_str()) {
                labelled.push(&s.label);
                drawn.label(clip(&s.label, 56)).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ShapeStyle::from(&color).stroke_width(3)));
            }
        }
        for m in markers {
            let at = (m.at.0, m.at.1 / div);
            chart.draw_series(std::iter::once(Cross::new(at, 8, ShapeStyle::from(&RED).stroke_width(3)))).map_err(err)?;
            chart.draw_series(std::iter::once(Text::new(clip(&m.label, 48), (at.0, at.1), (FONT, 14).into_font().color(&RED)))).map_err(err)?;
        }
        draw_legend(&mut chart, legend_at, 13, 0.85)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// One bar: (series label, colour key, value, optional (low, high) whisker).
pub type Bar = (String, String, f64, Option<(f64, f64)>);

/// One bar group: a category on the x axis and one value per series.
pub struct BarGroup {
    pub category: String,
    pub bars: Vec<Bar>,
}

pub struct BarOptions<'a> {
    pub title: &'a str,
    pub y_desc: &'a str,
    pub log: bool,
    pub y_is_bytes: bool,
    /// A horizontal reference line (e.g. 1.0 for the ideal ratio).
    pub reference: Option<(f64, &'a str)>,
}

/// Grouped bars: categories along x, one coloured bar per series inside each group.
pub fn bars(groups: &[BarGroup], o: &BarOptions) -> ChartResult {
    let mut buf = String::new();
    {
        let root = root(&mut buf, (W, H));
        draw_bars(&root, groups, o)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// Two bar charts side by side in one SVG.
pub fn bars_pair(left: (&[BarGroup], &BarOptions), right: (&[BarGroup], &BarOptions)) -> ChartResult {
    let mut buf = String::new();
    {
        let root = root(&mut buf, (W, H));
        let (l, r) = root.split_horizontally(W / 2);
        draw_bars(&l, left.0, left.1)?;
        draw_bars(&r, right.0, right.1)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

fn draw_bars(area: &DrawingArea<SVGBackend<'_>, Shift>, groups: &[BarGroup], o: &BarOptions) -> Result<(), String> {
    let values = groups.iter().flat_map(|g| g.bars.iter().map(|b| b.3.map(|w| w.1).unwrap_or(b.2).max(b.2)));
    let y_raw_max = values.fold(0.0f64, f64::max).max(o.reference.map(|r| r.0).unwrap_or(0.0));
    let (div, unit) = if o.y_is_bytes { byte_unit(y_raw_max.abs().max(1.0)) } else { (1.0, "") };
    let y_min_raw = groups.iter().flat_map(|g| g.bars.iter().map(|b| b.2)).fold(0.0f64, f64::min);
    let y_label = if unit.is_empty() { o.y_desc.to_string() } else { format!("{} ({unit})", o.y_desc) };
    let n = groups.len().max(1) as f64;
    let mut series_labels: Vec<(String, String)> = Vec::new();
    for g in groups {
        for b in &g.bars {
            if !series_labels.iter().any(|s| s.0 == b.0) {
                series_labels.push((b.0.clone(), b.1.clone()));
            }
        }
    }
    // A legend that only repeats the x axis (one bar per group, named as its group) is left out.
    let legend_repeats_axis = groups.iter().all(|g| g.bars.len() == 1 && g.bars[0].0 == g.category);
    if legend_repeats_axis {
        series_labels.clear();
    }
    let legend_rows = series_labels.len() + o.reference.is_some() as usize;
    // The legend sits in the plot's upper right: the y range leaves it that share of the height,
    // so no bar or whisker runs under it.
    let (area_w, area_h) = area.dim_in_pixel();
    let plot_h = (area_h as f64 - (BAR_CAPTION_PX + 2 * BAR_MARGIN_PX + BAR_X_LABEL_AREA_PX) as f64).max(100.0);
    let legend_share = if legend_rows == 0 { 0.0 } else { ((legend_rows as f64 * LEGEND_ROW_PX + 24.0) / plot_h).min(0.6) };
    // Log scale is drawn in log10 space with labels printed back as plain numbers.
    let (to_y, y_min, y_max): (Box<dyn Fn(f64) -> f64>, f64, f64) = if o.log {
        let positive_min = groups.iter().flat_map(|g| g.bars.iter().map(|b| b.2 / div)).filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
        let lo = if positive_min == f64::MAX { 0.1 } else { (positive_min / 2.0).max(0.1) };
        let hi = (y_raw_max / div * 3.0).max(lo * 10.0);
        let (lo_log, top_log) = (lo.log10().floor(), (y_raw_max / div).max(lo).log10() + 0.05);
        let hi_log = hi.log10().ceil().max(((top_log - legend_share * lo_log) / (1.0 - legend_share)).ceil());
        (Box::new(move |v: f64| v.max(lo).log10()), lo_log, hi_log)
    } else {
        let top = y_raw_max / div;
        let lo = (y_min_raw / div * 1.15).min(0.0);
        let hi = (top * 1.15).max((top * 1.05 - legend_share * lo) / (1.0 - legend_share)).max(1e-9);
        (Box::new(|v: f64| v), lo, hi)
    };
    let log = o.log;
    let y_fmt = move |v: &f64| {
        let x = if log { 10f64.powf(*v) } else { *v };
        if log && (v - v.round()).abs() > 1e-6 {
            String::new()
        } else if x.abs() >= 1e6 {
            format!("{:.0}M", x / 1e6)
        } else if x.abs() >= 1e4 {
            format!("{:.0}k", x / 1e3)
        } else if x.abs() >= 100.0 || log {
            format!("{x:.0}")
        } else if x.abs() >= 1.0 {
            format!("{x:.1}")
        } else {
            format!("{x:.2}")
        }
    };
    let mut chart = ChartBuilder::on(area)
        .caption(o.title, (FONT, 18))
        .margin(BAR_MARGIN_PX)
        .x_label_area_size(BAR_X_LABEL_AREA_PX)
        .y_label_area_size(BAR_Y_LABEL_AREA_PX)
        .build_cartesian_2d(-0.6f64..(n - 0.4), y_min..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len().max(1) * 2 + 1)
        // The group names are drawn below, on up to two lines each.
        .x_label_formatter(&|_| String::new())
        .y_labels(if log { ((y_max - y_min) as usize + 1).max(2) } else { 10 })
        .y_label_formatter(&y_fmt)
        .y_desc(y_label.as_str())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    // Each group's name, wrapped to its width (13 px text averages about 6.6 px a character).
    let group_px = (area_w as f64 - (BAR_Y_LABEL_AREA_PX + 2 * BAR_MARGIN_PX) as f64) / n;
    let label_chars = ((group_px - 4.0) / 6.6).max(4.0) as usize;
    let label_style = TextStyle::from((FONT, 13))
        .pos(plotters::style::text_anchor::Pos::new(plotters::style::text_anchor::HPos::Center, plotters::style::text_anchor::VPos::Top));
    for (gi, g) in groups.iter().enumerate() {
        for (li, line) in wrap(&g.category, label_chars, 2).into_iter().enumerate() {
            let text = EmptyElement::at((gi as f64, y_min)) + Text::new(line, (0, 8 + 15 * li as i32), label_style.clone());
            chart.draw_series(std::iter::once(text)).map_err(err)?;
        }
    }
    let base = to_y(0.0);
    for (gi, g) in groups.iter().enumerate() {
        let k = g.bars.len().max(1) as f64;
        let width = 0.8 / k;
        for (bi, (_, key, v, whisker)) in g.bars.iter().enumerate() {
            let x0 = gi as f64 - 0.4 + bi as f64 * width;
            let color = color_for(key);
            if log && *v <= 0.0 {
                continue; // nothing to draw on a log axis; the tables give the zero
            }
            let top = to_y(*v / div);
            let (lo, hi) = if log {
                (y_min, top)
            } else if top < base {
                (top, base)
            } else {
                (base, top)
            };
            chart.draw_series(std::iter::once(Rectangle::new([(x0 + width * 0.08, lo), (x0 + width * 0.92, hi)], color.filled()))).map_err(err)?;
            if let Some((a, b)) = whisker {
                let xm = x0 + width / 2.0;
                chart
                    .draw_series(std::iter::once(PathElement::new(vec![(xm, to_y(a / div)), (xm, to_y(b / div))], ShapeStyle::from(&BLACK).stroke_width(2))))
                    .map_err(err)?;
            }
        }
    }
    if let Some((r, label)) = o.reference {
        let r = to_y(r / div);
        chart
            .draw_series(DashedLineSeries::new(vec![(-0.6, r), (n - 0.4, r)], 6, 4, ShapeStyle::from(&BLACK).stroke_width(1)))
            .map_err(err)?
            .label(label.to_string())
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ShapeStyle::from(&BLACK)));
    }
    for (label, key) in &series_labels {
        let color = color_for(key);
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(err)?
            .label(clip(label, 40))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    if legend_rows > 0 {
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 12, 0.85)?;
    }
    Ok(())
}

/// One segment row of a segment map: (label, [(bytes, allocated?)] in address order).
pub struct SegmentRow {
    pub label: String,
    pub blocks: Vec<(u64, bool)>,
}

/// Segments as horizontal bars, live blocks coloured, free pieces grey (like PyTorch's
/// "Allocator State History").
pub fn segment_map(title: &str, color_key: &str, rows: &[SegmentRow]) -> ChartResult {
    let mut buf = String::new();
    {
        let height = (120 + rows.len() as u32 * 18).clamp(240, 1400);
        let root = root(&mut buf, (W, height));
        let max = rows.iter().map(|r| r.blocks.iter().map(|b| b.0).sum::<u64>()).max().unwrap_or(1) as f64;
        let (div, unit) = byte_unit(max);
        let n = rows.len().max(1);
        let labels: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(0f64..max / div * 1.02, -0.5f64..(n as f64 - 0.5))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.min(80))
            .y_label_formatter(&|v| {
                let i = v.round();
                // Row 0 is drawn at the top.
                if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[labels.len() - 1 - i as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_desc(format!("offset in segment ({unit})"))
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(err)?;
        let live = color_for(color_key);
        let free = RGBColor(215, 215, 215);
        for (ri, row) in rows.iter().enumerate() {
            let y = (n - 1 - ri) as f64;
            let mut x = 0.0;
            for &(size, allocated) in &row.blocks {
                let w = size as f64 / div;
                let c = if allocated { live } else { free };
                chart.draw_series(std::iter::once(Rectangle::new([(x, y - 0.38), (x + w, y + 0.38)], c.filled()))).map_err(err)?;
                chart
                    .draw_series(std::iter::once(Rectangle::new([(x, y - 0.38), (x + w, y + 0.38)], ShapeStyle::from(&WHITE).stroke_width(1))))
                    .map_err(err)?;
                x += w;
            }
        }
        for (label, c) in [("live block", live), ("free (cached) piece", free)] {
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
        }
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 12, 0.9)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// (x, y, width, height, fill, stroke) of every rectangle of an SVG.
    fn rects(svg: &str) -> Vec<(f64, f64, f64, f64, String, String)> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        let num = |n: &roxmltree::Node, a: &str| n.attribute(a).unwrap().parse::<f64>().unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("rect"))
            .map(|n| {
                (
                    num(&n, "x"),
                    num(&n, "y"),
                    num(&n, "width"),
                    num(&n, "height"),
                    n.attribute("fill").unwrap_or("").to_string(),
                    n.attribute("stroke").unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    fn texts(svg: &str) -> Vec<(f64, String)> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| (n.attribute("x").unwrap().parse().unwrap(), n.text().unwrap_or("").trim().to_string()))
            .collect()
    }

    fn options(title: &str, log: bool) -> BarOptions<'_> {
        BarOptions { title, y_desc: "value", log, y_is_bytes: false, reference: None }
    }

    #[test]
    fn no_bar_runs_under_the_legend() {
        // The tallest bars are in the last group, under the legend's corner.
        let series = ["pytorch default", "expandable", "split<512M", "roundup", "gc", "nocache", "ideal"];
        let groups: Vec<BarGroup> = (0..9)
            .map(|g| BarGroup {
                category: format!("workload-{g}"),
                bars: series.iter().enumerate().map(|(i, s)| (s.to_string(), s.to_string(), if g == 8 { 10.0 + i as f64 } else { 1.0 }, None)).collect(),
            })
            .collect();
        for log in [false, true] {
            let svg = bars(&groups, &BarOptions { reference: Some((1.0, "ideal = 1.0")), ..options("t", log) }).unwrap();
            let all = rects(&svg);
            let legend = all.iter().find(|r| r.5 == "#C8C8C8").expect("a legend panel");
            // Bars, not the legend's swatches (which lie inside its panel; a bar stands on the axis).
            let inside = |r: &(f64, f64, f64, f64, String, String)| {
                r.0 >= legend.0 && r.1 >= legend.1 && r.0 + r.2 <= legend.0 + legend.2 && r.1 + r.3 <= legend.1 + legend.3
            };
            let bar_rects: Vec<_> = all.iter().filter(|r| r.5 == "none" && r.4 != "#FFFFFF" && r.3 > 0.0 && r.2 < 50.0 && !inside(r)).collect();
            assert!(bar_rects.len() >= 9 * series.len(), "every bar drawn: {}", bar_rects.len());
            for b in bar_rects {
                let overlaps = b.0 < legend.0 + legend.2 && legend.0 < b.0 + b.2 && b.1 < legend.1 + legend.3 && legend.1 < b.1 + b.3;
                assert!(!overlaps, "log {log}: bar {b:?} runs under the legend {legend:?}");
            }
        }
    }

    #[test]
    fn a_legend_that_repeats_the_axis_is_left_out() {
        let one_each = |name: &str| BarGroup { category: name.into(), bars: vec![(name.into(), name.into(), 3.0, Some((2.0, 4.0)))] };
        let svg = bars(&["glibc", "jemalloc", "mimalloc"].map(one_each), &options("t", false)).unwrap();
        assert!(!rects(&svg).iter().any(|r| r.5 == "#C8C8C8"), "no legend panel");
        assert_eq!(texts(&svg).iter().filter(|t| t.1 == "jemalloc").count(), 1, "named once, on the axis");
        // Two series in a group need the legend.
        let two = BarGroup { category: "run".into(), bars: vec![("malloc".into(), "a".into(), 1.0, None), ("free".into(), "b".into(), 2.0, None)] };
        assert!(rects(&bars(&[two], &options("t", false)).unwrap()).iter().any(|r| r.5 == "#C8C8C8"));
    }

    #[test]
    fn group_names_that_share_a_prefix_stay_apart() {
        let names = [
            "gpt3-xl-1.3b",
            "gpt3-xl-1.3b-captured",
            "gpt3-xl-1.3b-ddp",
            "model-switch",
            "model-switch-captured",
            "serving-llama7b",
            "serving-llama7b-captured",
            "llama2-7b-80g",
            "llama2-7b-80g-captured",
        ];
        // (Nine groups of two bars: 13 characters a line.)
        let groups: Vec<BarGroup> = names
            .iter()
            .map(|n| BarGroup { category: n.to_string(), bars: vec![("a".into(), "a".into(), 1.0, None), ("b".into(), "b".into(), 2.0, None)] })
            .collect();
        let svg = bars(&groups, &options("t", false)).unwrap();
        // The lines of one group's label share its x: joined, they spell the name.
        let mut by_x: BTreeMap<i64, String> = BTreeMap::new();
        for (x, t) in texts(&svg) {
            by_x.entry(x as i64).or_default().push_str(&t);
        }
        for n in names {
            assert!(by_x.values().any(|joined| joined == n), "{n} is written whole: {by_x:?}");
        }
    }
}
