//! What a test captures while it delivers: every span and event (a small
//! collecting `tracing-subscriber` layer, installed for the calling thread
//! only) and every metric (metrics-util's `DebuggingRecorder`, installed as
//! the thread's local recorder), so tests running in parallel never see
//! each other's.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use metrics::{SharedString, Unit};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A recorded field value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
}

impl Value {
    /// The value as text, for a field recorded with `%` or `?` or as `&str`.
    pub fn text(&self) -> &str {
        match self {
            Value::Str(text) => text,
            other => panic!("not text: {other:?}"),
        }
    }

    /// The value as a float (the `*_ms` fields).
    pub fn float(&self) -> f64 {
        match self {
            Value::F64(value) => *value,
            other => panic!("not a float: {other:?}"),
        }
    }
}

/// `Value::Str`, shorter.
pub fn s(text: &str) -> Value {
    Value::Str(text.to_owned())
}

pub type Fields = BTreeMap<String, Value>;

/// One span, with every field recorded on it by the time it closed.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub name: &'static str,
    pub target: String,
    pub level: Level,
    pub fields: Fields,
    /// The index (in [`Captured::spans`]) of its parent.
    pub parent: Option<usize>,
    pub closed: bool,
}

/// One event.
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub name: &'static str,
    pub target: String,
    pub level: Level,
    pub fields: Fields,
    /// The index (in [`Captured::spans`]) of the span it belongs to.
    pub span: Option<usize>,
}

/// Everything a test's deliveries reported through `tracing`.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub spans: Vec<SpanRecord>,
    pub events: Vec<EventRecord>,
}

impl Captured {
    /// The delivery spans (`inbox.process`), in the order they were opened,
    /// with their indexes.
    pub fn deliveries(&self) -> Vec<(usize, &SpanRecord)> {
        self.spans
            .iter()
            .enumerate()
            .filter(|(_, span)| span.name == inbox_runtime::observe::SPAN_NAME)
            .collect()
    }

    /// The events named `name`.
    pub fn events_named(&self, name: &str) -> Vec<&EventRecord> {
        self.events.iter().filter(|e| e.name == name).collect()
    }

    /// The events the inbox itself emitted (target `inbox_runtime`).
    pub fn inbox_events(&self) -> Vec<&EventRecord> {
        self.events
            .iter()
            .filter(|e| e.target == inbox_runtime::observe::TARGET)
            .collect()
    }
}

#[derive(Default)]
struct Sink(Mutex<Captured>);

/// The index of a span in the capture, kept in the span's extensions.
struct Index(usize);

struct Collect(Arc<Sink>);

impl<S> Layer<S> for Collect
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a new span is registered");
        let parent = span
            .parent()
            .and_then(|parent| parent.extensions().get::<Index>().map(|index| index.0));
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        let mut captured = self.0.0.lock().unwrap();
        captured.spans.push(SpanRecord {
            name: attrs.metadata().name(),
            target: attrs.metadata().target().to_owned(),
            level: *attrs.metadata().level(),
            fields,
            parent,
            closed: false,
        });
        let index = captured.spans.len() - 1;
        drop(captured);
        span.extensions_mut().insert(Index(index));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(index) = index_of(&ctx, id) else {
            return;
        };
        let mut captured = self.0.0.lock().unwrap();
        values.record(&mut Visitor(&mut captured.spans[index].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .and_then(|span| span.extensions().get::<Index>().map(|index| index.0));
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        self.0.0.lock().unwrap().events.push(EventRecord {
            name: event.metadata().name(),
            target: event.metadata().target().to_owned(),
            level: *event.metadata().level(),
            fields,
            span,
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(index) = index_of(&ctx, &id) {
            self.0.0.lock().unwrap().spans[index].closed = true;
        }
    }
}

fn index_of<S>(ctx: &Context<'_, S>, id: &Id) -> Option<usize>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    ctx.span(id)?
        .extensions()
        .get::<Index>()
        .map(|index| index.0)
}

struct Visitor<'f>(&'f mut Fields);

impl Visit for Visitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), Value::F64(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::I64(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::U64(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), s(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::Str(format!("{value:?}")));
    }
}

/// A metric's value in a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    Counter(u64),
    /// The samples recorded.
    Histogram(Vec<f64>),
}

/// Every metric recorded, keyed `name{label=value,…}` (labels sorted by
/// name), with its unit when it was described.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub values: BTreeMap<String, Metric>,
    pub units: BTreeMap<String, Option<Unit>>,
    pub descriptions: BTreeMap<String, Option<SharedString>>,
}

impl Metrics {
    fn of(snapshotter: &Snapshotter) -> Metrics {
        let mut metrics = Metrics::default();
        for (key, unit, description, value) in snapshotter.snapshot().into_vec() {
            let kind = key.kind();
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(count)) => Metric::Counter(count),
                (MetricKind::Histogram, DebugValue::Histogram(samples)) => {
                    Metric::Histogram(samples.into_iter().map(|sample| sample.0).collect())
                }
                other => panic!("the inbox records no such metric: {other:?}"),
            };
            metrics.units.insert(key.name().to_owned(), unit);
            metrics
                .descriptions
                .insert(key.name().to_owned(), description);
            metrics.values.insert(name, value);
        }
        metrics
    }

    /// The counters, by key.
    pub fn counters(&self) -> BTreeMap<&str, u64> {
        self.values
            .iter()
            .filter_map(|(key, value)| match value {
                Metric::Counter(count) => Some((key.as_str(), *count)),
                Metric::Histogram(_) => None,
            })
            .collect()
    }

    /// How many samples each histogram holds, by key.
    pub fn histogram_counts(&self) -> BTreeMap<&str, usize> {
        self.values
            .iter()
            .filter_map(|(key, value)| match value {
                Metric::Histogram(samples) => Some((key.as_str(), samples.len())),
                Metric::Counter(_) => None,
            })
            .collect()
    }

    /// The samples of histogram `key`.
    pub fn samples(&self, key: &str) -> &[f64] {
        match self.values.get(key) {
            Some(Metric::Histogram(samples)) => samples,
            other => panic!("no histogram {key}: {other:?}"),
        }
    }
}

