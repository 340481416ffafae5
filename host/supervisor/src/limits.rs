//! Per-extension resource limits: what they are, their defaults and bounds, how they are read
//! from text, how a package's ask and an operator's setting combine, and the part applied in
//! the child before exec (rlimits).
//!
//! Four limits, each per extension (its whole process tree):
//!
//! | key          | unit                    | default  | bounds                 |
//! |--------------|-------------------------|----------|------------------------|
//! | `memory`     | bytes (`"256MiB"` too)  | 1 GiB    | 16 MiB ..= 1 TiB       |
//! | `cpu`        | share of one CPU        | 1.0      | 0.01 ..= 1024          |
//! | `tasks`      | processes and threads   | 256      | 1 ..= 100000           |
//! | `open_files` | descriptors per process | 1024     | 16 ..= 1048576         |
//!
//! The package asks, the operator decides ([`resolve`]): an operator's setting always wins; a
//! package's ask is taken when it is at most the default (a package may tighten its own
//! limits), and an ask above the default is shown and left for the operator to grant.
//!
//! Enforcement without cgroups (see `docs/operations.md`, "Limits and the sandbox"): in the
//! child, `RLIMIT_NOFILE` = `open_files` and `RLIMIT_DATA` = twice `memory` (a backstop for one
//! process allocating faster than the supervisor looks); in the supervisor, the tree's summed
//! RSS and task count are read from `/proc` every `usage::SAMPLE_INTERVAL` and an
//! extension over either is stopped, and the CPU share is held by a SIGSTOP/SIGCONT duty cycle
//! (`usage::CpuBudget`). `RLIMIT_NPROC` is not used: it counts every process of the
//! user, not of the extension, and root ignores it. `RLIMIT_CPU` is not used: it bounds the
//! total CPU seconds of a process's life, so it would end a healthy long-running extension and
//! cannot express a share.

use std::fmt;

use serde::{Deserialize, Serialize};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// The limits in force for one extension.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Bytes of resident memory, summed over the extension's process tree.
    pub memory: u64,
    /// Share of one CPU (0.5 = half of one core), summed over the tree.
    pub cpu: f64,
    /// Processes and threads in the tree.
    pub tasks: u32,
    /// Open descriptors per process.
    pub open_files: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        memory: GIB,
        cpu: 1.0,
        tasks: 256,
        open_files: 1024,
    };

    /// The value of `key`, as a number (bytes, share, count).
    pub fn get(&self, key: LimitKey) -> f64 {
        match key {
            LimitKey::Memory => self.memory as f64,
            LimitKey::Cpu => self.cpu,
            LimitKey::Tasks => f64::from(self.tasks),
            LimitKey::OpenFiles => f64::from(self.open_files),
        }
    }

    fn set(&mut self, v: LimitValue) {
        match v {
            LimitValue::Memory(b) => self.memory = b,
            LimitValue::Cpu(c) => self.cpu = c,
            LimitValue::Tasks(n) => self.tasks = n,
            LimitValue::OpenFiles(n) => self.open_files = n,
        }
    }

    /// What `key` is set to, for people: `256 MiB`, `0.5 CPU`, `64`.
    pub fn show(&self, key: LimitKey) -> String {
        match key {
            LimitKey::Memory => format_bytes(self.memory),
            LimitKey::Cpu => format!("{} CPU", self.cpu),
            LimitKey::Tasks => self.tasks.to_string(),
            LimitKey::OpenFiles => self.open_files.to_string(),
        }
    }

    /// Apply the per-process part in the calling process (the child, between fork and exec):
    /// `RLIMIT_NOFILE` and `RLIMIT_DATA`. Async-signal-safe: two `setrlimit` calls.
    pub fn apply_rlimits(&self) -> std::io::Result<()> {
        set_rlimit(libc::RLIMIT_NOFILE as _, u64::from(self.open_files))?;
        set_rlimit(libc::RLIMIT_DATA as _, self.memory.saturating_mul(2))?;
        Ok(())
    }
}

