//! `conduit top`: a live terminal view of the daemon, through its management API only.
//!
//! ```text
//!   keys, resizes ──► App::on_key ──► Effect ──► fetch now / POST an action / quit
//!   every interval ─► one GET /v1/overview (or the followed log) ──► App::apply ──► draw
//! ```
//!
//! One request per refresh: the overview answers the figures, one page of the table (the rows
//! the terminal has room for, sorted and filtered by the daemon) and the selected extension's
//! detail. A refresh is never started while one is in flight; a key that changes the query
//! asks for one at once. The screen is drawn only when something changed, by ratatui, which
//! writes only the cells that differ (no flicker), on the alternate screen in raw mode.
//!
//! Invariant: the terminal is given back as it was found — raw mode off, the main screen,
//! the cursor shown — on quit, on an error, on SIGTERM/SIGINT/SIGHUP, and on a panic (the hook
//! restores it before the panic is printed). `--once` draws one frame on the main screen,
//! without raw mode, and leaves it there.

mod app;
mod draw;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Context;
use crossterm::event::{Event, EventStream};
use crossterm::terminal;
use futures::StreamExt;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

pub use app::{Act, App, Effect, Mode};
pub use draw::HELP;

use crate::client::Client;
use crate::daemon::overview::Overview;

/// How long one request may take before the view says the daemon is not answering (and asks
/// again at the next refresh).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What `conduit top` was asked for.
#[derive(Clone, Debug)]
pub struct Options {
    pub interval: Duration,
    pub once: bool,
    /// The state directory, for the title.
    pub state_dir: String,
}

/// Why `conduit top` did not run.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(
        "conduit top draws on a terminal, and its {0} is not one; for a script, read `conduit ext status --json` or `GET /v1/overview` on the daemon's socket"
    )]
    NotATerminal(&'static str),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Check that standard input and output are a terminal (both are needed: keys come in, the
/// screen goes out; `--once` needs only the output).
pub fn check_terminal(once: bool) -> Result<(), TopError> {
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal("standard output"));
    }
    if !once && !std::io::stdin().is_terminal() {
        return Err(TopError::NotATerminal("standard input"));
    }
    Ok(())
}

fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Run the view until the operator quits (or, with `--once`, draw one frame).
pub async fn run(client: Client, opts: Options) -> Result<(), TopError> {
    check_terminal(opts.once)?;
    let mut app = App::new(
        opts.state_dir.clone(),
        opts.interval.as_millis() as u64,
        color(),
    );
    if opts.once {
        return once(&client, &mut app).await;
    }
    let _guard = TermGuard::enter().context("cannot set up the terminal")?;
    let backend = CrosstermBackend::new(std::io::stdout());
    let mut term = Terminal::new(backend).context("cannot set up the terminal")?;
    term.clear().context("cannot clear the terminal")?;
    let res = event_loop(&client, &mut app, &mut term, opts.interval).await;
    drop(term);
    res.map_err(TopError::Failed)
}

/// One frame on the main screen: fetch (twice when the first answer names the row whose detail
/// to show), draw, leave the cursor below it.
async fn once(client: &Client, app: &mut App) -> Result<(), TopError> {
    let backend = CrosstermBackend::new(std::io::stdout());
    let mut term = Terminal::new(backend).context("cannot set up the terminal")?;
    let size = term.size().context("cannot read the terminal's size")?;
    app.set_table_rows(size.height.saturating_sub(6 + 12) as usize);
    for _ in 0..3 {
        match fetch(client, app.request_path()).await {
            Ok(Answer::Overview(o)) => {
                if app.apply(*o) != Effect::Fetch {
                    break;
                }
            }
            Ok(Answer::Logs(_)) => break,
            Err(e) => {
                return Err(TopError::Failed(
                    e.context("the daemon did not answer the overview"),
                ));
            }
        }
    }
    term.clear().context("cannot clear the terminal")?;
    term.draw(|f| draw::frame(f, app)).context("cannot draw")?;
    let mut out = std::io::stdout();
    let _ = writeln!(out);
    let _ = out.flush();
    Ok(())
}

/// What a refresh brought back.
enum Answer {
    Overview(Box<Overview>),
    Logs(Vec<String>),
}