/// Runs `deliver` with the capturing subscriber and a debugging recorder
/// installed for this thread only, and returns what they saw.
pub fn observed<T>(deliver: impl FnOnce() -> T) -> (T, Captured, Metrics) {
    let (recorder, snapshotter) = recorder();
    let (subscriber, sink) = subscriber();
    let value = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, deliver)
    });
    let captured = sink.0.lock().unwrap().clone();
    (value, captured, Metrics::of(&snapshotter))
}

/// The pieces of [`observed`], for an async test: install with
/// [`Observation::install`] inside the test's (current-thread) runtime.
pub struct Observation {
    recorder: DebuggingRecorder,
    snapshotter: Snapshotter,
    sink: Arc<Sink>,
    dispatch: tracing::Dispatch,
}

impl Observation {
    pub fn new() -> Observation {
        let (recorder, snapshotter) = recorder();
        let (subscriber, sink) = subscriber();
        Observation {
            recorder,
            snapshotter,
            sink,
            dispatch: tracing::Dispatch::new(subscriber),
        }
    }

    /// Installs both for the calling thread until the guards drop.
    pub fn install(
        &self,
    ) -> (
        tracing::dispatcher::DefaultGuard,
        metrics::LocalRecorderGuard<'_>,
    ) {
        (
            tracing::dispatcher::set_default(&self.dispatch),
            metrics::set_default_local_recorder(&self.recorder),
        )
    }

    /// What was seen so far.
    pub fn seen(&self) -> (Captured, Metrics) {
        (
            self.sink.0.lock().unwrap().clone(),
            Metrics::of(&self.snapshotter),
        )
    }
}

fn recorder() -> (DebuggingRecorder, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    (recorder, snapshotter)
}

fn subscriber() -> (impl Subscriber + Send + Sync, Arc<Sink>) {
    let sink = Arc::new(Sink::default());
    let subscriber = tracing_subscriber::registry().with(Collect(sink.clone()));
    (subscriber, sink)
}

/// Checks a delivery span field by field: exactly these fields, no other.
/// `claimed`: the claim was decided (so `inbox.claim_wait_ms` is there).
pub fn assert_delivery(
    span: &SpanRecord,
    handler: &str,
    message_id: &str,
    outcome: &str,
    attempt: Option<u64>,
    claimed: bool,
) {
    assert_eq!(span.name, "inbox.process");
    assert_eq!(span.target, "inbox_runtime");
    assert_eq!(span.level, Level::INFO);
    assert!(span.closed, "the span closed when the delivery ended");
    let failure = !matches!(outcome, "processed" | "duplicate");
    let mut expected: BTreeSet<&str> = [
        "messaging.operation.type",
        "messaging.operation.name",
        "messaging.message.id",
        "inbox.handler",
        "inbox.outcome",
        "inbox.duration_ms",
    ]
    .into();
    if claimed {
        expected.insert("inbox.claim_wait_ms");
    }
    if attempt.is_some() {
        expected.insert("inbox.attempt");
    }
    if failure {
        expected.extend(["error.type", "otel.status_code"]);
    }
    let present: BTreeSet<&str> = span.fields.keys().map(String::as_str).collect();
    assert_eq!(present, expected, "the fields of {span:?}");
    let field = |name: &str| &span.fields[name];
    assert_eq!(*field("messaging.operation.type"), s("process"));
    assert_eq!(*field("messaging.operation.name"), s("process"));
    assert_eq!(*field("messaging.message.id"), s(message_id));
    assert_eq!(*field("inbox.handler"), s(handler));
    assert_eq!(*field("inbox.outcome"), s(outcome));
    if let Some(attempt) = attempt {
        assert_eq!(*field("inbox.attempt"), Value::U64(attempt));
    }
    if failure {
        assert_eq!(*field("error.type"), s(outcome));
        assert_eq!(*field("otel.status_code"), s("error"));
    }
    let duration = field("inbox.duration_ms").float();
    assert!(duration > 0.0 && duration < 60_000.0, "{duration} ms");
    if claimed {
        let wait = field("inbox.claim_wait_ms").float();
        assert!(wait > 0.0 && wait <= duration, "{wait} ms of {duration} ms");
    }
}

/// `name{labels}` as `Metrics` keys them.
pub fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

pub fn messages(handler: &str, outcome: &str) -> String {
    key(
        "inbox_messages_total",
        &[("handler", handler), ("outcome", outcome)],
    )
}

pub fn duration(handler: &str, outcome: &str) -> String {
    key(
        "inbox_handler_duration_seconds",
        &[("handler", handler), ("outcome", outcome)],
    )
}

pub fn claim_wait(handler: &str) -> String {
    key("inbox_claim_wait_seconds", &[("handler", handler)])
}

/// Asserts the exact counters and histogram sample counts.
pub fn assert_metrics(
    metrics: &Metrics,
    counters: &[(String, u64)],
    histograms: &[(String, usize)],
) {
    let expected: std::collections::BTreeMap<&str, u64> =
        counters.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(metrics.counters(), expected, "counters");
    let expected: std::collections::BTreeMap<&str, usize> =
        histograms.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(metrics.histogram_counts(), expected, "histograms");
}
