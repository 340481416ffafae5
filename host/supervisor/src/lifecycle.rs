//! When an extension runs: from the daemon's start (`always`, the default) or from the first
//! thing that needs it (`on-demand`), and whether a run with nothing to do is stopped after a
//! while (`idle_stop_after`, off by default).
//!
//! Here are the settings ([`Lifecycle`], [`StartMode`]), the one parser of their values (the
//! manifest's `[lifecycle]` table and the operator's `conduit ext set` both call it), and the
//! pure decision of when a ready run is idle long enough to stop ([`idle_decision`], over
//! recorded facts and an injected `now`, as `backoff.rs` decides restarts).
//!
//! Invariant: nothing here does I/O or reads the clock; a time is always an argument.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// When the daemon starts an extension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartMode {
    /// At the daemon's start (and at install or enable): today's behaviour.
    #[default]
    Always,
    /// When something first needs it: an event of one of its kinds, a due timer, a wait or an
    /// emission it serves, an ingress poll, a management call.
    OnDemand,
}

impl StartMode {
    /// The name written in manifests, settings and status.
    pub fn as_str(self) -> &'static str {
        match self {
            StartMode::Always => "always",
            StartMode::OnDemand => "on-demand",
        }
    }

    /// `always` or `on-demand`; the error says what to write.
    pub fn parse(text: &str) -> Result<StartMode, String> {
        match text {
            "always" => Ok(StartMode::Always),
            "on-demand" => Ok(StartMode::OnDemand),
            _ => Err(format!(
                "is {text:?}; use \"always\" (started with the daemon) or \"on-demand\" (started when first needed)"
            )),
        }
    }
}

impl std::fmt::Display for StartMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The shortest `idle_stop_after`: a run is not stopped within a second of its last call.
pub const IDLE_STOP_MIN: Duration = Duration::from_secs(1);
/// The longest `idle_stop_after`: 30 days.
pub const IDLE_STOP_MAX: Duration = Duration::from_secs(30 * 24 * 3600);

/// When an extension runs and when an idle run of it stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lifecycle {
    pub start: StartMode,
    /// Stop a ready run after this long without a call (none in flight, no callback pending, no
    /// artifact stream open); `None`: never.
    pub idle_stop_after: Option<Duration>,
}

impl Lifecycle {
    pub fn on_demand(&self) -> bool {
        self.start == StartMode::OnDemand
    }
}

/// An `idle_stop_after` value: `off`, or a duration such as `30s`, `10m`, `1h`, `2d`,
/// `1500ms` (a bare number is seconds), from [`IDLE_STOP_MIN`] to [`IDLE_STOP_MAX`]. `off` is
/// `None`. The error says what is wrong and what to write.
pub fn parse_idle_stop_after(text: &str) -> Result<Option<Duration>, String> {
    let t = text.trim();
    if t == "off" {
        return Ok(None);
    }
    let fix =
        "write a duration such as \"30s\", \"10m\", \"1h\" or \"2d\" (from 1s to 30d), or \"off\"";
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("is {text:?}, not a duration; {fix}"))?;
    let ms_per = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("is {text:?}, with an unknown unit; {fix}")),
    };
    let d = n
        .checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("is {text:?}, far too long; {fix}"))?;
    if d < IDLE_STOP_MIN {
        return Err(format!("is {text:?}, below the least, 1s; {fix}"));
    }
    if d > IDLE_STOP_MAX {
        return Err(format!("is {text:?}, above the most, 30d; {fix}"));
    }
    Ok(Some(d))
}

/// A duration as `parse_idle_stop_after` reads it back, in the largest unit that divides it:
/// `30s`, `10m`, `1500ms`.
pub fn format_idle_stop_after(d: Option<Duration>) -> String {
    let Some(d) = d else {
        return "off".to_owned();
    };
    let ms = d.as_millis() as u64;
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// What the idle decision needs to know of a ready run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    /// Host calls to it awaiting an answer.
    pub calls_in_flight: usize,
    /// Its callbacks the host is still serving.
    pub callbacks_in_flight: usize,
    /// Artifact streams it has open.
    pub streams_open: usize,
    /// Holders keeping it awake (a host-loop pass that may call it); not calls.
    pub kept_awake: usize,
    /// When a call to it or a callback from it last began or ended (or the run became ready).
    pub last_call: Instant,
}

