//! `/metrics`: every family the gateway exports, gathered at scrape time
//! into [`Family`]s and written by `prometheus-client` in the OpenMetrics
//! text format (which Prometheus reads): a counter family `x` has samples
//! `x_total`, a histogram `x_bucket`, `x_sum`, `x_count`.
//!
//! The values are read where they already are (the portal's, the LUs'
//! and the ports' own counters) when Prometheus asks, so the families are
//! encoded by one [`Collector`] over a snapshot rather than kept as
//! `prometheus-client` metric objects updated on the data path.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// One sample's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter.
    Counter(u64),
    /// A gauge.
    Gauge(i64),
    /// A histogram: the sum, the count, and each bucket's upper bound with
    /// the observations in it (not cumulative), the last bound `f64::MAX`
    /// (+Inf).
    Histogram {
        /// Sum of the observations.
        sum: f64,
        /// Observations.
        count: u64,
        /// (upper bound, observations in the bucket).
        buckets: Vec<(f64, u64)>,
    },
}

/// A metric family: its name (a counter's without `_total`), help, type
/// and samples with their labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Name.
    pub name: String,
    /// Help text.
    pub help: &'static str,
    /// Samples: labels and value.
    pub samples: Vec<(Vec<(&'static str, String)>, Value)>,
}

impl Family {
    /// A family without samples yet.
    pub fn new(name: impl Into<String>, help: &'static str) -> Family {
        Family {
            name: name.into(),
            help,
            samples: Vec::new(),
        }
    }

    /// Adds a sample. Label values are escaped here (backslash, double
    /// quote, line feed): `prometheus-client` writes them as given.
    pub fn with(mut self, labels: Vec<(&'static str, String)>, value: Value) -> Family {
        let labels = labels.into_iter().map(|(k, v)| (k, escape(&v))).collect();
        self.samples.push((labels, value));
        self
    }
}

/// A label value as the text format needs it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The families of one scrape, each with its type (an empty family keeps
/// its HELP and TYPE lines).
#[derive(Debug)]
struct Scrape(Vec<(Family, MetricType)>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (f, kind) in &self.0 {
            let mut family = encoder.encode_descriptor(&f.name, f.help, None, *kind)?;
            for (labels, value) in &f.samples {
                // Without labels, the sample is written bare (`name 3`,
                // not `name{} 3`).
                if labels.is_empty() {
                    write(&mut family, value)?;
                } else {
                    write(&mut family.encode_family(labels)?, value)?;
                }
            }
        }
        Ok(())
    }
}

fn write(
    m: &mut prometheus_client::encoding::MetricEncoder<'_>,
    value: &Value,
) -> Result<(), std::fmt::Error> {
    match value {
        Value::Counter(v) => m.encode_counter::<NoLabelSet, u64, u64>(v, None),
        Value::Gauge(v) => m.encode_gauge(v),
        Value::Histogram {
            sum,
            count,
            buckets,
        } => m.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
    }
}

/// Encodes `families` (each with its type) in the OpenMetrics text
/// format.
pub fn encode(families: Vec<(Family, MetricType)>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(families)));
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &registry) {
        Ok(()) => out,
        // Writing to a String does not fail; a family the encoder refuses
        // is a bug here, said where the scraper sees it.
        Err(e) => format!("# unifab: encoding the metrics failed: {e}\n# EOF\n"),
    }
}

/// A counter family.
pub fn counter(f: Family) -> (Family, MetricType) {
    (f, MetricType::Counter)
}

/// A gauge family.
pub fn gauge(f: Family) -> (Family, MetricType) {
    (f, MetricType::Gauge)
}

/// A histogram family.
pub fn histogram(f: Family) -> (Family, MetricType) {
    (f, MetricType::Histogram)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_encode_as_openmetrics() {
        let text = encode(vec![
            counter(
                Family::new("unifab_x", "X things.")
                    .with(vec![("lu", "a\"b".into())], Value::Counter(3)),
            ),
            gauge(Family::new("unifab_y", "Y now.").with(vec![], Value::Gauge(-2))),
            histogram(Family::new("unifab_z_seconds", "Z time.").with(
                vec![("lu", "a".into())],
                Value::Histogram {
                    sum: 0.5,
                    count: 3,
                    buckets: vec![(0.1, 1), (1.0, 2), (f64::MAX, 0)],
                },
            )),
            counter(Family::new("unifab_empty", "Nothing yet.")),
        ]);
        for line in [
            "# TYPE unifab_x counter",
            "unifab_x_total{lu=\"a\\\"b\"} 3",
            "# TYPE unifab_y gauge",
            "unifab_y -2",
            "# TYPE unifab_z_seconds histogram",
            "unifab_z_seconds_count{lu=\"a\"} 3",
            "unifab_z_seconds_bucket{le=\"1.0\",lu=\"a\"} 3",
            "unifab_z_seconds_bucket{le=\"+Inf\",lu=\"a\"} 3",
            "# TYPE unifab_empty counter",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }
}
