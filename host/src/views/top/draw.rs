//! One frame of `conduit top`, drawn from the [`App`]: a title line, two lines of daemon-wide
//! figures (extensions by state, events per second with a sparkline, the unrouted backlog, Work
//! by state, the host loop's pass time), the extensions table, the selected extension's recent
//! exits and stderr tail, and a footer with the keys, the filter or a question. Help and logs
//! replace parts of it.
//!
//! Only draws; it reads the clock once for "ago" figures and changes nothing but the number
//! of table rows it had room for ([`App::set_table_rows`], which the loop reads after a draw).

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row as TRow, Table, Wrap};

use super::app::{App, Mode};
use crate::core::health::Condition;
use crate::daemon::overview::{Row, SortKey};
use crate::views::fmt;
use conduit_supervisor::State;

/// How many periods the calls sparkline shows (of 10 s each: two minutes).
const SPARK: usize = 12;
/// The least width the last, flexible column (the last exit) is given, or it is left out.
const FLEX_MIN: u16 = 12;

/// The keys, as the help and the footer list them.
pub const HELP: &[(&str, &str)] = &[
    ("↑ ↓  j k", "select an extension (PgUp PgDn Home End too)"),
    (
        "/",
        "filter by name, state or health as you type (Enter keeps it, Esc clears it)",
    ),
    ("s  S", "sort by the next (previous) column"),
    ("o", "reverse the order"),
    ("r", "restart the selected extension (asks first)"),
    (
        "e  d",
        "enable, disable the selected extension (asks first)",
    ),
    (
        "l",
        "follow the selected extension's log (l or Esc to come back)",
    ),
    ("space", "refresh now"),
    ("Ctrl-L", "draw the screen again"),
    ("?", "this help"),
    ("q  Esc  Ctrl-C", "quit"),
];

struct Palette {
    color: bool,
}

impl Palette {
    fn fg(&self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }

    fn state(&self, s: State) -> Style {
        match s {
            State::Ready => self.fg(Color::Green),
            State::Starting | State::Stopping => self.fg(Color::Yellow),
            State::BackingOff | State::CrashLooping | State::Refused | State::Incompatible => {
                self.fg(Color::Red).add_modifier(Modifier::BOLD)
            }
            State::Stopped | State::Disabled => self.fg(Color::DarkGray),
        }
    }

    fn health(&self, h: Option<Condition>) -> Style {
        match h {
            Some(Condition::Healthy) => Style::default(),
            Some(Condition::Degraded) => self.fg(Color::Yellow).add_modifier(Modifier::BOLD),
            Some(Condition::Unresponsive) => self.fg(Color::Red).add_modifier(Modifier::BOLD),
            None => self.fg(Color::DarkGray),
        }
    }
}

/// Draw the whole frame.
pub(super) fn frame(f: &mut Frame<'_>, app: &mut App) {
    let p = Palette { color: app.color };
    let area = f.area();
    let detail_h = if area.height >= 30 {
        12
    } else if area.height >= 20 {
        7
    } else {
        0
    };
    let [title, figures, body, detail, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(2),
        Constraint::Min(3),
        Constraint::Length(detail_h),
        Constraint::Length(1),
    ])
    .areas(area);
    let now = conduit_supervisor::now_ms();
    draw_title(f, app, title, now);
    draw_figures(f, app, &p, figures);
    match app.mode.clone() {
        Mode::Logs(name) => draw_logs(f, app, &name, body.union(detail)),
        _ => {
            // The header line takes one row of the body.
            app.set_table_rows(body.height.saturating_sub(1) as usize);
            draw_table(f, app, &p, body, now);
            if detail_h > 0 {
                draw_detail(f, app, &p, detail, now);
            }
        }
    }
    draw_footer(f, app, &p, footer);
    if app.mode == Mode::Help {
        draw_help(f, area);
    }
}

fn draw_title(f: &mut Frame<'_>, app: &App, area: Rect, now: i64) {
    let mut text = format!(" conduit top · {}", app.state_dir);
    if let Some(o) = &app.overview {
        text.push_str(&format!(
            " · daemon {} pid {} up {}",
            o.daemon.version,
            o.daemon.pid,
            fmt::duration_ms(now - o.daemon.started_at_ms)
        ));
    }
    text.push_str(&format!(
        " · every {}",
        fmt::duration_ms(app.interval_ms as i64)
    ));
    let style = Style::default().add_modifier(Modifier::REVERSED);
    f.render_widget(Paragraph::new(text).style(style), area);
}

