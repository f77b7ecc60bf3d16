//! The memory-vs-time chart of an `allocbench advise` search: every configuration at (modelled
//! allocator time, peak reserved), the Pareto front joined, the defaults and the recommendation
//! marked. Configurations stopped early are drawn hollow (their numbers are lower bounds).

use std::path::Path;

use plotters::prelude::*;

use super::charts::{draw_legend, err, root, FONT};
use super::style::{byte_unit, clip, slug};
use super::{write_chart, Section};
use crate::results::{AdviseResult, Candidate, ResultRecord};
use crate::units::format_bytes;

/// The complete, OOM-free configurations no other one beats on both memory and time, by time.
pub fn pareto_front(configs: &[Candidate]) -> Vec<&Candidate> {
    let mut done: Vec<&Candidate> = configs.iter().filter(|c| !c.oom && !c.pruned && c.equivalent_to.is_none()).collect();
    done.sort_by(|a, b| a.modelled_alloc_time_s.total_cmp(&b.modelled_alloc_time_s).then(a.peak_reserved.cmp(&b.peak_reserved)));
    let mut front: Vec<&Candidate> = Vec::new();
    for c in done {
        if front.last().is_none_or(|l| c.peak_reserved < l.peak_reserved) {
            front.push(c);
        }
    }
    front
}

/// Renders one search's chart (SVG).
pub fn render(r: &AdviseResult) -> Result<String, String> {
    let shown: Vec<&Candidate> = r.configs.iter().filter(|c| !c.oom && c.equivalent_to.is_none()).collect();
    let mut buf = String::new();
    {
        let root = root(&mut buf, (960, 540));
        let t_max = shown.iter().map(|c| c.modelled_alloc_time_s).fold(1e-3, f64::max) * 1.05;
        let (y_lo, y_hi) = shown.iter().fold((f64::MAX, 0f64), |(lo, hi), c| (lo.min(c.peak_reserved as f64), hi.max(c.peak_reserved as f64)));
        let (div, unit) = byte_unit(y_hi.max(1.0));
        let pad = ((y_hi - y_lo) * 0.05).max(div * 0.1);
        let (y0, y1) = (((y_lo - pad).max(0.0)) / div, (y_hi + pad) / div);
        let title = format!("advise: peak reserved vs modelled allocator time, {}", r.workload.name);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(0f64..t_max, y0..y1.max(y0 + 0.1))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(format!("modelled allocator time (s), priced with {}", clip(&r.latency_table, 40)))
            .y_desc(format!("peak reserved ({unit})"))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        let at = |c: &Candidate| (c.modelled_alloc_time_s, c.peak_reserved as f64 / div);
        let grey = RGBColor(120, 120, 120);
        chart
            .draw_series(shown.iter().filter(|c| !c.pruned).map(|c| Circle::new(at(c), 3, ShapeStyle::from(&grey).filled())))
            .map_err(err)?
            .label("complete replay")
            .legend(move |(x, y)| Circle::new((x + 10, y), 3, ShapeStyle::from(&grey).filled()));
        chart
            .draw_series(shown.iter().filter(|c| c.pruned).map(|c| Circle::new(at(c), 3, ShapeStyle::from(&grey).stroke_width(1))))
            .map_err(err)?
            .label("stopped early (lower bounds)")
            .legend(move |(x, y)| Circle::new((x + 10, y), 3, ShapeStyle::from(&grey).stroke_width(1)));
        let blue = RGBColor(31, 119, 180);
        chart
            .draw_series(LineSeries::new(pareto_front(&r.configs).into_iter().map(at), ShapeStyle::from(&blue).stroke_width(2)))
            .map_err(err)?
            .label("memory-time front")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ShapeStyle::from(&blue).stroke_width(2)));
        let marks = [
            (r.configs.iter().find(|c| c.conf.is_empty()), "PyTorch defaults", RGBColor(214, 39, 40)),
            (r.recommended.as_ref(), "recommended", RGBColor(44, 160, 44)),
        ];
        for (c, label, color) in marks {
            if let Some(c) = c.filter(|c| !c.oom) {
                chart
                    .draw_series(std::iter::once(Cross::new(at(c), 8, ShapeStyle::from(&color).stroke_width(3))))
                    .map_err(err)?
                    .label(label)
                    .legend(move |(x, y)| Cross::new((x + 10, y), 6, ShapeStyle::from(&color).stroke_width(2)));
            }
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 13, 0.85)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// The advise searches of the report: a finding and the memory-vs-time chart per search.
pub fn section(records: &[ResultRecord], out: &Path) -> anyhow::Result<Option<Section>> {
    let searches: Vec<&AdviseResult> = records.iter().filter_map(|r| if let ResultRecord::Advise(a) = r { Some(a.as_ref()) } else { None }).collect();
    if searches.is_empty() {
        return Ok(None);
    }
    let mut sec = Section::new("Advice: memory against modelled allocator time");
    let secs = |c: &Candidate| format!("{:.3} s", c.modelled_alloc_time_s);
    for r in &searches {
        let defaults = r.configs.iter().find(|c| c.conf.is_empty());
        let Some(pick) = &r.recommended else { continue };
        if pick.oom {
            // Nothing fits: no memory-time front to draw, and the pick's peak is that of a replay
            // that stopped.
            sec.findings.push(format!(
                "advise ({}, {} card, {} configurations): every configuration runs out of memory; `{}` gets furthest (to event {}, step {}).",
                r.workload.name,
                format_bytes(r.capacity),
                r.configs.len(),
                if pick.conf.is_empty() { "(PyTorch's defaults)" } else { &pick.conf },
                pick.oom_event.unwrap_or(0),
                pick.oom_step.unwrap_or(0)
            ));
            continue;
        }
        let vs = match defaults {
            Some(d) if d.oom => format!("the defaults OOM at step {}", d.oom_step.unwrap_or(0)),
            Some(d) => format!("the defaults reserve {} in {}", format_bytes(d.peak_reserved), secs(d)),
            None => "no defaults run".to_string(),
        };
        sec.findings.push(format!(
            "advise ({}, {} card, {} objective, {} configurations): `{}` reserves {} at {} of modelled allocator time and {} device mallocs; {}.",
            r.workload.name,
            format_bytes(r.capacity),
            r.objective,
            r.configs.len(),
            if pick.conf.is_empty() { "(PyTorch's defaults)" } else { &pick.conf },
            format_bytes(pick.peak_reserved),
            secs(pick),
            pick.device_mallocs,
            vs
        ));
        let file = format!("advise-front-{}.svg", slug(&r.workload.name));
        let title = format!("advise ({}): peak reserved vs modelled allocator time, {}", r.objective, r.workload.name);
        sec.charts.push(write_chart(out, file, title, render(r))?);
    }
    Ok(Some(sec))
}
