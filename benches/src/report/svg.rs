//! A grouped bar chart of one criterion group, written as plain SVG.
//!
//! One cluster of bars per row (parameter), one bar per column (function) with the median's
//! confidence interval as an error bar, a legend, and a y axis in one time unit. When the
//! values span more than [`LOG_SPAN`]x the axis is logarithmic, so that fast and slow
//! structures stay readable side by side.

use std::fmt::Write;

use super::criterion::Group;
use super::format::{Unit, sig, time_unit};

/// Ratio of largest to smallest value above which the y axis is logarithmic.
pub const LOG_SPAN: f64 = 50.0;

const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];
const BAR_W: f64 = 18.0;
const CLUSTER_GAP: f64 = 24.0;
const PLOT_H: f64 = 300.0;
const LEFT: f64 = 80.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 90.0;
const LEGEND_W: f64 = 160.0;

/// The y axis: maps values (in the chosen unit) to heights.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    Linear { max: f64, step: f64 },
    Log { lo_exp: i32, hi_exp: i32 },
}

impl Scale {
    fn for_values(min: f64, max: f64) -> Self {
        if min > 0.0 && max / min > LOG_SPAN {
            Scale::Log {
                lo_exp: min.log10().floor() as i32,
                hi_exp: max.log10().ceil() as i32,
            }
        } else {
            let step = nice_step(max / 5.0);
            Scale::Linear {
                max: (max / step).ceil().max(1.0) * step,
                step,
            }
        }
    }

    /// Height of `v` above the x axis, in pixels.
    fn height(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { max, .. } => (v / max).clamp(0.0, 1.0) * PLOT_H,
            Scale::Log { lo_exp, hi_exp } => {
                if v <= 0.0 {
                    return 0.0;
                }
                let span = f64::from((hi_exp - lo_exp).max(1));
                ((v.log10() - f64::from(lo_exp)) / span).clamp(0.0, 1.0) * PLOT_H
            }
        }
    }

    fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Linear { max, step } => {
                let n = (max / step).round() as usize;
                (0..=n).map(|i| i as f64 * step).collect()
            }
            Scale::Log { lo_exp, hi_exp } => (lo_exp..=hi_exp).map(|e| 10f64.powi(e)).collect(),
        }
    }
}

/// The smallest 1, 2 or 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * pow)
}

