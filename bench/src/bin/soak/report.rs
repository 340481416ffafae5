//! What the soak makes of its samples: each series' start (the first sample after the warm-up),
//! end, peak and least-squares slope per hour over the samples after the warm-up; the verdict
//! against the bounds; the table; `report.json`; and the plot (a hand-written SVG, one panel per
//! series, the warm-up shaded and the restart marked).
//!
//! Not here: taking the samples or running anything (`soak.rs`). Invariant: the verdict reads
//! only the figures `report.json` carries, so a reader of the file can check it by hand.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

/// One sample of the daemon and its state directory.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Sample {
    /// Seconds since the daemon was first started.
    pub(crate) t_s: f64,
    pub(crate) rss_mib: f64,
    pub(crate) threads: f64,
    pub(crate) fds: f64,
    /// The daemon's CPU since the previous sample, as a share of one CPU.
    pub(crate) cpu_pct: f64,
    pub(crate) db_mib: f64,
    pub(crate) wal_mib: f64,
    pub(crate) artifacts_mib: f64,
    pub(crate) logs_mib: f64,
}

/// The series `report.json` names, in its order, with a unit for the table and the plot.
pub(crate) const SERIES: [(&str, &str); 8] = [
    ("rss_mib", "MiB"),
    ("threads", ""),
    ("fds", ""),
    ("cpu_pct", "%"),
    ("db_mib", "MiB"),
    ("wal_mib", "MiB"),
    ("artifacts_mib", "MiB"),
    ("logs_mib", "MiB"),
];

impl Sample {
    pub(crate) fn get(&self, name: &str) -> f64 {
        match name {
            "rss_mib" => self.rss_mib,
            "threads" => self.threads,
            "fds" => self.fds,
            "cpu_pct" => self.cpu_pct,
            "db_mib" => self.db_mib,
            "wal_mib" => self.wal_mib,
            "artifacts_mib" => self.artifacts_mib,
            "logs_mib" => self.logs_mib,
            other => panic!("no series {other}"),
        }
    }
}

/// One series over the run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Stats {
    pub(crate) start: f64,
    pub(crate) end: f64,
    pub(crate) peak: f64,
    pub(crate) slope_per_hour: f64,
}

/// Least squares of `(t_s, y)`: the slope per hour; 0 with fewer than two distinct times.
pub(crate) fn slope_per_hour(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return 0.0;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    sxy / sxx * 3600.0
}

/// A series' figures over the samples at or after `warmup_s` (all of them when none is).
pub(crate) fn stats(samples: &[Sample], name: &str, warmup_s: f64) -> Stats {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.t_s >= warmup_s).collect();
    let used: Vec<&Sample> = if after.is_empty() {
        samples.iter().collect()
    } else {
        after
    };
    let points: Vec<(f64, f64)> = used.iter().map(|s| (s.t_s, s.get(name))).collect();
    Stats {
        start: points.first().map_or(0.0, |p| p.1),
        end: points.last().map_or(0.0, |p| p.1),
        peak: samples.iter().map(|s| s.get(name)).fold(0.0, f64::max),
        slope_per_hour: slope_per_hour(&points),
    }
}

/// The bounds a run is judged against.
#[derive(Clone, Debug)]
pub(crate) struct Bounds {
    /// The WAL's bound (`PRAGMA journal_size_limit`), MiB.
    pub(crate) wal_mib: f64,
    /// The artifact budget plus what one sweep interval adds at the offered rate, MiB.
    pub(crate) artifacts_mib: f64,
}

/// Why a run failed, one line per broken bound; empty when it passed.
pub(crate) fn verdict(series: &Map<String, Value>, bounds: &Bounds, report: &Value) -> Vec<String> {
    let f = |name: &str, key: &str| series[name][key].as_f64().unwrap_or(f64::NAN);
    let mut why = Vec::new();
    let (rss0, rss1) = (f("rss_mib", "start"), f("rss_mib", "end"));
    if rss1.is_nan() || rss1 > rss0 * 1.10 {
        why.push(format!(
            "RSS grew: {rss1:.1} MiB at the end against {rss0:.1} MiB after the warm-up (bound: +10%)"
        ));
    }
    for name in ["threads", "fds"] {
        let (a, b) = (f(name, "start"), f(name, "end"));
        if b.is_nan() || b > a + 2.0 {
            why.push(format!(
                "{name} grew: {b} at the end against {a} after the warm-up (bound: +2)"
            ));
        }
    }
    let wal = f("wal_mib", "peak");
    if wal.is_nan() || wal > bounds.wal_mib {
        why.push(format!(
            "the WAL reached {wal:.1} MiB, over its bound of {:.0} MiB",
            bounds.wal_mib
        ));
    }
    let art = f("artifacts_mib", "peak");
    if art.is_nan() || art > bounds.artifacts_mib {
        why.push(format!(
            "artifacts/ reached {art:.2} MiB, over its bound of {:.2} MiB (the budget and one interval's writes)",
            bounds.artifacts_mib
        ));
    }
    let count = |k: &str| report[k].as_u64().unwrap_or(u64::MAX);
    if count("acked") == 0 {
        why.push("no event was acknowledged".to_owned());
    }
    if count("lost") != 0 || count("duplicated") != 0 {
        why.push(format!(
            "acknowledged events not in exactly one Work: {} lost, {} duplicated",
            report["lost"], report["duplicated"]
        ));
    }
    why
}

