//! `ork bench stream --plot`: the streamed run's timeline (loads on the prefetch lane, computes,
//! waits) above bars of prefill tok/s per configuration, drawn with `plotters` as SVG.

use std::path::Path;

use anyhow::{anyhow, Result};
use ork_residency::TraceEvent;
use plotters::prelude::*;

/// Draw `results` (objects with "config" and "tok_s") and the trace `events` into `path`, under
/// the rule for every file ork writes (`ork_io::output`; `inputs` are never replaced).
pub fn stream_svg(
    path: &Path,
    inputs: &[&Path],
    results: &[serde_json::Value],
    events: &[TraceEvent],
) -> Result<()> {
    let mut svg = String::new();
    draw(&mut svg, results, events)?;
    ork_io::output::write_output(path, svg.as_bytes(), inputs)?;
    Ok(())
}

fn draw(svg: &mut String, results: &[serde_json::Value], events: &[TraceEvent]) -> Result<()> {
    let root = SVGBackend::with_string(svg, (1100, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(420);

    draw_timeline(&top, events)?;
    draw_bars(&bottom, results)?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// The plot's area type.
type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// The timeline of the last prefill pass (the events of the timed run): compute, prefetch loads
/// and compute waits, one lane each.
fn draw_timeline(top: &Area<'_>, events: &[TraceEvent]) -> Result<()> {
    // Timeline: the last prefill pass only (the events of the timed run).
    let end = events.iter().map(|e| e.ts + e.dur).fold(0.0, f64::max);
    let start = events
        .iter()
        .filter(|e| e.cat == "compute")
        .map(|e| e.ts)
        .fold(f64::INFINITY, f64::min);
    let t0 = if start.is_finite() { start } else { 0.0 };
    let span_ms = ((end - t0) / 1000.0).max(1e-3);
    let mut chart = ChartBuilder::on(top)
        .caption(
            "streamed prefill timeline (ms since the first compute)",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(90)
        .build_cartesian_2d(0f64..span_ms, 0f64..3f64)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .y_labels(0)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    // Lane names at the left edge, inside each lane.
    chart
        .draw_series(
            [
                "compute (blue)",
                "prefetch loads (green)",
                "compute waits (red)",
            ]
            .iter()
            .enumerate()
            .map(|(i, name)| Text::new(*name, (0.0, i as f64 + 0.95), ("sans-serif", 14))),
        )
        .map_err(|e| anyhow!("{e}"))?;
    let lane_y = |tid: u32| match tid {
        1 => 0.0,
        2 => 1.0,
        _ => 2.0,
    };
    let colour = |cat: &str| match cat {
        "compute" => BLUE.mix(0.7),
        "load" => GREEN.mix(0.7),
        "pack" => MAGENTA.mix(0.7),
        _ => RED.mix(0.8),
    };
    chart
        .draw_series(events.iter().filter(|e| e.ts >= t0).map(|e| {
            let x0 = (e.ts - t0) / 1000.0;
            let x1 = x0 + (e.dur / 1000.0).max(span_ms / 2000.0);
            let y = lane_y(e.tid);
            Rectangle::new([(x0, y + 0.15), (x1, y + 0.85)], colour(e.cat).filled())
        }))
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// Bars: prefill tok/s per configuration.
fn draw_bars(bottom: &Area<'_>, results: &[serde_json::Value]) -> Result<()> {
    let labels: Vec<String> = results
        .iter()
        .map(|r| r["config"].as_str().unwrap_or("?").to_owned())
        .collect();
    let values: Vec<f64> = results
        .iter()
        .map(|r| r["tok_s"].as_f64().unwrap_or(0.0))
        .collect();
    let vmax = values.iter().copied().fold(1.0, f64::max) * 1.25;
    let n = values.len().max(1);
    let mut bars = ChartBuilder::on(bottom)
        .caption("prefill tok/s", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..vmax)
        .map_err(|e| anyhow!("{e}"))?;
    bars.configure_mesh()
        .disable_mesh()
        .x_labels(0)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    bars.draw_series(values.iter().enumerate().map(|(i, v)| {
        Rectangle::new(
            [(i as f64 + 0.2, 0.0), (i as f64 + 0.8, *v)],
            BLUE.mix(0.6).filled(),
        )
    }))
    .map_err(|e| anyhow!("{e}"))?;
    bars.draw_series(values.iter().enumerate().map(|(i, v)| {
        Text::new(
            format!("{}: {v:.1}", labels[i]),
            (i as f64 + 0.2, v + vmax * 0.06),
            ("sans-serif", 15),
        )
    }))
    .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