/// A tick value without trailing zeros: `100`, `2.5`, `0.1`.
fn tick_label(t: f64) -> String {
    let s = sig(t, 3);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders `group` as an SVG document.
pub fn bar_chart(group: &Group) -> String {
    let values: Vec<f64> = group
        .cells
        .values()
        .flat_map(|m| [m.estimate.median_ns, m.estimate.upper_ns])
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let max_ns = values.iter().copied().fold(0.0, f64::max);
    let min_ns = values.iter().copied().fold(f64::INFINITY, f64::min);
    let unit: Unit = time_unit(max_ns);
    let scale = if values.is_empty() {
        Scale::Linear {
            max: 1.0,
            step: 0.2,
        }
    } else {
        Scale::for_values(min_ns / unit.1, max_ns / unit.1)
    };

    let cols = group.columns.len().max(1) as f64;
    let cluster_w = cols * BAR_W + CLUSTER_GAP;
    let plot_w = (group.rows.len().max(1) as f64 * cluster_w).max(320.0);
    let width = LEFT + plot_w + LEGEND_W;
    let height = TOP + PLOT_H + BOTTOM;
    let base_y = TOP + PLOT_H;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{width}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        esc(&group.id)
    );

    // Y axis, ticks and grid.
    let axis_label = match scale {
        Scale::Log { .. } => format!("median time ({}, log scale)", unit.0),
        Scale::Linear { .. } => format!("median time ({})", unit.0),
    };
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + PLOT_H / 2.0,
        esc(&axis_label)
    );
    for t in scale.ticks() {
        let y = base_y - scale.height(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>"##,
            LEFT + plot_w
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            tick_label(t)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base_y}" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{base_y}" x2="{:.1}" y2="{base_y}" stroke="black"/>"#,
        LEFT + plot_w
    );

    // Bars, error bars and x labels.
    let rotate = group
        .rows
        .iter()
        .any(|r| r.chars().count() as f64 * 7.0 > cluster_w);
    for (r, row) in group.rows.iter().enumerate() {
        let x0 = LEFT + r as f64 * cluster_w + CLUSTER_GAP / 2.0;
        for c in 0..group.columns.len() {
            let Some(m) = group.cell(r, c) else { continue };
            let v = m.estimate.median_ns / unit.1;
            let h = scale.height(v);
            let x = x0 + c as f64 * BAR_W;
            let _ = writeln!(
                s,
                r#"<rect class="bar" x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{} / {}: {}</title></rect>"#,
                base_y - h,
                BAR_W - 2.0,
                PALETTE[c % PALETTE.len()],
                esc(&group.columns[c]),
                esc(row),
                esc(&super::format::time(m.estimate.median_ns))
            );
            let lo = base_y - scale.height(m.estimate.lower_ns / unit.1);
            let hi = base_y - scale.height(m.estimate.upper_ns / unit.1);
            if hi < lo {
                let cx = x + (BAR_W - 2.0) / 2.0;
                let _ = writeln!(
                    s,
                    r#"<path d="M{cx:.1} {lo:.1}V{hi:.1}M{:.1} {hi:.1}H{:.1}M{:.1} {lo:.1}H{:.1}" stroke="black" fill="none"/>"#,
                    cx - 3.0,
                    cx + 3.0,
                    cx - 3.0,
                    cx + 3.0
                );
            }
        }
        let cx = x0 + (cols * BAR_W) / 2.0;
        let y = base_y + 16.0;
        if rotate {
            let _ = writeln!(
                s,
                r#"<text transform="translate({cx:.1} {y:.1}) rotate(-30)" text-anchor="end">{}</text>"#,
                esc(row)
            );
        } else {
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{y:.1}" text-anchor="middle">{}</text>"#,
                esc(row)
            );
        }
    }

    // Legend.
    let lx = LEFT + plot_w + 20.0;
    for (c, name) in group.columns.iter().enumerate() {
        let y = TOP + c as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<rect class="legend" x="{lx:.1}" y="{y:.1}" width="12" height="12" fill="{}"/>"#,
            PALETTE[c % PALETTE.len()]
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 18.0,
            y + 10.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::criterion::{BenchId, Estimate, Measurement};
    use std::collections::BTreeMap;

    fn group(values: &[(usize, usize, f64)]) -> Group {
        let mut cells = BTreeMap::new();
        for &(r, c, ns) in values {
            cells.insert(
                (r, c),
                Measurement {
                    id: BenchId {
                        group: "g".into(),
                        function: None,
                        value: None,
                        throughput: None,
                    },
                    estimate: Estimate {
                        median_ns: ns,
                        lower_ns: ns * 0.9,
                        upper_ns: ns * 1.1,
                    },
                },
            );
        }
        Group {
            id: "fig<5> & co".into(),
            rows: vec!["cold-rand-lookup".into(), "hot".into()],
            columns: vec!["extent".into(), "hashfs".into()],
            cells,
        }
    }

    #[test]
    fn chart_has_a_bar_per_result_a_legend_and_escaped_text() {
        let svg = bar_chart(&group(&[(0, 0, 1500.0), (0, 1, 900.0), (1, 0, 2000.0)]));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches(r#"class="bar""#).count(), 3);
        assert_eq!(svg.matches(r#"class="legend""#).count(), 2);
        assert!(svg.contains("fig&lt;5&gt; &amp; co"));
        assert!(svg.contains("median time (µs)"));
        assert!(svg.contains("rotate(-30)"), "long row labels are rotated");
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    #[test]
    fn wide_ranges_use_a_log_axis_and_empty_groups_still_render() {
        let svg = bar_chart(&group(&[(0, 0, 10.0), (1, 1, 100_000.0)]));
        assert!(svg.contains("log scale"));
        let empty = bar_chart(&group(&[]));
        assert_eq!(empty.matches(r#"class="bar""#).count(), 0);
        assert!(!empty.contains("NaN"));
    }

    #[test]
    fn tick_labels_drop_trailing_zeros() {
        assert_eq!(tick_label(100.0), "100");
        assert_eq!(tick_label(0.1), "0.1");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(0.0), "0");
    }

    #[test]
    fn scales_map_values_into_the_plot() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(2.0), 2.0);
        assert_eq!(nice_step(7.0), 10.0);
        let lin = Scale::for_values(1.0, 9.0);
        assert_eq!(
            lin,
            Scale::Linear {
                max: 10.0,
                step: 2.0
            }
        );
        assert_eq!(lin.height(10.0), PLOT_H);
        assert_eq!(lin.ticks().len(), 6);
        let log = Scale::for_values(3.0, 4000.0);
        assert_eq!(
            log,
            Scale::Log {
                lo_exp: 0,
                hi_exp: 4
            }
        );
        assert_eq!(log.height(100.0), PLOT_H / 2.0);
        assert_eq!(log.height(0.0), 0.0);
    }
}