/// `report.json`'s `series`: name → `{start, end, peak, slope_per_hour}`.
pub(crate) fn series_json(samples: &[Sample], warmup_s: f64) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, _) in SERIES {
        let s = stats(samples, name, warmup_s);
        out.insert(
            name.to_owned(),
            json!({
                "start": round(s.start),
                "end": round(s.end),
                "peak": round(s.peak),
                "slope_per_hour": round(s.slope_per_hour),
            }),
        );
    }
    out
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The samples as a table, then each series' start, end, peak and slope.
pub(crate) fn table(samples: &[Sample], series: &Map<String, Value>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "|    t |  rss MiB | threads |  fds |  cpu % |  db MiB | wal MiB | artifacts MiB | logs MiB |"
    );
    let _ = writeln!(
        out,
        "|-----:|---------:|--------:|-----:|-------:|--------:|--------:|--------------:|---------:|"
    );
    for s in samples {
        let _ = writeln!(
            out,
            "| {:>4} | {:>8.1} | {:>7} | {:>4} | {:>6.1} | {:>7.2} | {:>7.2} | {:>13.2} | {:>8.2} |",
            mmss(s.t_s),
            s.rss_mib,
            s.threads,
            s.fds,
            s.cpu_pct,
            s.db_mib,
            s.wal_mib,
            s.artifacts_mib,
            s.logs_mib
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| series | after warm-up | end | peak | slope per hour |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for (name, unit) in SERIES {
        let v = &series[name];
        let _ = writeln!(
            out,
            "| {name} | {} {unit} | {} {unit} | {} {unit} | {:+} {unit}/h |",
            v["start"], v["end"], v["peak"], v["slope_per_hour"]
        );
    }
    out
}

fn mmss(t: f64) -> String {
    let t = t.max(0.0).round() as u64;
    format!("{}:{:02}", t / 60, t % 60)
}

/// The samples as one SVG: a panel per series (values against minutes), the warm-up shaded,
/// the restart a dashed line, each panel's bound (where it has one) a red line.
pub(crate) fn svg(
    samples: &[Sample],
    warmup_s: f64,
    restart_s: Option<f64>,
    bounds: &Bounds,
    title: &str,
) -> String {
    const W: f64 = 420.0;
    const H: f64 = 180.0;
    const COLS: usize = 2;
    const PAD_L: f64 = 56.0;
    const PAD_R: f64 = 14.0;
    const PAD_T: f64 = 26.0;
    const PAD_B: f64 = 28.0;
    let rows = SERIES.len().div_ceil(COLS);
    let (width, height) = (W * COLS as f64, 40.0 + H * rows as f64 + 16.0);
    let t_max = samples.iter().map(|s| s.t_s).fold(1.0, f64::max);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#fff"/><text x="{}" y="24" font-size="14" text-anchor="middle">{}</text>"##,
        width / 2.0,
        escape(title)
    );
    for (i, (name, unit)) in SERIES.iter().enumerate() {
        let (x0, y0) = (
            (i % COLS) as f64 * W + PAD_L,
            40.0 + (i / COLS) as f64 * H + PAD_T,
        );
        let (pw, ph) = (W - PAD_L - PAD_R, H - PAD_T - PAD_B);
        let bound = match *name {
            "wal_mib" => Some(bounds.wal_mib),
            "artifacts_mib" => Some(bounds.artifacts_mib),
            _ => None,
        };
        let peak = samples.iter().map(|s| s.get(name)).fold(0.0, f64::max);
        // The WAL's bound (64 MiB) would flatten a WAL of a few MiB: shown when within reach.
        let shown_bound = bound.filter(|b| *b <= peak * 4.0 + 1.0);
        let y_max = nice(peak.max(shown_bound.unwrap_or(0.0)).max(1e-3) * 1.1);
        let px = |t: f64| x0 + t / t_max * pw;
        let py = |v: f64| y0 + ph - v / y_max * ph;
        let _ = writeln!(
            out,
            r##"<text x="{x0}" y="{}" font-size="12" font-weight="bold">{name}{}</text>"##,
            y0 - 8.0,
            if unit.is_empty() {
                String::new()
            } else {
                format!(" ({unit})")
            }
        );
        let _ = writeln!(
            out,
            r##"<rect x="{x0}" y="{y0}" width="{}" height="{ph}" fill="#eee"/>"##,
            px(warmup_s.min(t_max)) - x0
        );
        let _ = writeln!(
            out,
            r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##
        );
        for k in 0..=4 {
            let v = y_max * k as f64 / 4.0;
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{}" text-anchor="end">{}</text><line x1="{x0}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/>"##,
                x0 - 4.0,
                py(v) + 4.0,
                short(v),
                x0 + pw,
                y = py(v)
            );
        }
        let step = minutes_step(t_max);
        let mut m = 0.0;
        while m * 60.0 <= t_max {
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{}" text-anchor="middle">{m}</text>"##,
                px(m * 60.0),
                y0 + ph + 14.0
            );
            m += step;
        }
        if let Some(r) = restart_s {
            let _ = writeln!(
                out,
                r##"<line x1="{x}" x2="{x}" y1="{y0}" y2="{}" stroke="#c60" stroke-dasharray="4 3"/>"##,
                y0 + ph,
                x = px(r)
            );
        }
        if let Some(b) = shown_bound {
            let _ = writeln!(
                out,
                r##"<line x1="{x0}" x2="{}" y1="{y}" y2="{y}" stroke="#d00" stroke-dasharray="6 3"/>"##,
                x0 + pw,
                y = py(b)
            );
        }
        let points: Vec<String> = samples
            .iter()
            .map(|s| format!("{:.1},{:.1}", px(s.t_s), py(s.get(name))))
            .collect();
        let _ = writeln!(
            out,
            r##"<polyline points="{}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>"##,
            points.join(" ")
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#555">minutes; grey: warm-up; orange dashes: SIGTERM and restart; red dashes: the bound</text>"##,
        width - 8.0,
        height - 4.0
    );
    out.push_str("</svg>\n");
    out
}

