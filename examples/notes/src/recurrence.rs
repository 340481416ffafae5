//! `recurrence.next` for the `digest` recurrence: when a digest timer fires next.
//!
//! Two spec forms, as written when the timer was created:
//!
//! - `every <N><unit>`: a fixed interval after the firing, unit `s`, `m`, `h` or `d`; `N` is a
//!   positive integer and the interval at most 366 days (a typo like `every 5000000d` is refused
//!   rather than silently stopping the timer for millennia).
//! - `M H * * *`: every day at minute `M` (0–59) of hour `H` (0–23), UTC — the cron subset a
//!   daily digest needs. Day-of-month, month and day-of-week must be `*`.
//!
//! Anything else is refused; the handler answers `invalid_params` and the host falls back to
//! firing again a minute later.
//!
//! Invariant: [`Spec::next_after`] is strictly after the firing it is given (§6.2), so a timer
//! can never spin.

use std::fmt;

const SECOND_MS: i64 = 1_000;
const MINUTE_MS: i64 = 60 * SECOND_MS;
const HOUR_MS: i64 = 60 * MINUTE_MS;
const DAY_MS: i64 = 24 * HOUR_MS;

/// The longest interval `every` accepts.
pub const MAX_INTERVAL_MS: i64 = 366 * DAY_MS;

/// A parsed `digest` spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `every <N><unit>`: this many milliseconds after each firing.
    Every { interval_ms: i64 },
    /// `M H * * *`: daily at this UTC time.
    Daily { hour: u8, minute: u8 },
}

impl Spec {
    /// Read a spec; the error says what is wrong with it, for `invalid_params`.
    pub fn parse(spec: &str) -> Result<Spec, String> {
        let fields: Vec<&str> = spec.split_whitespace().collect();
        match fields.as_slice() {
            ["every", amount] => parse_every(amount).map_err(|why| format!("`{spec}`: {why}")),
            [minute, hour, "*", "*", "*"] => {
                let minute =
                    parse_field(minute, 59, "minute").map_err(|why| format!("`{spec}`: {why}"))?;
                let hour =
                    parse_field(hour, 23, "hour").map_err(|why| format!("`{spec}`: {why}"))?;
                Ok(Spec::Daily { hour, minute })
            }
            _ => Err(format!(
                "unknown digest spec `{spec}`: expected `every <N>(s|m|h|d)` or `M H * * *`"
            )),
        }
    }

    /// The next firing strictly after `fired_at_ms`, or `None` past the end of time (i64 ms).
    pub fn next_after(self, fired_at_ms: i64) -> Option<i64> {
        match self {
            Spec::Every { interval_ms } => fired_at_ms.checked_add(interval_ms),
            Spec::Daily { hour, minute } => {
                let day = fired_at_ms.div_euclid(DAY_MS) * DAY_MS;
                let at = day + i64::from(hour) * HOUR_MS + i64::from(minute) * MINUTE_MS;
                // At the very minute (or later that day): the next one is tomorrow's.
                if at > fired_at_ms {
                    Some(at)
                } else {
                    at.checked_add(DAY_MS)
                }
            }
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Spec::Every { interval_ms } => write!(f, "every {}s", interval_ms / SECOND_MS),
            Spec::Daily { hour, minute } => write!(f, "{minute} {hour} * * *"),
        }
    }
}

fn parse_every(amount: &str) -> Result<Spec, String> {
    let split = amount
        .find(|c: char| !c.is_ascii_digit())
        .ok_or("the interval needs a unit: s, m, h or d")?;
    let (digits, unit) = amount.split_at(split);
    let unit_ms = match unit {
        "s" => SECOND_MS,
        "m" => MINUTE_MS,
        "h" => HOUR_MS,
        "d" => DAY_MS,
        other => return Err(format!("unknown unit `{other}`: use s, m, h or d")),
    };
    if digits.is_empty() {
        return Err("the interval needs a number before its unit".into());
    }
    // Digits only, so a parse failure can only be an overflow.
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("`{digits}` is too large"))?;
    if n == 0 {
        return Err("the interval must be at least 1".into());
    }
    match n.checked_mul(unit_ms) {
        Some(ms) if ms <= MAX_INTERVAL_MS => Ok(Spec::Every { interval_ms: ms }),
        _ => Err("the interval must be at most 366 days".into()),
    }
}

