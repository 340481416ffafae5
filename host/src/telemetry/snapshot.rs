//! The metric families of one moment, as both writers read them: the Prometheus text of
//! `GET /v1/metrics` (`metrics`) and the OTLP export (`otlp_metrics`).
//!
//! Plain data and two builder helpers; it gathers nothing and writes nothing, so the gatherer
//! and the exporter depend on it and not on each other.

/// The upper bounds (seconds) of the call latency histogram's buckets; `+Inf` follows.
pub const LATENCY_BOUNDS_S: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0, 30.0,
];

/// What a family measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (it restarts from zero with the daemon unless its help says otherwise).
    Counter,
    Gauge,
    Histogram,
}

/// A histogram sample: cumulative counts at [`LATENCY_BOUNDS_S`], then the total and the sum.
#[derive(Clone, Debug, PartialEq)]
pub struct Hist {
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Num(f64),
    Hist(Hist),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Vec<(&'static str, String)>,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub samples: Vec<Sample>,
}

/// Every family at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub families: Vec<Family>,
    /// When the daemon started (Unix ms): counters count from here.
    pub started_at_ms: i64,
    /// When the snapshot was taken (Unix ms).
    pub at_ms: i64,
}

impl Snapshot {
    pub(crate) fn family(
        &mut self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
    ) -> &mut Family {
        self.families.push(Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("pushed above")
    }
}

impl Family {
    pub(crate) fn num(&mut self, labels: &[(&'static str, &str)], v: impl Into<f64>) -> &mut Self {
        self.samples.push(Sample {
            labels: labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            value: Value::Num(v.into()),
        });
        self
    }
}