async fn fetch(client: &Client, path: String) -> anyhow::Result<Answer> {
    let v = tokio::time::timeout(REQUEST_TIMEOUT, client.get(&path))
        .await
        .with_context(|| format!("no answer within {REQUEST_TIMEOUT:?}"))??;
    if path.starts_with("/v1/overview") {
        let o: Overview = serde_json::from_value(v).context("the overview does not read")?;
        Ok(Answer::Overview(Box::new(o)))
    } else {
        Ok(Answer::Logs(crate::views::fmt::log_lines(&v)))
    }
}

type Term = Terminal<CrosstermBackend<std::io::Stdout>>;

async fn event_loop(
    client: &Client,
    app: &mut App,
    term: &mut Term,
    interval: Duration,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut events = EventStream::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight: Option<std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Answer>>>>> =
        None;
    // A fetch asked for while one was in flight: made as soon as that one ends.
    let mut again = false;
    let mut dirty = true;
    loop {
        if dirty {
            let before = app.request_path();
            term.draw(|f| draw::frame(f, app))?;
            dirty = false;
            // The draw sized the table; a page of another size is asked for at once.
            if app.request_path() != before {
                again = true;
            }
        }
        if in_flight.is_none() && again {
            again = false;
            let c = client.clone();
            let path = app.request_path();
            in_flight = Some(Box::pin(async move { fetch(&c, path).await }));
        }
        tokio::select! {
            _ = tick.tick() => {
                if in_flight.is_none() {
                    let c = client.clone();
                    let path = app.request_path();
                    in_flight = Some(Box::pin(async move { fetch(&c, path).await }));
                } else {
                    again = true;
                }
            }
            res = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                in_flight = None;
                match res {
                    Ok(Answer::Overview(o)) => {
                        // An overview that arrives after the log was asked for is
                        // dropped; the log is fetched instead.
                        if matches!(app.mode, Mode::Logs(_)) || app.apply(*o) == Effect::Fetch {
                            again = true;
                        }
                    }
                    Ok(Answer::Logs(lines)) => {
                        if matches!(app.mode, Mode::Logs(_)) {
                            app.apply_logs(lines);
                        }
                    }
                    Err(e) => app.fail(format!("{e:#}")),
                }
                dirty = true;
            }
            ev = events.next() => {
                match ev {
                    Some(Ok(Event::Key(key))) if key.kind != crossterm::event::KeyEventKind::Release => {
                        match app.on_key(key) {
                            Effect::Nothing => {}
                            Effect::Redraw => dirty = true,
                            Effect::Fetch => {
                                again = true;
                                dirty = true;
                            }
                            Effect::Repaint => {
                                term.clear()?;
                                dirty = true;
                            }
                            Effect::Act(act) => {
                                app.message = Some(match client.post(&act.path(), None).await {
                                    Ok(_) => act.done(),
                                    Err(e) => format!("{} failed: {e:#}", act.path()),
                                });
                                again = true;
                                dirty = true;
                            }
                            Effect::Quit => return Ok(()),
                        }
                    }
                    Some(Ok(Event::Resize(..))) => {
                        // ratatui resizes its buffers at the next draw and redraws whole.
                        term.autoresize()?;
                        dirty = true;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(anyhow::Error::new(e).context("cannot read the terminal")),
                    None => return Ok(()),
                }
            }
            _ = sigterm.recv() => return Ok(()),
            _ = sigint.recv() => return Ok(()),
            _ = sighup.recv() => return Ok(()),
        }
    }
}

/// Raw mode and the alternate screen for as long as it lives; the terminal is restored when
/// it is dropped, and by the panic hook it installs.
struct TermGuard;

impl TermGuard {
    fn enter() -> anyhow::Result<TermGuard> {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            prev(info);
        }));
        terminal::enable_raw_mode()?;
        crossterm::execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(TermGuard)
    }
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Give the terminal back: the main screen, the cursor, cooked mode. Safe to call twice.
fn restore() {
    let _ = crossterm::execute!(
        std::io::stdout(),
        terminal::LeaveAlternateScreen,
        crossterm::cursor::Show
    );
    let _ = terminal::disable_raw_mode();
}