fn parse_field(field: &str, max: u8, what: &str) -> Result<u8, String> {
    if field.is_empty() || field.len() > 2 || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "the {what} must be a number from 0 to {max}, not `{field}`"
        ));
    }
    let v: u8 = field.parse().expect("one or two digits");
    if v > max {
        return Err(format!("the {what} must be at most {max}, not {v}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2025-12-01T09:20:00Z.
    const T0: i64 = 1_764_580_800_000;

    fn next(spec: &str, at: i64) -> i64 {
        Spec::parse(spec).unwrap().next_after(at).unwrap()
    }

    #[test]
    fn t0_is_what_the_tests_say() {
        assert_eq!(T0 % DAY_MS, 9 * HOUR_MS + 20 * MINUTE_MS);
    }

    #[test]
    fn every_adds_the_interval() {
        assert_eq!(next("every 15m", T0), T0 + 15 * MINUTE_MS);
        assert_eq!(next("every 1s", T0), T0 + 1_000);
        assert_eq!(next("every 2h", T0), T0 + 2 * HOUR_MS);
        assert_eq!(next("  every   3d ", T0), T0 + 3 * DAY_MS);
        assert_eq!(next("every 015m", T0), T0 + 15 * MINUTE_MS);
    }

    #[test]
    fn every_has_bounds() {
        assert_eq!(
            Spec::parse("every 366d").unwrap(),
            Spec::Every {
                interval_ms: MAX_INTERVAL_MS
            }
        );
        for bad in [
            "every 0s",
            "every 0m",
            "every 367d",
            "every 8785h",
            "every 99999999999999999999s",
            "every 9223372036854775807d",
            "every m",
            "every 15",
            "every 15w",
            "every -5m",
            "every 1.5h",
            "every",
            "every 15 m",
        ] {
            assert!(Spec::parse(bad).is_err(), "{bad} should be refused");
        }
        assert_eq!(next("every 8784h", T0), T0 + MAX_INTERVAL_MS);
    }

    #[test]
    fn daily_fires_later_the_same_day_or_tomorrow() {
        // 09:30 is later today; 09:00 has passed, so tomorrow.
        assert_eq!(next("30 9 * * *", T0), T0 + 10 * MINUTE_MS);
        assert_eq!(next("0 9 * * *", T0), T0 - 20 * MINUTE_MS + DAY_MS);
        assert_eq!(
            next("0 0 * * *", T0),
            T0 - (9 * HOUR_MS + 20 * MINUTE_MS) + DAY_MS
        );
        assert_eq!(next("59 23 * * *", T0), T0 + 14 * HOUR_MS + 39 * MINUTE_MS);
    }

    #[test]
    fn daily_at_the_same_minute_rolls_to_the_next_day() {
        // Fired exactly at 09:20:00.000, and a few seconds into that minute.
        assert_eq!(next("20 9 * * *", T0), T0 + DAY_MS);
        assert_eq!(next("20 9 * * *", T0 + 7_250), T0 + DAY_MS);
        // A millisecond before, it is still today.
        assert_eq!(next("20 9 * * *", T0 - 1), T0);
    }

    #[test]
    fn daily_works_before_1970_too() {
        // 1969-12-31T23:00:00Z fires at 00:30 on 1970-01-01.
        assert_eq!(next("30 0 * * *", -HOUR_MS), 30 * MINUTE_MS);
    }

    #[test]
    fn daily_fields_are_checked() {
        for bad in [
            "60 9 * * *",
            "30 24 * * *",
            "-1 9 * * *",
            "30 9 1 * *",
            "30 9 * * 1-5",
            "*/5 * * * *",
            "30 9 * *",
            "30 9 * * * *",
            "123 9 * * *",
            "a b * * *",
            "",
            "hourly",
        ] {
            assert!(Spec::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn next_is_always_strictly_later() {
        for spec in ["every 1s", "0 0 * * *", "59 23 * * *", "20 9 * * *"] {
            let s = Spec::parse(spec).unwrap();
            for at in [i64::MIN / 2, -1, 0, 1, T0, T0 + 59_999, T0 + DAY_MS - 1] {
                assert!(s.next_after(at).unwrap() > at, "{spec} at {at}");
            }
        }
        assert_eq!(Spec::parse("every 1s").unwrap().next_after(i64::MAX), None);
    }

    #[test]
    fn display_round_trips_daily_specs() {
        let s = Spec::parse("5 7 * * *").unwrap();
        assert_eq!(Spec::parse(&s.to_string()).unwrap(), s);
    }
}
