//! How the operator views write figures for people: short durations (`3m12s`), compact bytes
//! (`12M`), latencies (`850µs`, `12.3ms`), rates, and a sparkline of a series. Shared by
//! `conduit top` and `conduit web`, so the two views write a figure the same way.
//!
//! Pure functions of their inputs; nothing here reads the clock.

/// A duration in milliseconds, compact: `850ms`, `42s`, `3m12s`, `5h03m`, `2d04h`.
pub fn duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let s = ms / 1_000;
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m{:02}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h{:02}m", s / 3_600, (s % 3_600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// A time as people read it in a table, in UTC to the second: `2026-12-04 17:54:28Z`.
pub fn utc(at_ms: i64) -> String {
    let ts = conduit_supervisor::log::utc_timestamp(at_ms); // 2026-12-04T17:54:28.123Z
    format!("{} {}Z", &ts[..10], &ts[11..19])
}

/// How long ago `at_ms` was at `now_ms`: `12s ago`.
pub fn ago(at_ms: i64, now_ms: i64) -> String {
    format!("{} ago", duration_ms(now_ms - at_ms))
}

/// A latency in microseconds: `-` for none, `850µs`, `12.3ms`, `1.25s`.
pub fn latency_us(us: u64) -> String {
    match us {
        0 => "-".to_owned(),
        1..1_000 => format!("{us}µs"),
        1_000..10_000 => format!("{:.2}ms", us as f64 / 1e3),
        10_000..1_000_000 => format!("{:.1}ms", us as f64 / 1e3),
        _ => format!("{:.2}s", us as f64 / 1e6),
    }
}

/// Bytes, compact, in powers of 1024: `512B`, `12K`, `7.5M`, `1G`.
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size {
            let v = n as f64 / size as f64;
            return if v >= 10.0 || n.is_multiple_of(size) {
                format!("{:.0}{unit}", v.floor())
            } else {
                format!("{v:.1}{unit}")
            };
        }
    }
    format!("{n}B")
}

/// A share of one CPU as a percentage: `0%`, `3%`, `0.4%`, `150%`.
pub fn cpu(share: f64) -> String {
    let pct = share * 100.0;
    if pct > 0.0 && pct < 1.0 {
        format!("{pct:.1}%")
    } else {
        format!("{pct:.0}%")
    }
}

/// A count with thousands separators: `1,000,000`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A per-second rate: `0/s`, `0.4/s`, `12/s`, `1.2k/s`.
pub fn rate(per_s: f64) -> String {
    if per_s >= 1_000.0 {
        format!("{:.1}k/s", per_s / 1_000.0)
    } else if per_s >= 10.0 || per_s == 0.0 {
        format!("{per_s:.0}/s")
    } else {
        format!("{per_s:.1}/s")
    }
}

/// The last `width` values of `series` as a line of block characters, each scaled against the
/// largest of them; an empty period is a space, a period with any count at least `▁`.
pub fn sparkline(series: &[u32], width: usize) -> String {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let tail = &series[series.len().saturating_sub(width)..];
    let max = tail.iter().copied().max().unwrap_or(0);
    let mut out: String = std::iter::repeat_n(' ', width.saturating_sub(tail.len())).collect();
    for &v in tail {
        out.push(if v == 0 || max == 0 {
            ' '
        } else {
            let i = (u64::from(v) * 7 / u64::from(max)) as usize;
            BLOCKS[i.min(7)]
        });
    }
    out
}

/// The `lines` of a `GET /v1/extensions/{name}/logs` answer (none when it has none).
pub fn log_lines(answer: &serde_json::Value) -> Vec<String> {
    answer["lines"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A query string from pairs, each value percent-encoded (everything but the unreserved
/// characters of RFC 3986).
pub fn query(pairs: &[(&str, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(&percent(v));
    }
    out
}

/// `s` percent-encoded for a URL's path segment or query value.
pub fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_at_each_unit_edge() {
        assert_eq!(duration_ms(-5), "0ms");
        assert_eq!(duration_ms(999), "999ms");
        assert_eq!(duration_ms(1_000), "1s");
        assert_eq!(duration_ms(59_999), "59s");
        assert_eq!(duration_ms(60_000), "1m00s");
        assert_eq!(duration_ms(3_599_000), "59m59s");
        assert_eq!(duration_ms(3_600_000), "1h00m");
        assert_eq!(duration_ms(86_400_000 + 3_600_000 * 4), "1d04h");
        assert_eq!(ago(1_000, 13_000), "12s ago");
        assert_eq!(utc(1_796_406_868_123), "2026-12-04 17:54:28Z");
    }

    #[test]
    fn latencies_bytes_cpu_counts_and_rates() {
        assert_eq!(latency_us(0), "-");
        assert_eq!(latency_us(850), "850µs");
        assert_eq!(latency_us(1_250), "1.25ms");
        assert_eq!(latency_us(12_345), "12.3ms");
        assert_eq!(latency_us(1_250_000), "1.25s");
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1024), "1K");
        assert_eq!(bytes(7 * 1024 * 1024 + 512 * 1024), "7.5M");
        assert_eq!(bytes(44_941_312), "42M");
        assert_eq!(bytes(1 << 30), "1G");
        assert_eq!(cpu(0.0), "0%");
        assert_eq!(cpu(0.004), "0.4%");
        assert_eq!(cpu(1.5), "150%");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(1_000_000), "1,000,000");
        assert_eq!(rate(0.0), "0/s");
        assert_eq!(rate(0.43), "0.4/s");
        assert_eq!(rate(12.4), "12/s");
        assert_eq!(rate(1_234.0), "1.2k/s");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        let q = query(&[("filter", "a b&c=d/é".into()), ("limit", "5".into())]);
        assert_eq!(q, "filter=a%20b%26c%3Dd%2F%C3%A9&limit=5");
    }

    #[test]
    fn a_sparkline_scales_to_its_largest_value_and_pads_on_the_left() {
        assert_eq!(sparkline(&[], 3), "   ");
        assert_eq!(sparkline(&[0, 0, 0], 3), "   ");
        assert_eq!(sparkline(&[1, 8, 4, 0], 4), "▁█▄ ");
        assert_eq!(sparkline(&[9, 1, 8], 2), "▁█");
        assert_eq!(sparkline(&[1], 3), "  █");
        assert_eq!(sparkline(&[1, 1000], 2), "▁█");
    }
}