fn draw_figures(f: &mut Frame<'_>, app: &App, p: &Palette, area: Rect) {
    let Some(o) = &app.overview else {
        let msg = app
            .error
            .clone()
            .unwrap_or_else(|| "asking the daemon…".to_owned());
        f.render_widget(Paragraph::new(format!(" {msg}")), area);
        return;
    };
    let t = &o.extensions;
    let mut l1 = vec![Span::raw(format!(
        " extensions {}",
        fmt::count(t.installed as u64)
    ))];
    for (state, n) in &t.by_state {
        let s = State::parse(state);
        l1.push(Span::raw(" · "));
        l1.push(Span::styled(
            format!("{state} {n}"),
            s.map_or(Style::default(), |s| p.state(s)),
        ));
    }
    if t.degraded > 0 {
        l1.push(Span::raw(" · "));
        l1.push(Span::styled(
            format!("degraded {}", t.degraded),
            p.health(Some(Condition::Degraded)),
        ));
    }
    let rate = app.event_rates.last().copied().unwrap_or(0.0);
    let spark: Vec<u32> = app
        .event_rates
        .iter()
        .map(|r| (r * 10.0).round() as u32)
        .collect();
    let s = &o.store;
    let unrouted = if s.unrouted_capped {
        format!("≥{}", fmt::count(s.unrouted))
    } else {
        fmt::count(s.unrouted)
    };
    let mut work = std::collections::BTreeMap::<&str, u64>::new();
    for c in &s.work {
        *work.entry(c.state.as_str()).or_default() += c.n;
    }
    let work: Vec<String> = ["open", "ready", "done"]
        .iter()
        .map(|st| format!("{st} {}", fmt::count(work.get(st).copied().unwrap_or(0))))
        .collect();
    let hl = &o.daemon.host_loop;
    let pass = hl["last_pass_us"].as_u64().unwrap_or(0);
    let passes = hl["passes"].as_u64().unwrap_or(0);
    let unrouted_style = if s.unrouted > 0 {
        p.fg(Color::Yellow)
    } else {
        Style::default()
    };
    let l2 = vec![
        Span::raw(format!(" events {} ", fmt::rate(rate))),
        Span::styled(fmt::sparkline(&spark, 20), p.fg(Color::Cyan)),
        Span::raw(format!(
            " · #{} · unrouted ",
            fmt::count(s.latest_event_id.max(0) as u64)
        )),
        Span::styled(unrouted, unrouted_style),
        Span::raw(format!(
            " · work {} · host loop {}/pass ({} passes)",
            work.join(" "),
            fmt::latency_us(pass),
            fmt::count(passes)
        )),
    ];
    f.render_widget(Paragraph::new(vec![Line::from(l1), Line::from(l2)]), area);
}

/// A column of the table: its title, width, the sort key it shows, and its cell.
struct Col {
    title: &'static str,
    width: u16,
    key: Option<SortKey>,
    cell: fn(&Row, &Palette, i64) -> Cell<'static>,
}

