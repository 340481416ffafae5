//! What `conduit top` knows and how keys change it: the last overview, the selection, the
//! sort and filter, the mode (table, filter typing, a confirmation, help, logs), and the
//! events-per-second history. Pure: a key gives an [`Effect`] the loop in `mod.rs` carries out
//! (fetch now, call the API, quit), so the rules are tested without a terminal or a daemon.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::daemon::overview::{Overview, Query, SortKey};

/// How many refreshes of events-per-second the header's sparkline keeps.
pub(super) const RATE_HISTORY: usize = 60;

/// How many log lines the logs view asks for.
pub(super) const LOG_LINES: usize = 500;

/// What a key or an answer asks the loop to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Nothing,
    Redraw,
    /// Fetch now (the query changed), then redraw.
    Fetch,
    /// Call the API for this, then fetch.
    Act(Act),
    /// Clear the screen and draw it whole.
    Repaint,
    Quit,
}

/// A change the operator asked for (after confirming it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    Restart(String),
    Enable(String),
    Disable(String),
}

impl Act {
    /// The API request: `POST` this path.
    pub fn path(&self) -> String {
        let (name, verb) = match self {
            Act::Restart(n) => (n, "restart"),
            Act::Enable(n) => (n, "enable"),
            Act::Disable(n) => (n, "disable"),
        };
        format!("/v1/extensions/{name}/{verb}")
    }

    /// The question asked before it is done.
    pub fn question(&self) -> String {
        match self {
            Act::Restart(n) => format!("Restart {n}? Its calls in flight fail. [y/N]"),
            Act::Enable(n) => format!("Enable {n}? The daemon starts it. [y/N]"),
            Act::Disable(n) => {
                format!("Disable {n}? The daemon stops it and will not start it again. [y/N]")
            }
        }
    }

    /// What the footer says once it is done.
    pub fn done(&self) -> String {
        match self {
            Act::Restart(n) => format!("restarting {n}"),
            Act::Enable(n) => format!("enabled {n}"),
            Act::Disable(n) => format!("disabled {n}"),
        }
    }
}

/// What the keys do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Table,
    /// Typing the filter: letters go into it.
    Filter,
    Confirm(Act),
    Help,
    /// Following the selected extension's log.
    Logs(String),
}

/// The state of the view.
#[derive(Debug)]
pub struct App {
    pub query: Query,
    /// Index of the selected row among those that matched.
    pub selected: usize,
    pub overview: Option<Overview>,
    pub mode: Mode,
    /// The log lines of the extension followed in [`Mode::Logs`].
    pub logs: Vec<String>,
    /// Events accepted per second, one value per refresh, oldest first.
    pub event_rates: Vec<f64>,
    /// The last fetch's error, shown until a fetch succeeds.
    pub error: Option<String>,
    /// The last action's outcome.
    pub message: Option<String>,
    /// Answers applied so far.
    pub refreshes: u64,
    /// How many rows the table shows (set by each draw).
    pub table_rows: usize,
    /// The state directory, for the title.
    pub state_dir: String,
    pub interval_ms: u64,
    /// Whether to use colours (`NO_COLOR` unset or empty).
    pub color: bool,
}

impl App {
    pub fn new(state_dir: String, interval_ms: u64, color: bool) -> App {
        App {
            query: Query {
                limit: 50,
                ..Query::default()
            },
            selected: 0,
            overview: None,
            mode: Mode::Table,
            logs: Vec::new(),
            event_rates: Vec::new(),
            error: None,
            message: None,
            refreshes: 0,
            table_rows: 20,
            state_dir,
            interval_ms,
            color,
        }
    }

    /// How many rows matched the filter in the last answer.
    pub fn matched(&self) -> usize {
        self.overview.as_ref().map_or(0, |o| o.extensions.matched)
    }

    /// The selected row's name, if it is in the page shown.
    pub fn selected_name(&self) -> Option<&str> {
        let o = self.overview.as_ref()?;
        let i = self.selected.checked_sub(o.extensions.offset)?;
        o.extensions.rows.get(i).map(|r| r.name.as_str())
    }