#[cfg(target_os = "linux")]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_os = "linux"))]
type Resource = libc::c_int;

fn set_rlimit(resource: Resource, value: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value as libc::rlim_t,
        rlim_max: value as libc::rlim_t,
    };
    // SAFETY: a plain system call on a stack value.
    if unsafe { libc::setrlimit(resource, &lim) } == 0 {
        return Ok(());
    }
    // Raising a hard limit above the daemon's own is refused for an unprivileged user: keep
    // the hard limit, lower only the soft one.
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(resource, &mut cur) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let lim = libc::rlimit {
        rlim_cur: (value as libc::rlim_t).min(cur.rlim_max),
        rlim_max: cur.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(resource, &lim) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One of the four limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKey {
    Memory,
    Cpu,
    Tasks,
    OpenFiles,
}

impl LimitKey {
    pub const ALL: [LimitKey; 4] = [
        LimitKey::Memory,
        LimitKey::Cpu,
        LimitKey::Tasks,
        LimitKey::OpenFiles,
    ];

    /// Its name in a manifest's `[limits]`, the operator's file and `ext set`.
    pub fn name(self) -> &'static str {
        match self {
            LimitKey::Memory => "memory",
            LimitKey::Cpu => "cpu",
            LimitKey::Tasks => "tasks",
            LimitKey::OpenFiles => "open_files",
        }
    }

    pub fn from_name(name: &str) -> Option<LimitKey> {
        LimitKey::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What a valid value looks like, for error messages.
    pub fn rule(self) -> &'static str {
        match self {
            LimitKey::Memory => {
                "bytes from 16 MiB to 1 TiB, as a number or with a unit (\"256MiB\", \"1GiB\", \"512MB\")"
            }
            LimitKey::Cpu => {
                "a share of one CPU from 0.01 to 1024 (\"0.5\" is half a core, \"2\" two cores; \"50%\" also works)"
            }
            LimitKey::Tasks => "a whole number of processes and threads from 1 to 100000",
            LimitKey::OpenFiles => "a whole number of descriptors from 16 to 1048576",
        }
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed, in-bounds value of one limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LimitValue {
    Memory(u64),
    Cpu(f64),
    Tasks(u32),
    OpenFiles(u32),
}

/// A limit value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`limits.{key}` is {value:?}: {problem}; use {}", key.rule())]
pub struct LimitError {
    pub key: LimitKey,
    pub value: String,
    pub problem: String,
}

/// Parse `text` as a value of `key`, within its bounds. The one rule for a limit's value: the
/// manifest, the operator's file and `conduit ext set` all call it.
pub fn parse_value(key: LimitKey, text: &str) -> Result<LimitValue, LimitError> {
    let err = |problem: &str| LimitError {
        key,
        value: text.to_owned(),
        problem: problem.to_owned(),
    };
    let t = text.trim();
    match key {
        LimitKey::Memory => {
            let b = parse_bytes(t).ok_or_else(|| err("not a size"))?;
            if b < 16 * MIB {
                return Err(err("below the least, 16 MiB"));
            }
            if b > TIB {
                return Err(err("above the most, 1 TiB"));
            }
            Ok(LimitValue::Memory(b))
        }
        LimitKey::Cpu => {
            let share = match t.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
                None => t.parse::<f64>(),
            }
            .map_err(|_| err("not a number"))?;
            if !share.is_finite() || share < 0.01 {
                return Err(err("below the least, 0.01"));
            }
            if share > 1024.0 {
                return Err(err("above the most, 1024"));
            }
            Ok(LimitValue::Cpu(share))
        }
        LimitKey::Tasks | LimitKey::OpenFiles => {
            let n: u64 = t.parse().map_err(|_| err("not a whole number"))?;
            let (lo, hi) = if key == LimitKey::Tasks {
                (1, 100_000)
            } else {
                (16, 1_048_576)
            };
            if n < lo {
                return Err(err(&format!("below the least, {lo}")));
            }
            if n > hi {
                return Err(err(&format!("above the most, {hi}")));
            }
            Ok(if key == LimitKey::Tasks {
                LimitValue::Tasks(n as u32)
            } else {
                LimitValue::OpenFiles(n as u32)
            })
        }
    }
}

/// `"256MiB"`, `"256 MiB"`, `"1GiB"`, `"512MB"`, `"64K"` (binary), `"1048576"`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if num.contains('.') {
        let f: f64 = num.parse().ok()?;
        let v = f * mult as f64;
        return (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64);
    }
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Bytes for people: `256 MiB`, `1 GiB`, `1.5 GiB`, `700 KiB`, `12 B`.
pub fn format_bytes(n: u64) -> String {
    for (unit, size) in [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if n >= size {
            let v = n as f64 / size as f64;
            return if n.is_multiple_of(size) {
                format!("{} {unit}", n / size)
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{n} B")
}

/// Some of the four limits: a package's ask or an operator's setting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitSet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u32>,
}

// Every value in a set has passed `parse_value`, which refuses NaN.
impl Eq for LimitSet {}

impl LimitSet {
    pub fn is_empty(&self) -> bool {
        self == &LimitSet::default()
    }

    pub fn put(&mut self, v: LimitValue) {
        match v {
            LimitValue::Memory(b) => self.memory = Some(b),
            LimitValue::Cpu(c) => self.cpu = Some(c),
            LimitValue::Tasks(n) => self.tasks = Some(n),
            LimitValue::OpenFiles(n) => self.open_files = Some(n),
        }
    }

    pub fn clear(&mut self, key: LimitKey) {
        match key {
            LimitKey::Memory => self.memory = None,
            LimitKey::Cpu => self.cpu = None,
            LimitKey::Tasks => self.tasks = None,
            LimitKey::OpenFiles => self.open_files = None,
        }
    }

    pub fn get(&self, key: LimitKey) -> Option<LimitValue> {
        match key {
            LimitKey::Memory => self.memory.map(LimitValue::Memory),
            LimitKey::Cpu => self.cpu.map(LimitValue::Cpu),
            LimitKey::Tasks => self.tasks.map(LimitValue::Tasks),
            LimitKey::OpenFiles => self.open_files.map(LimitValue::OpenFiles),
        }
    }
}

/// Where a limit in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSource {
    Default,
    Package,
    Operator,
}

/// The limits in force and how each was decided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resolved {
    pub limits: Limits,
    pub sources: std::collections::BTreeMap<LimitKey, LimitSource>,
    /// Asks of the package that were not granted, for people (`the package asks for 4 GiB of
    /// memory, above the default 1 GiB; grant it with ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_granted: Vec<String>,
}

