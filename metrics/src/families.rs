//! [`Families`]: the metric families of one scrape, built from plain numbers, rendered in the
//! Prometheus text format by the `prometheus` crate's encoder.

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::Encoder;

/// A sample's labels beyond the node's own (`[("tensor", name)]`, `[("peer", "server 0")]`).
pub type Labels = Vec<(&'static str, String)>;

/// The families of one scrape. Every sample carries the node's labels (`role`, and `rank` or
/// `id`) before its own.
#[derive(Debug, Default)]
pub struct Families {
    node: Vec<(String, String)>,
    out: Vec<MetricFamily>,
}

/// A histogram sample: cumulative bucket counts by upper bound (ascending; `+Inf` is
/// `count`), the number of observations and their sum.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HistogramSample {
    /// `(upper bound, observations at most that)`, ascending.
    pub buckets: Vec<(f64, u64)>,
    /// Observations.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
}

impl Families {
    /// No families yet; every sample will carry `node` labels (e.g. `[("role", "worker"),
    /// ("rank", "0")]`).
    pub fn new(node: &[(&str, String)]) -> Families {
        Families {
            node: node
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            out: Vec::new(),
        }
    }

    fn family(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        metrics: impl IntoIterator<Item = (Labels, Metric)>,
    ) {
        let metrics: Vec<Metric> = metrics
            .into_iter()
            .map(|(labels, mut m)| {
                let pairs = self
                    .node
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .chain(labels.iter().map(|(k, v)| (*k, v.as_str())))
                    .map(|(k, v)| {
                        let mut p = LabelPair::default();
                        p.set_name(k.to_string());
                        p.set_value(v.to_string());
                        p
                    })
                    .collect();
                m.set_label(pairs);
                m
            })
            .collect();
        if metrics.is_empty() {
            return; // the encoder refuses a family without samples
        }
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        f.set_metric(metrics);
        self.out.push(f);
    }

    /// A counter family (name ending in `_total`).
    pub fn counter(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let metrics = samples.into_iter().map(|(l, v)| {
            let mut c = Counter::default();
            c.set_value(v);
            let mut m = Metric::default();
            m.set_counter(c);
            (l, m)
        });
        self.family(name, help, MetricType::COUNTER, metrics);
    }

    /// A gauge family.
    pub fn gauge(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let metrics = samples.into_iter().map(|(l, v)| {
            let mut g = Gauge::default();
            g.set_value(v);
            let mut m = Metric::default();
            m.set_gauge(g);
            (l, m)
        });
        self.family(name, help, MetricType::GAUGE, metrics);
    }

    /// A histogram family (name ending in the unit, e.g. `_seconds`).
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, HistogramSample)>,
    ) {
        let metrics = samples.into_iter().map(|(l, s)| {
            let mut h = Histogram::default();
            h.set_sample_count(s.count);
            h.set_sample_sum(s.sum);
            h.set_bucket(
                s.buckets
                    .iter()
                    .map(|&(bound, n)| {
                        let mut b = Bucket::default();
                        b.set_upper_bound(bound);
                        b.set_cumulative_count(n);
                        b
                    })
                    .collect(),
            );
            let mut m = Metric::default();
            m.set_histogram(h);
            (l, m)
        });
        self.family(name, help, MetricType::HISTOGRAM, metrics);
    }

    /// The families in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = prometheus::TextEncoder::new().encode(&self.out, &mut buf) {
            // Only malformed families fail; say so in the scrape rather than serve nothing.
            return format!("# pushpull: cannot encode the metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The content type of [`Families::render`]'s text.
    pub fn content_type() -> &'static str {
        prometheus::TEXT_FORMAT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_with_node_labels_first() {
        let mut f = Families::new(&[("role", "worker".into()), ("rank", "1".into())]);
        f.counter(
            "pushpull_tensor_rounds_total",
            "Rounds.",
            [(vec![("tensor", "a\"b".to_string())], 3.0)],
        );
        f.gauge("pushpull_empty", "No samples: left out.", []);
        f.histogram(
            "pushpull_round_duration_seconds",
            "Round times.",
            [(
                vec![],
                HistogramSample {
                    buckets: vec![(0.1, 1), (1.0, 2)],
                    count: 3,
                    sum: 4.5,
                },
            )],
        );
        let text = f.render();
        assert!(
            text.contains("# TYPE pushpull_tensor_rounds_total counter"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"pushpull_tensor_rounds_total{role="worker",rank="1",tensor="a\"b"} 3"#
            ),
            "{text}"
        );
        assert!(!text.contains("pushpull_empty"), "{text}");
        assert!(
            text.contains(
                r#"pushpull_round_duration_seconds_bucket{role="worker",rank="1",le="+Inf"} 3"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"pushpull_round_duration_seconds_bucket{role="worker",rank="1",le="0.1"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("pushpull_round_duration_seconds_sum{role=\"worker\",rank=\"1\"} 4.5"),
            "{text}"
        );
    }
}