/// A round axis top at or above `x`: 1, 2 or 5 times a power of ten.
fn nice(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * p)
}

fn minutes_step(t_max_s: f64) -> f64 {
    let m = t_max_s / 60.0;
    [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0]
        .into_iter()
        .find(|s| m / s <= 10.0)
        .unwrap_or(120.0)
}

fn short(v: f64) -> String {
    if v == 0.0 || v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_s: f64, rss: f64) -> Sample {
        Sample {
            t_s,
            rss_mib: rss,
            threads: 20.0,
            fds: 300.0,
            cpu_pct: 1.0,
            db_mib: 1.0,
            wal_mib: 0.5,
            artifacts_mib: 2.0,
            logs_mib: 0.1,
        }
    }

    #[test]
    fn the_slope_is_least_squares_per_hour() {
        // 1 MiB a minute is 60 MiB an hour, whatever the offset.
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 60.0, 5.0 + i as f64)).collect();
        assert!((slope_per_hour(&pts) - 60.0).abs() < 1e-9);
        assert_eq!(slope_per_hour(&[(1.0, 3.0)]), 0.0);
        assert_eq!(slope_per_hour(&[(1.0, 3.0), (1.0, 4.0)]), 0.0);
    }

    #[test]
    fn start_is_after_the_warm_up_and_the_peak_is_over_the_whole_run() {
        let s: Vec<Sample> = [(0.0, 90.0), (60.0, 40.0), (120.0, 41.0), (180.0, 42.0)]
            .into_iter()
            .map(|(t, r)| sample(t, r))
            .collect();
        let st = stats(&s, "rss_mib", 120.0);
        assert_eq!((st.start, st.end, st.peak), (41.0, 42.0, 90.0));
        assert!((st.slope_per_hour - 60.0).abs() < 1e-9);
    }

    fn judged(end_rss: f64, end_fds: f64, lost: u64) -> Vec<String> {
        let mut s: Vec<Sample> = (0..5).map(|i| sample(i as f64 * 60.0, 40.0)).collect();
        s.last_mut().unwrap().rss_mib = end_rss;
        s.last_mut().unwrap().fds = end_fds;
        let series = series_json(&s, 120.0);
        let bounds = Bounds {
            wal_mib: 64.0,
            artifacts_mib: 3.0,
        };
        verdict(
            &series,
            &bounds,
            &json!({"acked": 10, "lost": lost, "duplicated": 0}),
        )
    }

    #[test]
    fn each_bound_holds_at_its_edge_and_fails_one_past_it() {
        assert!(judged(44.0, 302.0, 0).is_empty(), "at 10% and +2");
        assert_eq!(judged(44.1, 302.0, 0).len(), 1, "past 10%");
        assert_eq!(judged(44.0, 303.0, 0).len(), 1, "past +2");
        assert_eq!(judged(40.0, 300.0, 1).len(), 1, "one event lost");
    }

    #[test]
    fn the_plot_has_a_line_per_series() {
        let s: Vec<Sample> = (0..5).map(|i| sample(i as f64 * 10.0, 40.0)).collect();
        let b = Bounds {
            wal_mib: 64.0,
            artifacts_mib: 3.0,
        };
        let svg = svg(&s, 20.0, Some(30.0), &b, "a <run>");
        assert_eq!(svg.matches("<polyline").count(), SERIES.len());
        assert!(svg.contains("a &lt;run&gt;"));
    }
}
