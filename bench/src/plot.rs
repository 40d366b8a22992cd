//! The SVG latency plot of a report.

use hdrhistogram::Histogram;

use crate::report::{Histograms, Report, TimelinePoint};

/// An SVG a person can look at: the latency percentile distribution (ack, per batch, end to
/// end; log latency over a "nines" axis) beside throughput over time.
pub fn plot_svg(report: &Report, histograms: &Histograms) -> String {
    const W: f64 = 900.0;
    const H: f64 = 360.0;
    const PANEL: f64 = 400.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"16\" font-size=\"13\">{:?} on {}: {:.0} records/s, {:.1} MB/s</text>\n",
        report.workload, report.topic, report.records_per_s, report.mb_per_s
    );
    // Left: percentiles on a nines axis (0, 90, 99, 99.9, 99.99, 99.999) against log latency.
    let (left, top, height) = (50.0, 40.0, 280.0);
    let nines = |q: f64| (-(1.0 - q).log10()).min(5.0) / 5.0 * PANEL;
    let series: Vec<(&str, &str, &Histogram<u64>)> = [
        ("ack", "#1f77b4", &histograms.ack),
        ("batch", "#2ca02c", &histograms.batch),
        ("e2e", "#d62728", &histograms.e2e),
    ]
    .into_iter()
    .filter(|(_, _, h)| !h.is_empty())
    .collect();
    let max = series
        .iter()
        .map(|(_, _, h)| h.max())
        .max()
        .unwrap_or(1)
        .max(10) as f64;
    let y = |us: f64| top + height - (us.max(1.0).log10() / max.log10()) * height;
    for (label, q) in [
        ("p0", 0.0),
        ("p90", 0.9),
        ("p99", 0.99),
        ("p99.9", 0.999),
        ("p99.99", 0.9999),
        ("p99.999", 0.99999),
    ] {
        let x = left + nines(q);
        svg += &format!(
            "<line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>\n",
            top + height,
            top + height + 14.0
        );
    }
    for decade in 0..=(max.log10().ceil() as u32) {
        let us = 10f64.powi(decade as i32);
        let label = if us >= 1e6 {
            format!("{}s", us / 1e6)
        } else if us >= 1e3 {
            format!("{}ms", us / 1e3)
        } else {
            format!("{us}µs")
        };
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n",
            left - 4.0,
            y(us) + 4.0
        );
    }
    for (index, (name, color, histogram)) in series.iter().enumerate() {
        let points: Vec<String> = (0..=100)
            .map(|i| {
                let q = 1.0 - 10f64.powf(-(i as f64) / 20.0);
                let q = if i == 0 { 0.0 } else { q };
                format!(
                    "{:.1},{:.1}",
                    left + nines(q),
                    y(histogram.value_at_quantile(q) as f64)
                )
            })
            .collect();
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{name} latency</text>\n",
            points.join(" "),
            left + 8.0,
            top + 12.0 + 14.0 * index as f64
        );
    }
    // Right: records per second over time.
    let (left, width) = (480.0, PANEL);
    let peak = report
        .timeline
        .iter()
        .map(|p| p.produced_records.max(p.consumed_records))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let seconds = report.timeline.len().max(2) as f64;
    svg += &format!(
        "<text x=\"{left}\" y=\"{:.1}\">records/s (peak {peak:.0}) over {} s</text>\n",
        top - 6.0,
        report.timeline.len()
    );
    svg += &format!(
        "<rect x=\"{left}\" y=\"{top}\" width=\"{width}\" height=\"{height}\" fill=\"none\" stroke=\"#ccc\"/>\n"
    );
    for (name, color, pick) in [
        (
            "produced",
            "#1f77b4",
            (|p: &TimelinePoint| p.produced_records) as fn(&TimelinePoint) -> u64,
        ),
        ("consumed", "#ff7f0e", |p: &TimelinePoint| {
            p.consumed_records
        }),
    ] {
        let points: Vec<String> = report
            .timeline
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "{:.1},{:.1}",
                    left + i as f64 / (seconds - 1.0) * width,
                    top + height - pick(p) as f64 / peak * height
                )
            })
            .collect();
        if points.iter().any(|_| true) {
            svg += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"><title>{name}</title></polyline>\n",
                points.join(" ")
            );
        }
    }
    svg += "</svg>\n";
    svg
}