fn columns() -> Vec<Col> {
    vec![
        Col {
            title: "NAME",
            width: 20,
            key: Some(SortKey::Name),
            cell: |r, _, _| Cell::from(r.name.clone()),
        },
        Col {
            title: "STATE",
            width: 13,
            key: Some(SortKey::State),
            cell: |r, p, _| Cell::from(r.glance.state.as_str()).style(p.state(r.glance.state)),
        },
        Col {
            title: "HEALTH",
            width: 12,
            key: Some(SortKey::Health),
            cell: |r, p, _| {
                Cell::from(r.health.map_or("-", |h| h.as_str())).style(p.health(r.health))
            },
        },
        Col {
            title: "PID",
            width: 7,
            key: None,
            cell: |r, _, _| Cell::from(r.glance.pid.map_or("-".to_owned(), |p| p.to_string())),
        },
        Col {
            title: "RST",
            width: 4,
            key: Some(SortKey::Restarts),
            cell: |r, _, _| Cell::from(r.glance.restarts.to_string()),
        },
        Col {
            title: "UPTIME",
            width: 7,
            key: Some(SortKey::Uptime),
            cell: |r, _, now| {
                let up = r.uptime_ms(now);
                Cell::from(if up > 0 {
                    fmt::duration_ms(up)
                } else {
                    "-".to_owned()
                })
            },
        },
        Col {
            title: "INFL",
            width: 4,
            key: Some(SortKey::InFlight),
            cell: |r, _, _| Cell::from(r.glance.in_flight.to_string()),
        },
        Col {
            title: "CALLS/MIN",
            width: 9,
            key: Some(SortKey::Rate),
            cell: |r, _, _| Cell::from(fmt::count(r.calls_last_min)),
        },
        Col {
            title: "LAST 2 MIN",
            width: SPARK as u16,
            key: None,
            cell: |r, p, _| {
                Cell::from(fmt::sparkline(&r.glance.calls.recent, SPARK)).style(p.fg(Color::Cyan))
            },
        },
        Col {
            title: "P50",
            width: 8,
            key: Some(SortKey::P50),
            cell: |r, _, _| Cell::from(fmt::latency_us(r.glance.calls.p50_us)),
        },
        Col {
            title: "P99",
            width: 8,
            key: Some(SortKey::P99),
            cell: |r, _, _| Cell::from(fmt::latency_us(r.glance.calls.p99_us)),
        },
        Col {
            title: "MEM/LIMIT",
            width: 10,
            key: Some(SortKey::Memory),
            cell: |r, p, _| {
                let g = &r.glance;
                let text = match (g.rss_bytes, g.memory_limit) {
                    (Some(u), Some(l)) => format!("{}/{}", fmt::bytes(u), fmt::bytes(l)),
                    (Some(u), None) => fmt::bytes(u),
                    _ => "-".to_owned(),
                };
                let near =
                    matches!((g.rss_bytes, g.memory_limit), (Some(u), Some(l)) if u * 10 >= l * 8);
                Cell::from(text).style(if near {
                    p.fg(Color::Red)
                } else {
                    Style::default()
                })
            },
        },
        Col {
            title: "CPU/LIMIT",
            width: 10,
            key: Some(SortKey::Cpu),
            cell: |r, p, _| {
                let g = &r.glance;
                let text = match (g.cpu, g.cpu_limit) {
                    (Some(u), Some(l)) => format!("{}/{}", fmt::cpu(u), fmt::cpu(l)),
                    (Some(u), None) => fmt::cpu(u),
                    _ => "-".to_owned(),
                };
                let near = matches!((g.cpu, g.cpu_limit), (Some(u), Some(l)) if u >= l * 0.8);
                Cell::from(text).style(if near {
                    p.fg(Color::Red)
                } else {
                    Style::default()
                })
            },
        },
        Col {
            title: "LAST EXIT",
            width: 0,
            key: None,
            cell: |r, _, now| {
                Cell::from(r.glance.last_exit.as_ref().map_or(String::new(), |e| {
                    format!("{} · {}", e.brief(), fmt::ago(e.at_ms, now))
                }))
            },
        },
    ]
}

fn draw_table(f: &mut Frame<'_>, app: &App, p: &Palette, area: Rect, now: i64) {
    let Some(o) = &app.overview else {
        return;
    };
    // Columns that fit, left to right; the last one takes the rest.
    let mut cols = columns();
    let mut used = 0u16;
    let mut keep = 0;
    for c in &cols {
        let w = if c.width == 0 { FLEX_MIN } else { c.width };
        if used + w + 1 > area.width && keep > 0 {
            break;
        }
        used += w + 1;
        keep += 1;
    }
    cols.truncate(keep.max(1));
    let sort = app.query.sort;
    let header = TRow::new(cols.iter().map(|c| {
        let mark = match (c.key == Some(sort), app.query.desc) {
            (true, false) => "▲",
            (true, true) => "▼",
            _ => "",
        };
        Cell::from(format!("{}{mark}", c.title))
    }))
    .style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let t = &o.extensions;
    let rows = t.rows.iter().enumerate().map(|(i, r)| {
        let row = TRow::new(cols.iter().map(|c| (c.cell)(r, p, now)));
        if t.offset + i == app.selected {
            row.style(Style::default().add_modifier(Modifier::REVERSED))
        } else {
            row
        }
    });
    let widths: Vec<Constraint> = cols
        .iter()
        .map(|c| {
            if c.width == 0 {
                Constraint::Fill(1)
            } else {
                Constraint::Length(c.width)
            }
        })
        .collect();
    f.render_widget(Table::new(rows, widths).header(header), area);
    if t.rows.is_empty() {
        let msg = if app.query.filter.is_empty() {
            " no extension is installed: `conduit ext install PATH`".to_owned()
        } else {
            format!(" no extension matches {:?}", app.query.filter)
        };
        let y = area.y + 1;
        if y < area.y + area.height {
            f.render_widget(
                Paragraph::new(msg),
                Rect {
                    y,
                    height: 1,
                    ..area
                },
            );
        }
    }
}