/// The package asks, the operator decides: the one rule that combines them (daemon, checker
/// and `ext status` all call it). An operator's setting wins; a package's ask is taken when it
/// is at most the default; above it, the default stays and the ask is reported.
pub fn resolve(name: &str, package: &LimitSet, operator: &LimitSet) -> Resolved {
    let mut limits = Limits::DEFAULT;
    let mut sources = std::collections::BTreeMap::new();
    let mut not_granted = Vec::new();
    for key in LimitKey::ALL {
        let source = if let Some(v) = operator.get(key) {
            limits.set(v);
            LimitSource::Operator
        } else if let Some(v) = package.get(key) {
            let mut asked = Limits::DEFAULT;
            asked.set(v);
            if asked.get(key) <= Limits::DEFAULT.get(key) {
                limits.set(v);
                LimitSource::Package
            } else {
                not_granted.push(format!(
                    "the package asks for {} {key}, above the default {}; `conduit ext set {name} limits.{key}={}` grants it",
                    asked.show(key),
                    Limits::DEFAULT.show(key),
                    plain(&asked, key),
                ));
                LimitSource::Default
            }
        } else {
            LimitSource::Default
        };
        sources.insert(key, source);
    }
    Resolved {
        limits,
        sources,
        not_granted,
    }
}