    /// The request the next refresh makes: the overview (with the selected extension's
    /// detail), or the followed extension's log.
    pub fn request_path(&self) -> String {
        if let Mode::Logs(name) = &self.mode {
            return format!("/v1/extensions/{name}/logs?lines={LOG_LINES}");
        }
        let q = &self.query;
        let mut pairs = vec![
            ("sort", q.sort.as_str().to_owned()),
            ("order", if q.desc { "desc" } else { "asc" }.to_owned()),
            ("offset", q.offset.to_string()),
            ("limit", q.limit.to_string()),
        ];
        if !q.filter.is_empty() {
            pairs.push(("filter", q.filter.clone()));
        }
        if let Some(d) = &q.detail {
            pairs.push(("detail", d.clone()));
        }
        format!("/v1/overview?{}", crate::views::fmt::query(&pairs))
    }

    /// The page the table needs: `table_rows` rows from the scroll position, at most a page.
    pub fn set_table_rows(&mut self, rows: usize) -> bool {
        let rows = rows.clamp(1, conduit_protocol::rules::MAX_PAGE as usize);
        self.table_rows = rows;
        let before = (self.query.offset, self.query.limit);
        self.scroll_to_selection();
        self.query.limit = rows;
        before != (self.query.offset, self.query.limit)
    }

    fn scroll_to_selection(&mut self) {
        let rows = self.table_rows.max(1);
        if self.selected < self.query.offset {
            self.query.offset = self.selected;
        } else if self.selected >= self.query.offset + rows {
            self.query.offset = self.selected + 1 - rows;
        }
    }

    /// Take an overview in: the rate since the previous one, the selection kept in range and
    /// its name asked for in the next detail.
    pub fn apply(&mut self, o: Overview) -> Effect {
        if let Some(prev) = &self.overview {
            let dt = (o.at_ms - prev.at_ms) as f64 / 1e3;
            let de = o.store.latest_event_id - prev.store.latest_event_id;
            if dt > 0.0 && de >= 0 {
                self.event_rates.push(de as f64 / dt);
                if self.event_rates.len() > RATE_HISTORY {
                    self.event_rates.remove(0);
                }
            }
        }
        let matched = o.extensions.matched;
        self.overview = Some(o);
        self.error = None;
        self.refreshes += 1;
        if matched > 0 && self.selected >= matched {
            self.selected = matched - 1;
            self.scroll_to_selection();
            return Effect::Fetch;
        }
        self.want_detail()
    }

    /// Ask for the selected row's detail if the last answer had another's.
    fn want_detail(&mut self) -> Effect {
        let name = self.selected_name().map(str::to_owned);
        if name.is_some() && name != self.query.detail {
            self.query.detail = name;
            return Effect::Fetch;
        }
        Effect::Redraw
    }

    /// A log answer, for [`Mode::Logs`].
    pub fn apply_logs(&mut self, lines: Vec<String>) {
        self.logs = lines;
        self.error = None;
        self.refreshes += 1;
    }

    pub fn fail(&mut self, error: String) {
        self.error = Some(error);
    }

    fn move_to(&mut self, i: usize) -> Effect {
        let last = self.matched().saturating_sub(1);
        let i = i.min(last);
        if i == self.selected {
            return Effect::Nothing;
        }
        self.selected = i;
        let offset = self.query.offset;
        self.scroll_to_selection();
        if offset != self.query.offset {
            return Effect::Fetch;
        }
        match self.want_detail() {
            Effect::Fetch => Effect::Fetch,
            _ => Effect::Redraw,
        }
    }

    fn confirm(&mut self, act: fn(String) -> Act) -> Effect {
        match self.selected_name() {
            Some(n) => {
                self.mode = Mode::Confirm(act(n.to_owned()));
                Effect::Redraw
            }
            None => Effect::Nothing,
        }
    }