/// How soon a run that is busy (something in flight, open or keeping it awake) is looked at
/// again.
pub const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// Whether a ready run with `activity` is stopped for idleness at `now`, given
/// `idle_stop_after` (`after`): `Ok` once `after` has passed since its last call with nothing in
/// flight, open or keeping it awake; else `Err` with when to look again (the deadline, or
/// within [`IDLE_RECHECK`] while it is busy).
pub fn idle_decision(after: Duration, activity: &Activity, now: Instant) -> Result<(), Instant> {
    let busy = activity.calls_in_flight > 0
        || activity.callbacks_in_flight > 0
        || activity.streams_open > 0
        || activity.kept_awake > 0;
    let due = activity.last_call + after;
    match busy {
        true => Err(now + after.min(IDLE_RECHECK)),
        false if due <= now => Ok(()),
        false => Err(due),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_modes_parse_and_print_as_written() {
        for m in [StartMode::Always, StartMode::OnDemand] {
            assert_eq!(StartMode::parse(m.as_str()), Ok(m));
        }
        let e = StartMode::parse("lazy").unwrap_err();
        assert!(
            e.contains("\"always\"") && e.contains("\"on-demand\""),
            "{e}"
        );
        assert_eq!(StartMode::default(), StartMode::Always);
    }

    #[test]
    fn idle_stop_after_is_held_to_its_bounds_at_the_edges() {
        let ok = |t: &str| parse_idle_stop_after(t).unwrap();
        assert_eq!(ok("off"), None);
        assert_eq!(ok("1s"), Some(IDLE_STOP_MIN));
        assert_eq!(ok("1000ms"), Some(IDLE_STOP_MIN));
        assert_eq!(ok("30"), Some(Duration::from_secs(30)));
        assert_eq!(ok("10m"), Some(Duration::from_secs(600)));
        assert_eq!(ok("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(ok("30d"), Some(IDLE_STOP_MAX));
        let err = |t: &str| parse_idle_stop_after(t).unwrap_err();
        assert!(
            err("999ms").contains("below the least, 1s"),
            "{}",
            err("999ms")
        );
        assert!(err("0").contains("below the least"));
        assert!(err("2592001s").contains("above the most, 30d"));
        assert!(err("31d").contains("above the most"));
        assert!(err("5w").contains("unknown unit"));
        assert!(err("soon").contains("not a duration"));
        assert!(err("-1s").contains("not a duration"));
        assert!(err("99999999999999999d").contains("far too long"));
    }

    #[test]
    fn durations_print_in_the_largest_unit_and_read_back() {
        for (d, text) in [
            (None, "off"),
            (Some(Duration::from_secs(30)), "30s"),
            (Some(Duration::from_secs(600)), "10m"),
            (Some(Duration::from_millis(1500)), "1500ms"),
            (Some(Duration::from_secs(86_400)), "1d"),
        ] {
            assert_eq!(format_idle_stop_after(d), text);
            assert_eq!(parse_idle_stop_after(text).unwrap(), d);
        }
    }

    #[test]
    fn a_run_is_idle_only_with_nothing_in_flight_open_or_keeping_it_awake() {
        let t0 = Instant::now();
        let after = Duration::from_secs(30);
        let quiet = Activity {
            calls_in_flight: 0,
            callbacks_in_flight: 0,
            streams_open: 0,
            kept_awake: 0,
            last_call: t0,
        };
        // Not yet; at the deadline exactly; past it.
        let just_before = t0 + after - Duration::from_millis(1);
        assert_eq!(idle_decision(after, &quiet, just_before), Err(t0 + after));
        assert_eq!(idle_decision(after, &quiet, t0 + after), Ok(()));
        assert_eq!(idle_decision(after, &quiet, t0 + 2 * after), Ok(()));
        let late = t0 + 2 * after;
        for busy in [
            Activity {
                calls_in_flight: 1,
                ..quiet
            },
            Activity {
                callbacks_in_flight: 1,
                ..quiet
            },
            Activity {
                streams_open: 1,
                ..quiet
            },
            Activity {
                kept_awake: 1,
                ..quiet
            },
        ] {
            assert_eq!(
                idle_decision(after, &busy, late),
                Err(late + IDLE_RECHECK),
                "{busy:?}"
            );
        }
        // A short idle time is looked at again within itself.
        let busy = Activity {
            calls_in_flight: 1,
            ..quiet
        };
        let short = Duration::from_millis(400);
        assert_eq!(idle_decision(short, &busy, late), Err(late + short));
        // A later call moves the deadline with it.
        let later = Activity {
            last_call: t0 + Duration::from_secs(5),
            ..quiet
        };
        assert_eq!(
            idle_decision(after, &later, t0 + after),
            Err(t0 + Duration::from_secs(35))
        );
    }
}
