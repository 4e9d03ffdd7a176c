//! Plots the stream-triggered benchmarks from their JSON lines (as `faces` and `st_gpu bench`
//! print them; a `[rank] ` prefix from `sucl run` is fine) into one SVG:
//!
//! - left: Faces time per share (max over ranks), baseline against stream-triggered, per run,
//!   with the host time blocked per share as thin bars beside each;
//! - right: the trigger round trip per transport and rank, and a batch of 26 send/recv pairs
//!   through the queue against the same NCCL group called directly.
//!
//! `stream_plot OUT.svg INPUT...` (scripts/gpu-stream.sh runs it on its outputs). Exits non-zero
//! when the inputs hold no benchmark line.

use clap::Parser;
use plotters::prelude::*;
use serde_json::Value;

/// Plots the stream-triggered benchmarks (the JSON lines `faces` and `st_gpu bench` print) into
/// one SVG: Faces time per share, baseline against stream-triggered, and the trigger round trip
/// and a 26-pair batch per transport. Exits non-zero when the inputs hold no benchmark line.
#[derive(Parser)]
#[command(name = "stream_plot", after_help = "Example:\n  target/release/examples/stream_plot stream.svg faces.log st_gpu_bench.log")]
struct Args {
    /// The SVG file to write.
    #[arg(value_name = "OUT.svg")]
    out: String,
    /// Files holding the benchmarks' output (a `[rank] ` prefix from `sucl run` is fine).
    #[arg(value_name = "INPUT", required = true)]
    inputs: Vec<String>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args.out, &args.inputs) {
        eprintln!("stream_plot: {e}");
        std::process::exit(1);
    }
}

/// Every JSON object with a `bench` key found in `paths`, one per line.
fn records(paths: &[String]) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let mut out = vec![];
    for p in paths {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
        for line in text.lines() {
            let Some(at) = line.find('{') else { continue };
            if let Ok(v) = serde_json::from_str::<Value>(&line[at..]) {
                if v.get("bench").is_some() {
                    out.push(v);
                }
            }
        }
    }
    Ok(out)
}

fn num(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

fn text(v: &Value, k: &str) -> String {
    v.get(k).map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string())).unwrap_or_default()
}

/// One group of bars: a label and (series index, value) pairs.
struct Group {
    label: String,
    bars: Vec<(usize, f64)>,
}

fn run(out: &str, inputs: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let recs = records(inputs)?;
    let faces: Vec<Group> = recs
        .iter()
        .filter(|r| text(r, "bench") == "faces")
        .map(|r| {
            let input: Vec<String> = text(r, "input").split_whitespace().map(str::to_string).collect();
            let size = if input.get(3).map(String::as_str) == Some("4") {
                "small".to_string()
            } else {
                format!("m{}", input.get(3).cloned().unwrap_or_default())
            };
            let label = format!("{} {} {}r {size}", text(r, "on"), text(r, "transport"), text(r, "ranks"));
            let bars = [("baseline_us", 0), ("triggered_us", 1), ("baseline_blocked_us", 2), ("triggered_blocked_us", 3)]
                .iter()
                .filter_map(|(k, s)| num(r, k).map(|v| (*s, v)))
                .collect();
            Group { label, bars }
        })
        .collect();
    let batch: Vec<Group> = recs
        .iter()
        .filter(|r| text(r, "bench") == "st_batch")
        .map(|r| {
            let label = format!("{} r{}", text(r, "transport"), text(r, "rank"));
            let bars =
                [("trigger_rtt_us", 0), ("queue_us", 1), ("direct_us", 2)].iter().filter_map(|(k, s)| num(r, k).map(|v| (*s, v))).collect();
            Group { label, bars }
        })
        .collect();
    if faces.is_empty() && batch.is_empty() {
        return Err(format!("no benchmark JSON lines in {}", inputs.join(", ")).into());
    }
    let root = SVGBackend::new(out, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(900);
    let faces_series = [
        ("baseline", RGBColor(70, 110, 200), 1.0),
        ("stream-triggered", RGBColor(220, 90, 40), 1.0),
        ("baseline: host blocked", RGBColor(150, 175, 230), 0.45),
        ("triggered: host blocked", RGBColor(240, 170, 130), 0.45),
    ];
    bars(&left, "Faces: time per share (µs, max over ranks)", &faces, &faces_series)?;
    let batch_series = [
        ("trigger round trip", RGBColor(40, 150, 80), 1.0),
        ("26 pairs via queue", RGBColor(220, 90, 40), 1.0),
        ("26 pairs, NCCL group direct", RGBColor(70, 110, 200), 1.0),
    ];
    bars(&right, "Trigger round trip and 26-pair batch (µs)", &batch, &batch_series)?;
    root.present()?;
    println!("stream_plot: wrote {out} ({} Faces runs, {} batch rows)", faces.len(), batch.len());
    Ok(())
}

/// Grouped bars on a log scale; `series` gives each series' name, colour and relative width.
fn bars(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    title: &str,
    groups: &[Group],
    series: &[(&str, RGBColor, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    if groups.is_empty() {
        area.titled(&format!("{title}: no data"), ("sans-serif", 16))?;
        return Ok(());
    }
    let vals: Vec<f64> = groups.iter().flat_map(|g| g.bars.iter().map(|b| b.1)).filter(|v| *v > 0.0).collect();
    let ymin = vals.iter().cloned().fold(f64::MAX, f64::min).max(1e-3) / 2.0;
    let ymax = vals.iter().cloned().fold(1e-3, f64::max) * 2.0;
    let n = groups.len();
    let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(90)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (ymin..ymax).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            // Group i is centred on x = i.
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 11).into_font().transform(FontTransform::Rotate90))
        .y_desc("µs")
        .draw()?;
    let slot = 0.8 / series.len() as f64;
    for (s, (name, color, width)) in series.iter().enumerate() {
        let rects: Vec<Rectangle<(f64, f64)>> = groups
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.bars.iter().find(|b| b.0 == s).map(|b| (i, b.1)))
            .filter(|(_, v)| *v > 0.0)
            .map(|(i, v)| {
                let x0 = i as f64 - 0.4 + s as f64 * slot + slot * (1.0 - width) / 2.0;
                Rectangle::new([(x0, ymin), (x0 + slot * width, v)], color.filled())
            })
            .collect();
        let c = *color;
        chart.draw_series(rects)?.label(*name).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}