    /// The effect of a key.
    pub fn on_key(&mut self, key: KeyEvent) -> Effect {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('d')) {
            return Effect::Quit;
        }
        if ctrl && key.code == KeyCode::Char('l') {
            return Effect::Repaint;
        }
        match self.mode.clone() {
            Mode::Filter => self.filter_key(key),
            Mode::Confirm(act) => match key.code {
                KeyCode::Char('y') | KeyCode::Char('Y') | KeyCode::Enter => {
                    self.mode = Mode::Table;
                    Effect::Act(act)
                }
                _ => {
                    self.mode = Mode::Table;
                    self.message = Some("cancelled".to_owned());
                    Effect::Redraw
                }
            },
            Mode::Help => {
                self.mode = Mode::Table;
                match key.code {
                    KeyCode::Char('q') => Effect::Quit,
                    _ => Effect::Redraw,
                }
            }
            Mode::Logs(_) => match key.code {
                KeyCode::Char('q') => Effect::Quit,
                KeyCode::Esc | KeyCode::Char('l') | KeyCode::Enter => {
                    self.mode = Mode::Table;
                    self.logs.clear();
                    Effect::Fetch
                }
                _ => Effect::Nothing,
            },
            Mode::Table => self.table_key(key),
        }
    }

    fn filter_key(&mut self, key: KeyEvent) -> Effect {
        match key.code {
            KeyCode::Esc => {
                self.mode = Mode::Table;
                self.query.filter.clear();
            }
            KeyCode::Enter => {
                self.mode = Mode::Table;
                return Effect::Redraw;
            }
            KeyCode::Backspace => {
                self.query.filter.pop();
            }
            KeyCode::Char(c) if !c.is_control() => {
                if self.query.filter.chars().count() >= 64 {
                    return Effect::Nothing;
                }
                self.query.filter.push(c);
            }
            _ => return Effect::Nothing,
        }
        self.selected = 0;
        self.query.offset = 0;
        Effect::Fetch
    }

    fn table_key(&mut self, key: KeyEvent) -> Effect {
        let page = self.table_rows.max(1);
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => Effect::Quit,
            KeyCode::Down | KeyCode::Char('j') => self.move_to(self.selected + 1),
            KeyCode::Up | KeyCode::Char('k') => self.move_to(self.selected.saturating_sub(1)),
            KeyCode::PageDown => self.move_to(self.selected + page),
            KeyCode::PageUp => self.move_to(self.selected.saturating_sub(page)),
            KeyCode::Home | KeyCode::Char('g') => self.move_to(0),
            KeyCode::End | KeyCode::Char('G') => self.move_to(usize::MAX),
            KeyCode::Char('/') => {
                self.mode = Mode::Filter;
                Effect::Redraw
            }
            KeyCode::Char('s') | KeyCode::Char('S') => {
                let all = SortKey::ALL;
                let i = all.iter().position(|k| *k == self.query.sort).unwrap_or(0);
                let step = if key.code == KeyCode::Char('s') {
                    1
                } else {
                    all.len() - 1
                };
                self.query.sort = all[(i + step) % all.len()];
                // Figures read best largest first; names and states in order.
                self.query.desc = !matches!(self.query.sort, SortKey::Name | SortKey::State);
                Effect::Fetch
            }
            KeyCode::Char('o') => {
                self.query.desc = !self.query.desc;
                Effect::Fetch
            }
            KeyCode::Char('r') => self.confirm(Act::Restart),
            KeyCode::Char('e') => self.confirm(Act::Enable),
            KeyCode::Char('d') => self.confirm(Act::Disable),
            KeyCode::Char('l') => match self.selected_name() {
                Some(n) => {
                    self.mode = Mode::Logs(n.to_owned());
                    self.logs.clear();
                    Effect::Fetch
                }
                None => Effect::Nothing,
            },
            KeyCode::Char('?') | KeyCode::F(1) | KeyCode::Char('h') => {
                self.mode = Mode::Help;
                Effect::Redraw
            }
            KeyCode::Char(' ') | KeyCode::F(5) => Effect::Fetch,
            _ => Effect::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::overview::{DaemonFigures, Row, Table};
    use conduit_supervisor::{Glance, State, Status};

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn overview(
        names: &[&str],
        offset: usize,
        matched: usize,
        at_ms: i64,
        events: i64,
    ) -> Overview {
        let rows = names
            .iter()
            .map(|n| Row {
                name: (*n).to_owned(),
                version: "1".into(),
                enabled: true,
                health: None,
                calls_last_min: 0,
                glance: Glance::of(&Status::new(n, "1", State::Ready, None)),
            })
            .collect();
        Overview {
            at_ms,
            daemon: DaemonFigures {
                pid: 1,
                version: "0".into(),
                started_at_ms: 0,
                host_loop: serde_json::json!({}),
            },
            store: conduit_store::ViewCounts {
                latest_event_id: events,
                ..Default::default()
            },
            extensions: Table {
                installed: matched,
                by_state: Default::default(),
                degraded: 0,
                matched,
                offset,
                sort: SortKey::Name,
                desc: false,
                period_ms: 10_000,
                rows,
            },
            detail: None,
        }
    }

    #[test]
    fn an_answer_asks_for_the_selected_rows_detail_once() {
        let mut app = App::new("s".into(), 2000, false);
        assert_eq!(app.apply(overview(&["a", "b"], 0, 2, 0, 0)), Effect::Fetch);
        assert_eq!(app.query.detail.as_deref(), Some("a"));
        assert!(
            app.request_path().contains("detail=a"),
            "{}",
            app.request_path()
        );
        assert_eq!(
            app.apply(overview(&["a", "b"], 0, 2, 1000, 0)),
            Effect::Redraw
        );
        assert_eq!(app.on_key(key(KeyCode::Down)), Effect::Fetch);
        assert_eq!(app.query.detail.as_deref(), Some("b"));
        // At the last row, down does nothing.
        assert_eq!(app.on_key(key(KeyCode::Down)), Effect::Nothing);
    }

    #[test]
    fn moving_past_the_page_scrolls_and_fetches_the_next_rows() {
        let mut app = App::new("s".into(), 2000, false);
        app.set_table_rows(3);
        let names: Vec<String> = (0..3).map(|i| format!("e{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        app.apply(overview(&refs, 0, 1000, 0, 0));
        app.on_key(key(KeyCode::Down));
        app.on_key(key(KeyCode::Down));
        assert_eq!(app.query.offset, 0);
        assert_eq!(app.on_key(key(KeyCode::Down)), Effect::Fetch);
        assert_eq!((app.selected, app.query.offset), (3, 1));
        assert_eq!(app.on_key(key(KeyCode::End)), Effect::Fetch);
        assert_eq!((app.selected, app.query.offset), (999, 997));
        assert!(
            app.request_path().contains("offset=997&limit=3"),
            "{}",
            app.request_path()
        );
        assert_eq!(app.on_key(key(KeyCode::Home)), Effect::Fetch);
        assert_eq!((app.selected, app.query.offset), (0, 0));
        // A taller terminal asks for more rows.
        assert!(app.set_table_rows(40));
        assert!(!app.set_table_rows(40));
        assert!(app.set_table_rows(10_000));
        assert_eq!(app.query.limit, 200);
    }

    #[test]
    fn typing_a_filter_fetches_from_the_top_and_escape_clears_it() {
        let mut app = App::new("s".into(), 2000, false);
        app.selected = 5;
        app.query.offset = 3;
        assert_eq!(app.on_key(key(KeyCode::Char('/'))), Effect::Redraw);
        assert_eq!(app.on_key(key(KeyCode::Char('f'))), Effect::Fetch);
        assert_eq!(app.on_key(key(KeyCode::Char('l'))), Effect::Fetch);
        assert_eq!(
            (app.query.filter.as_str(), app.selected, app.query.offset),
            ("fl", 0, 0)
        );
        assert!(app.request_path().contains("filter=fl"));
        app.on_key(key(KeyCode::Backspace));
        assert_eq!(app.query.filter, "f");
        app.on_key(key(KeyCode::Enter));
        assert_eq!(app.mode, Mode::Table);
        assert_eq!(app.query.filter, "f");
        app.on_key(key(KeyCode::Char('/')));
        app.on_key(key(KeyCode::Esc));
        assert_eq!(
            (app.mode.clone(), app.query.filter.as_str()),
            (Mode::Table, "")
        );
        // Letters typed while filtering are not commands.
        app.on_key(key(KeyCode::Char('/')));
        assert_eq!(app.on_key(key(KeyCode::Char('q'))), Effect::Fetch);
        assert_eq!(app.query.filter, "q");
    }

    #[test]
    fn restart_enable_and_disable_ask_first() {
        let mut app = App::new("s".into(), 2000, false);
        app.apply(overview(&["echo"], 0, 1, 0, 0));
        assert_eq!(app.on_key(key(KeyCode::Char('r'))), Effect::Redraw);
        assert_eq!(app.mode, Mode::Confirm(Act::Restart("echo".into())));
        assert_eq!(
            app.on_key(key(KeyCode::Char('y'))),
            Effect::Act(Act::Restart("echo".into()))
        );
        assert_eq!(app.mode, Mode::Table);
        app.on_key(key(KeyCode::Char('d')));
        assert_eq!(app.on_key(key(KeyCode::Char('n'))), Effect::Redraw);
        assert_eq!(app.message.as_deref(), Some("cancelled"));
        app.on_key(key(KeyCode::Char('e')));
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Effect::Act(Act::Enable("echo".into()))
        );
        assert_eq!(Act::Disable("x".into()).path(), "/v1/extensions/x/disable");
    }

    #[test]
    fn sort_cycles_and_flips_and_quit_keys_quit() {
        let mut app = App::new("s".into(), 2000, false);
        assert_eq!(app.on_key(key(KeyCode::Char('s'))), Effect::Fetch);
        assert_eq!((app.query.sort, app.query.desc), (SortKey::State, false));
        app.on_key(key(KeyCode::Char('s')));
        assert_eq!((app.query.sort, app.query.desc), (SortKey::Health, true));
        app.on_key(key(KeyCode::Char('o')));
        assert!(!app.query.desc);
        app.on_key(key(KeyCode::Char('S')));
        assert_eq!(app.query.sort, SortKey::State);
        assert_eq!(app.on_key(key(KeyCode::Char('?'))), Effect::Redraw);
        assert_eq!(app.mode, Mode::Help);
        assert_eq!(app.on_key(key(KeyCode::Char('x'))), Effect::Redraw);
        assert_eq!(app.on_key(key(KeyCode::Char('q'))), Effect::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        app.mode = Mode::Filter;
        assert_eq!(app.on_key(ctrl_c), Effect::Quit);
    }

    #[test]
    fn logs_mode_asks_for_the_log_and_returns_to_the_table() {
        let mut app = App::new("s".into(), 2000, false);
        app.apply(overview(&["echo"], 0, 1, 0, 0));
        assert_eq!(app.on_key(key(KeyCode::Char('l'))), Effect::Fetch);
        assert_eq!(
            app.request_path(),
            format!("/v1/extensions/echo/logs?lines={LOG_LINES}")
        );
        assert_eq!(app.on_key(key(KeyCode::Esc)), Effect::Fetch);
        assert!(app.request_path().starts_with("/v1/overview?"));
    }

    #[test]
    fn the_event_rate_comes_from_the_newest_event_id_between_answers() {
        let mut app = App::new("s".into(), 2000, false);
        app.apply(overview(&["a"], 0, 1, 0, 100));
        assert!(app.event_rates.is_empty());
        app.apply(overview(&["a"], 0, 1, 2_000, 150));
        assert_eq!(app.event_rates, vec![25.0]);
        for i in 0..RATE_HISTORY as i64 + 5 {
            app.apply(overview(&["a"], 0, 1, 4_000 + i * 1000, 150));
        }
        assert_eq!(app.event_rates.len(), RATE_HISTORY);
    }
}
