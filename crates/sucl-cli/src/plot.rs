//! SVG plots of benchmark rows: time and bus bandwidth against message size.

use crate::bench::Row;
use plotters::prelude::*;

/// Draws `rows` (one series per backend/op label) into `path`.
pub fn plot(path: &str, title: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    if rows.is_empty() {
        return Err("no rows to plot".into());
    }
    let root = SVGBackend::new(path, (1100, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    // Side-by-side runs interleave their rows: collect each label once, in order of appearance.
    let several_sizes = rows.iter().any(|r| r.ranks != rows[0].ranks);
    let label =
        |r: &Row| if several_sizes { format!("{} {} ({} ranks)", r.backend, r.op, r.ranks) } else { format!("{} {}", r.backend, r.op) };
    let mut labels: Vec<String> = vec![];
    for r in rows {
        let l = label(r);
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    let xs: Vec<f64> = rows.iter().map(|r| r.bytes.max(1) as f64).collect();
    let (xmin, xmax) = (xs.iter().cloned().fold(f64::MAX, f64::min), xs.iter().cloned().fold(1.0, f64::max) * 1.01);
    let tmax = rows.iter().map(|r| r.time_us).fold(1e-3, f64::max) * 1.2;
    let tmin = rows.iter().map(|r| r.time_us).fold(f64::MAX, f64::min).max(1e-3) / 1.2;
    let bmax = rows.iter().map(|r| r.busbw_gbps).fold(1e-3, f64::max) * 1.1;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK, RGBColor(255, 140, 0), RGBColor(120, 60, 20)];
    for (area, is_time) in [(left, true), (right, false)] {
        let caption = if is_time { format!("{title}: time (µs)") } else { format!("{title}: busbw (GB/s)") };
        let mut b = ChartBuilder::on(&area);
        b.caption(caption, ("sans-serif", 16)).margin(10).x_label_area_size(35).y_label_area_size(55);
        if is_time {
            let mut c = b.build_cartesian_2d((xmin..xmax).log_scale(), (tmin..tmax).log_scale())?;
            c.configure_mesh().x_desc("bytes").y_desc("µs").draw()?;
            for (k, l) in labels.iter().enumerate() {
                let pts: Vec<(f64, f64)> =
                    rows.iter().filter(|r| &label(r) == l).map(|r| (r.bytes.max(1) as f64, r.time_us.max(tmin))).collect();
                let col = colors[k % colors.len()];
                c.draw_series(LineSeries::new(pts, col))?
                    .label(l.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], col));
            }
            c.configure_series_labels().border_style(BLACK).background_style(WHITE).draw()?;
        } else {
            let mut c = b.build_cartesian_2d((xmin..xmax).log_scale(), 0.0..bmax)?;
            c.configure_mesh().x_desc("bytes").y_desc("GB/s").draw()?;
            for (k, l) in labels.iter().enumerate() {
                let pts: Vec<(f64, f64)> = rows.iter().filter(|r| &label(r) == l).map(|r| (r.bytes.max(1) as f64, r.busbw_gbps)).collect();
                let col = colors[k % colors.len()];
                c.draw_series(LineSeries::new(pts, col))?
                    .label(l.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], col));
            }
            c.configure_series_labels().border_style(BLACK).background_style(WHITE).draw()?;
        }
    }
    root.present()?;
    Ok(())
}
