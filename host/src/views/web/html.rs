//! The pieces every page of `conduit web` is built from: the layout (navigation, the live
//! parts, the footer), the forms that act (each with the CSRF token), paging links, and the
//! pictures (a latency histogram and a calls sparkline as inline SVG, which the CSP allows
//! because they are part of the page, not a resource).
//!
//! Everything is written with maud's `html!`, which escapes every value it is given; nothing
//! here marks a value as already escaped except the two fixed assets' tags. So a name, a
//! payload or a log line holding `<script>` is shown as text.

use maud::{DOCTYPE, Markup, html};

use crate::views::fmt;

/// The navigation: (path, label).
pub(super) const NAV: &[(&str, &str)] = &[
    ("/extensions", "Extensions"),
    ("/work", "Work"),
    ("/timers", "Timers"),
    ("/waits", "Waits"),
    ("/emissions", "Emissions"),
    ("/artifacts", "Artifacts"),
    ("/doctor", "Doctor"),
];

/// What a page says about itself to the layout.
#[derive(Debug)]
pub(super) struct Page<'a> {
    pub title: String,
    /// The navigation entry it belongs to.
    pub section: &'a str,
    /// Whether the live parts (`data-live` elements) refresh without a reload.
    pub live: bool,
}

/// The whole document around `body`.
pub(super) fn layout(page: &Page<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (page.title) " — conduit" }
                link rel="stylesheet" href="/static/style.css";
                script src="/static/live.js" defer {}
            }
            body data-refresh=[page.live.then_some("2000")] {
                header {
                    nav {
                        a.brand href="/extensions" { "conduit" }
                        @for (path, label) in NAV {
                            a href=(path) class=[(page.section == *path).then_some("here")] { (label) }
                        }
                    }
                }
                main { (body) }
                footer {
                    "conduit web · everything here is read through the daemon's management API"
                    @if page.live {
                        " · "
                        span #updated data-live { "updated " (fmt::utc(conduit_supervisor::now_ms())) }
                    }
                }
            }
        }
    }
}

/// A button that POSTs to `action` with the CSRF token, and comes back to `back`.
pub(super) fn action(action: &str, label: &str, csrf: &str, back: &str, class: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="back" value=(back);
            button type="submit" class=(class) { (label) }
        }
    }
}

/// A small page of its own: a status code's explanation.
pub(super) fn notice(title: &str, lines: &[&str]) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " — conduit" }
                link rel="stylesheet" href="/static/style.css";
            }
            body {
                main.notice {
                    h1 { (title) }
                    @for l in lines { p { (l) } }
                }
            }
        }
    }
}

/// The CSS class of a state, for its colour.
pub(super) fn state_class(state: &str) -> &'static str {
    match state {
        "ready" | "committed" | "satisfied" | "active" | "done" => "ok",
        "starting" | "stopping" | "planned" | "open" => "warn",
        "backing-off" | "crash-looping" | "refused" | "incompatible" | "failed" => "bad",
        "degraded" => "warn",
        "unresponsive" => "bad",
        _ => "quiet",
    }
}

/// The calls of each recent period as bars, oldest first (a sparkline), `width`×`height`.
pub(super) fn spark(series: &[u32], width: u32, height: u32) -> Markup {
    let max = series.iter().copied().max().unwrap_or(0).max(1);
    let n = series.len().max(1) as u32;
    let bar = (width / n).max(1);
    let total: u64 = series.iter().map(|v| u64::from(*v)).sum();
    html! {
        svg.spark width=(width) height=(height) viewBox={"0 0 " (width) " " (height)} role="img" {
            title { (fmt::count(total)) " calls in the last " (series.len()) " periods" }
            @for (i, v) in series.iter().enumerate() {
                @if *v > 0 {
                    @let h = ((u64::from(*v) * u64::from(height)).div_ceil(u64::from(max))).max(1) as u32;
                    rect x=(i as u32 * bar) y=(height - h) width=(bar.saturating_sub(1).max(1)) height=(h) {}
                }
            }
        }
    }
}

/// A latency histogram: one bar per bucket between the bounds (the last is "more"), its count
/// above it and its upper bound below, scaled to the largest bucket.
pub(super) fn histogram(bounds_us: &[u64], counts: &[u64]) -> Markup {
    let (w, h, top, bottom) = (46u32, 120u32, 16u32, 18u32);
    let width = w * counts.len() as u32;
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let total: u64 = counts.iter().sum();
    html! {
        svg.hist width=(width) height=(h + top + bottom)
            viewBox={"0 0 " (width) " " (h + top + bottom)} role="img" {
            title { "latency histogram of " (fmt::count(total)) " calls" }
            @for (i, c) in counts.iter().enumerate() {
                @let x = i as u32 * w;
                @let bh = if *c == 0 { 0 } else { ((c * u64::from(h)).div_ceil(max)).max(1) as u32 };
                @let label = match bounds_us.get(i) {
                    Some(b) => format!("≤{}", fmt::latency_us(*b)),
                    None => "more".to_owned(),
                };
                g {
                    title { (label) ": " (fmt::count(*c)) }
                    @if bh > 0 {
                        rect.bar x=(x + 2) y=(top + h - bh) width=(w - 4) height=(bh) {}
                        text.count x=(x + w / 2) y=(top + h - bh - 3) text-anchor="middle" { (fmt::count(*c)) }
                    }
                    text.axis x=(x + w / 2) y=(top + h + 13) text-anchor="middle" { (label) }
                }
            }
            line.base x1="0" y1=(top + h) x2=(width) y2=(top + h) {}
        }
    }
}

/// A JSON value shown as indented text, cut at `max` characters (the cut said).
pub(super) fn json_block(v: &serde_json::Value, max: usize) -> Markup {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    let (shown, cut) = if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        (&text[..end], Some(text.len() - end))
    } else {
        (text.as_str(), None)
    };
    html! {
        pre.json { (shown) @if let Some(n) = cut { "\n… (" (fmt::count(n as u64)) " more characters)" } }
    }
}

/// A time in a table: UTC, with how long ago as its tooltip.
pub(super) fn when(at_ms: Option<i64>, now: i64) -> Markup {
    html! {
        @match at_ms {
            Some(t) => time title=(fmt::ago(t, now)) { (fmt::utc(t)) },
            None => span.quiet { "-" },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_everywhere() {
        let evil = "<script>alert(1)</script>";
        let page = Page {
            title: evil.to_owned(),
            section: "/extensions",
            live: true,
        };
        let out = layout(
            &page,
            html! { p { (evil) } (action(evil, evil, evil, evil, "x")) },
        )
        .into_string();
        assert!(!out.contains("<script>alert"), "{out}");
        assert!(out.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        let j = json_block(&serde_json::json!({ "text": evil }), 1000).into_string();
        assert!(!j.contains("<script>"), "{j}");
    }

    #[test]
    fn a_long_json_value_is_cut_and_says_so() {
        let v = serde_json::json!({ "text": "é".repeat(100) });
        let out = json_block(&v, 20).into_string();
        assert!(out.contains("more characters"), "{out}");
    }

    #[test]
    fn the_pictures_scale_to_their_largest_value() {
        let h = histogram(&[100, 1000], &[1, 4, 0]).into_string();
        assert_eq!(h.matches("<rect").count(), 2, "{h}");
        assert!(h.contains("≤100µs") && h.contains("more"), "{h}");
        let s = spark(&[0, 3, 0, 1], 40, 10).into_string();
        assert_eq!(s.matches("<rect").count(), 2, "{s}");
        assert!(s.contains("4 calls"), "{s}");
    }
}