fn draw_detail(f: &mut Frame<'_>, app: &App, p: &Palette, area: Rect, now: i64) {
    let Some(o) = &app.overview else {
        return;
    };
    let name = app.selected_name();
    let detail = o
        .detail
        .as_ref()
        .filter(|d| Some(d.status.name.as_str()) == name);
    let Some(d) = detail else {
        f.render_widget(
            Block::default()
                .borders(Borders::TOP)
                .title(" (no extension selected) "),
            area,
        );
        return;
    };
    let s = &d.status;
    let title = format!(" {} {} — {} ", s.name, s.version, s.state);
    let block = Block::default().borders(Borders::TOP).title(Span::styled(
        title,
        p.state(s.state).add_modifier(Modifier::BOLD),
    ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(inner);
    let mut lines: Vec<Line<'_>> = Vec::new();
    if let Some(h) = &d.health
        && h.condition != Condition::Healthy
    {
        let since = h
            .since_ms
            .map_or(String::new(), |t| format!(" since {}", fmt::ago(t, now)));
        lines.push(Line::from(Span::styled(
            format!(
                "{}{since}: {}",
                h.condition.as_str(),
                h.reason.as_deref().unwrap_or("")
            ),
            p.health(Some(h.condition)),
        )));
    }
    if let Some(e) = &s.last_error {
        lines.push(Line::from(Span::styled(
            format!("last error: {e}"),
            p.fg(Color::Red),
        )));
    }
    if s.recent_exits.is_empty() {
        lines.push(Line::from("no exits since the daemon started it"));
    } else {
        lines.push(Line::from(Span::styled(
            "recent exits",
            Style::default().add_modifier(Modifier::BOLD),
        )));
        for e in &s.recent_exits {
            let cause = e.cause.as_str();
            lines.push(Line::from(format!(
                "{:>9}  pid {:<7} {cause}: {}",
                fmt::ago(e.at_ms, now),
                e.pid,
                e.summary
            )));
            for c in &e.in_flight {
                lines.push(Line::from(format!(
                    "           in flight: {} ({})",
                    c.method,
                    fmt::duration_ms(c.age_ms as i64)
                )));
            }
        }
    }
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), left);
    let tail_h = right.height.saturating_sub(1) as usize;
    let tail = &s.stderr_tail[s.stderr_tail.len().saturating_sub(tail_h)..];
    let mut lines = vec![Line::from(Span::styled(
        "stderr (newest last)",
        Style::default().add_modifier(Modifier::BOLD),
    ))];
    lines.extend(tail.iter().map(|l| Line::from(l.clone())));
    f.render_widget(Paragraph::new(lines), right);
}

fn draw_logs(f: &mut Frame<'_>, app: &App, name: &str, area: Rect) {
    let block = Block::default().borders(Borders::TOP).title(format!(
        " log of {name} (following; l or Esc to come back) "
    ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let h = inner.height as usize;
    let lines: Vec<Line<'_>> = app.logs[app.logs.len().saturating_sub(h)..]
        .iter()
        .map(|l| Line::from(l.clone()))
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}

fn draw_footer(f: &mut Frame<'_>, app: &App, p: &Palette, area: Rect) {
    let line = match &app.mode {
        Mode::Filter => Line::from(vec![
            Span::styled(" filter: ", Style::default().add_modifier(Modifier::BOLD)),
            Span::raw(app.query.filter.clone()),
            Span::styled("▏", Style::default().add_modifier(Modifier::SLOW_BLINK)),
            Span::raw("   Enter keeps it · Esc clears it"),
        ]),
        Mode::Confirm(act) => Line::from(Span::styled(
            format!(" {}", act.question()),
            p.fg(Color::Yellow).add_modifier(Modifier::BOLD),
        )),
        _ => {
            let mut spans = vec![Span::raw(
                " ↑↓ select · / filter · s sort · r restart · e enable · d disable · l logs · ? help · q quit",
            )];
            if !app.query.filter.is_empty() {
                spans.push(Span::styled(
                    format!(" · filter {:?}", app.query.filter),
                    Style::default().add_modifier(Modifier::BOLD),
                ));
            }
            if let Some(e) = &app.error {
                spans.push(Span::styled(
                    format!(" · daemon: {e}"),
                    p.fg(Color::Red).add_modifier(Modifier::BOLD),
                ));
            } else if let Some(m) = &app.message {
                spans.push(Span::styled(
                    format!(" · {m}"),
                    Style::default().add_modifier(Modifier::BOLD),
                ));
            }
            let pos = if app.matched() > 0 {
                format!(" · {}/{}", app.selected + 1, app.matched())
            } else {
                String::new()
            };
            spans.push(Span::raw(format!("{pos} · refresh #{}", app.refreshes)));
            Line::from(spans)
        }
    };
    f.render_widget(Paragraph::new(line), area);
}

fn draw_help(f: &mut Frame<'_>, area: Rect) {
    let w = area.width.min(86);
    let h = (HELP.len() as u16 + 6).min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let mut lines = vec![
        Line::from("A live view of the daemon through its management API, refreshed every"),
        Line::from("interval (--interval). Any key closes this help."),
        Line::from(""),
    ];
    lines.extend(
        HELP.iter()
            .map(|(k, what)| Line::from(format!(" {k:<16} {what}"))),
    );
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" conduit top — keys ")),
        r,
    );
}