/// A value as `ext set` takes it back.
fn plain(l: &Limits, key: LimitKey) -> String {
    match key {
        LimitKey::Memory => format_bytes(l.memory).replace(' ', ""),
        _ => l.show(key).trim_end_matches(" CPU").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_bytes("256MiB"), Some(256 * MIB));
        assert_eq!(parse_bytes("256 MiB"), Some(256 * MIB));
        assert_eq!(parse_bytes("1GiB"), Some(GIB));
        assert_eq!(parse_bytes("1.5G"), Some(GIB + GIB / 2));
        assert_eq!(parse_bytes("512MB"), Some(512_000_000));
        assert_eq!(parse_bytes("1048576"), Some(MIB));
        assert_eq!(parse_bytes("12 parsecs"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999999999"), None);
        assert_eq!(format_bytes(256 * MIB), "256 MiB");
        assert_eq!(format_bytes(GIB + GIB / 2), "1.5 GiB");
    }

    #[test]
    fn each_limit_is_refused_one_past_its_bounds_and_accepted_at_them() {
        use LimitKey::*;
        let ok = |k, t: &str| parse_value(k, t).unwrap();
        let bad = |k, t: &str| parse_value(k, t).unwrap_err().to_string();
        assert_eq!(ok(Memory, "16MiB"), LimitValue::Memory(16 * MIB));
        assert!(bad(Memory, &(16 * MIB - 1).to_string()).contains("below the least, 16 MiB"));
        assert_eq!(ok(Memory, "1TiB"), LimitValue::Memory(TIB));
        assert!(bad(Memory, &(TIB + 1).to_string()).contains("above the most"));
        assert_eq!(ok(Cpu, "0.01"), LimitValue::Cpu(0.01));
        assert_eq!(ok(Cpu, "50%"), LimitValue::Cpu(0.5));
        assert!(bad(Cpu, "0.009").contains("below the least"));
        assert!(bad(Cpu, "1024.5").contains("above the most"));
        assert!(bad(Cpu, "NaN").contains("below the least"));
        assert_eq!(ok(Tasks, "1"), LimitValue::Tasks(1));
        assert!(bad(Tasks, "0").contains("below the least, 1"));
        assert!(bad(Tasks, "100001").contains("above the most, 100000"));
        assert_eq!(ok(OpenFiles, "16"), LimitValue::OpenFiles(16));
        assert!(bad(OpenFiles, "15").contains("below the least, 16"));
        assert!(bad(OpenFiles, "1048577").contains("above the most"));
        let msg = bad(Memory, "lots");
        assert!(
            msg.contains("`limits.memory`") && msg.contains("256MiB"),
            "{msg}"
        );
    }

    #[test]
    fn the_package_may_tighten_the_operator_decides_the_rest() {
        let package = LimitSet {
            memory: Some(4 * GIB),
            tasks: Some(32),
            ..LimitSet::default()
        };
        let r = resolve("p", &package, &LimitSet::default());
        assert_eq!(r.limits.memory, Limits::DEFAULT.memory);
        assert_eq!(r.limits.tasks, 32);
        assert_eq!(r.sources[&LimitKey::Tasks], LimitSource::Package);
        assert_eq!(r.sources[&LimitKey::Memory], LimitSource::Default);
        assert_eq!(r.not_granted.len(), 1);
        assert!(
            r.not_granted[0].contains("conduit ext set p limits.memory=4GiB"),
            "{:?}",
            r.not_granted
        );
        let operator = LimitSet {
            memory: Some(4 * GIB),
            tasks: Some(512),
            ..LimitSet::default()
        };
        let r = resolve("p", &package, &operator);
        assert_eq!((r.limits.memory, r.limits.tasks), (4 * GIB, 512));
        assert!(r.not_granted.is_empty());
        assert_eq!(r.sources[&LimitKey::Memory], LimitSource::Operator);
    }
}
