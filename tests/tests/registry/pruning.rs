//! A pruning run reports the scopes in the inbox that no handler declares.

use std::io::Write;
use std::sync::{Arc, Mutex};

use inbox_runtime::{
    ClaimKey, HandlerName, InboxError, Prune, RetentionPolicy, registry, run_idempotent,
};
use inbox_tests::TestBackend;

inbox_tests::backend_tests!(unregistered_scopes_are_reported, registered_scopes_are_not);

/// Claims `id` under `scope` without the attribute.
fn claim<C>(conn: &mut C, scope: &str, id: &str)
where
    C: diesel::connection::LoadConnection<Backend: inbox_runtime::InboxBackend>,
{
    let key = ClaimKey::new(HandlerName::new(scope.to_owned()).unwrap(), id).unwrap();
    run_idempotent(conn, key, |_| Ok::<(), InboxError>(())).unwrap();
}

/// The message of the `inbox.unregistered_scopes` event.
const UNREGISTERED: &str = "the inbox holds ids of scopes that no handler of this program declares";

fn prune() -> Prune {
    Prune::new(RetentionPolicy::parse("7d", "1d").unwrap())
}

pub fn unregistered_scopes_are_reported<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    claim(&mut conn, "registry.listed", "m-1");
    claim(&mut conn, "registry.renamed_old", "m-1");
    claim(&mut conn, "registry.renamed_old", "m-2");
    claim(&mut conn, "registry.forgotten", "m-1");

    let (report, events) = capture(|| prune().run(&mut conn).unwrap());
    assert_eq!(
        report.unregistered_scopes,
        ["registry.forgotten", "registry.renamed_old"]
    );
    assert!(
        report.to_string().ends_with(
            "; ids of 2 scopes no handler declares: registry.forgotten, registry.renamed_old"
        ),
        "{report}"
    );
    #[cfg(feature = "tracing")]
    {
        let warnings: Vec<&String> = events
            .iter()
            .filter(|line| line.contains(UNREGISTERED))
            .collect();
        assert_eq!(warnings.len(), 1, "one warning per run: {events:?}");
        assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
        assert!(
            warnings[0].contains("registry.forgotten, registry.renamed_old"),
            "{}",
            warnings[0]
        );
    }
    let _ = events;

    let (quiet, events) = capture(|| prune().warn_unregistered(false).run(&mut conn).unwrap());
    assert!(quiet.unregistered_scopes.is_empty(), "{quiet}");
    assert!(
        !events.iter().any(|line| line.contains(UNREGISTERED)),
        "{events:?}"
    );
}

pub fn registered_scopes_are_not<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    claim(&mut conn, "registry.listed", "m-1");
    claim(&mut conn, "registry::handlers::defaulted", "m-1");
    // A scope the program makes at run time, registered.
    registry::register_scope(&HandlerName::new("registry.dynamic.tenant-7").unwrap());
    claim(&mut conn, "registry.dynamic.tenant-7", "m-1");

    let (report, events) = capture(|| prune().run(&mut conn).unwrap());
    assert!(report.unregistered_scopes.is_empty(), "{report}");
    assert!(
        !events.iter().any(|line| line.contains(UNREGISTERED)),
        "{events:?}"
    );
}

/// Runs `f` with a subscriber that keeps the runtime's events (feature
/// `tracing`), one formatted line each.
fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    #[cfg(feature = "tracing")]
    {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let value = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        (value, text.lines().map(str::to_owned).collect())
    }
    #[cfg(not(feature = "tracing"))]
    {
        (f(), Vec::new())
    }
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
