//! Waking the relay when a transaction that recorded messages commits, on
//! PostgreSQL: `LISTEN inbox_outbox` on a connection of the relay's own
//! (the trigger of [`enable_commit_notifications`], which the listener
//! creates when it connects, notifies the channel at commit). Between rounds
//! the relay checks that connection for notifications every
//! [`LISTEN_POLL`]: a read of what the server already sent, no round trip.
//! Every schema's relays share the channel; a notification names the schema
//! whose outbox committed, and a relay wakes for its own schema's only (for
//! every notification if its connection sees no outbox table to name).
//! A listener that cannot connect, or loses its connection, costs nothing
//! but the wake-ups: the relay falls back to its idle wait and the listener
//! connects again, at most once per [`RECONNECT_AFTER`].

use std::future::Future;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::Text;
use diesel::{Connection, PgConnection, RunQueryDsl};

use crate::backend::postgres::OUTBOX_SCHEMA_SQL;
use crate::execution::Waited;
use crate::outbox::enable_commit_notifications;

/// How often an idle relay checks its listening connection.
pub(super) const LISTEN_POLL: Duration = Duration::from_millis(10);

/// The shortest time between two connection attempts of a listener.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// A relay's listening connection, and when it may try to connect again.
pub(super) struct CommitListener {
    url: String,
    conn: Option<Listening>,
    next_connect: Instant,
}

/// A connection listening for commits, and the schema of the outbox it
/// listens for (the payload of that outbox's notifications): `None` when
/// it sees no outbox table, and then every notification wakes it.
pub(super) struct Listening {
    conn: PgConnection,
    schema: Option<String>,
}

impl CommitListener {
    /// A listener to the database at `url`, not connected yet.
    pub(super) fn new(url: String) -> CommitListener {
        CommitListener {
            url,
            conn: None,
            next_connect: Instant::now(),
        }
    }

    /// The URL to connect to, when the listener has no connection and may
    /// try now.
    fn due_connect(&self) -> Option<String> {
        (self.conn.is_none() && Instant::now() >= self.next_connect).then(|| self.url.clone())
    }

    /// Takes the outcome of a connection attempt.
    fn connected(&mut self, conn: Result<Listening, String>) {
        match conn {
            Ok(conn) => self.conn = Some(conn),
            Err(_error) => {
                #[cfg(feature = "log")]
                log::warn!(
                    target: "inbox_runtime::outbox",
                    "the relay cannot listen for commits (it polls meanwhile): {_error}"
                );
                self.next_connect = Instant::now() + RECONNECT_AFTER;
            }
        }
    }

    /// Whether a notification of this listener's schema arrived since the
    /// last call (all of them taken, other schemas' ignored). A connection
    /// that fails is dropped.
    fn heard(&mut self) -> bool {
        let Some(Listening { conn, schema }) = self.conn.as_mut() else {
            return false;
        };
        let mut heard = false;
        let mut lost = false;
        for notification in conn.notifications_iter() {
            match notification {
                Ok(notification) => {
                    heard |= schema
                        .as_ref()
                        .is_none_or(|own| notification.payload == *own);
                }
                Err(_) => {
                    lost = true;
                    break;
                }
            }
        }
        if lost {
            self.conn = None;
            self.next_connect = Instant::now() + RECONNECT_AFTER;
        }
        heard
    }
}

/// A listening connection to `url` (blocking), with the commit
/// notifications enabled ([`enable_commit_notifications`]). A role that
/// may not create the trigger listens all the same (someone else may have
/// created it). A connection that sees no outbox table (a `search_path`
/// the URL does not give, a table not created yet) wakes for every
/// schema's commits.
pub(super) fn connect(url: &str) -> Result<Listening, String> {
    let mut conn = PgConnection::establish(url).map_err(|error| error.to_string())?;
    let schema = diesel::select(diesel::dsl::sql::<Text>(OUTBOX_SCHEMA_SQL))
        .get_result(&mut conn)
        .inspect_err(|_error| {
            #[cfg(feature = "log")]
            log::warn!(
                target: "inbox_runtime::outbox",
                "the relay's listening connection sees no outbox table, so every schema's \
                 commits wake it (give its URL the pool's search_path): {_error}"
            );
        })
        .ok();
    if let Err(_error) = enable_commit_notifications(&mut conn) {
        #[cfg(feature = "log")]
        log::warn!(
            target: "inbox_runtime::outbox",
            "the relay could not enable commit notifications (run \
             outbox::enable_commit_notifications as the table's owner): {_error}"
        );
    }
    conn.batch_execute("LISTEN inbox_outbox")
        .map_err(|error| error.to_string())?;
    Ok(Listening { conn, schema })
}

/// The wait between rounds of a listening relay, for both front ends:
/// `delay` in slices of [`LISTEN_POLL`] (`wait_slice`: the signals' wait),
/// ended early by a notification or a run-now request; `false` on a stop
/// request. `reconnect` connects when the listener has lost its
/// connection.
pub(super) async fn wait_listening<W, WF, R, RF>(
    listener: &mut CommitListener,
    delay: Duration,
    mut wait_slice: W,
    mut reconnect: R,
) -> bool
where
    W: FnMut(Duration) -> WF,
    WF: Future<Output = Waited>,
    R: FnMut(String) -> RF,
    RF: Future<Output = Result<Listening, String>>,
{
    let deadline = Instant::now().checked_add(delay);
    loop {
        if let Some(url) = listener.due_connect() {
            let conn = reconnect(url).await;
            listener.connected(conn);
        }
        if listener.heard() {
            return true;
        }
        let left = deadline.map_or(LISTEN_POLL, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return true;
        }
        match wait_slice(left.min(LISTEN_POLL)).await {
            Waited::Stopped => return false,
            Waited::RunNow => return true,
            Waited::Elapsed => {}
        }
    }
}
