//! What the runtime says about the schema it finds (MySQL/MariaDB): an
//! inbox whose claim-token migration has not run.

use diesel::connection::SimpleConnection;
use inbox_tests::TestBackend;
use tracing::Level;

use crate::capture::*;
use crate::handlers::*;

/// Every claim on an inbox without the `claim_token` column is refused and
/// made again without the token, which costs each delivery three round
/// trips: the deliveries go on, and the process says why once, as the
/// `inbox.claim_token_missing` warning, which names the migration. (Once
/// per process: no other test of this suite drops the column.)
pub fn a_missing_claim_token_column_is_reported_once<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    conn.batch_execute("ALTER TABLE inbox_messages DROP COLUMN claim_token")
        .expect("an inbox from before the claim token");
    let (results, seen, _) =
        observed(|| ["m-1", "m-2"].map(|id| apply(&mut conn, &Msg::new(id, Mode::Apply))));
    for result in results {
        result.expect("processed without the token");
    }
    let warnings = seen.events_named("inbox.claim_token_missing");
    let [warning] = warnings[..] else {
        panic!("one warning for two deliveries: {:#?}", seen.events);
    };
    assert_eq!(warning.level, Level::WARN);
    assert_eq!(warning.target, inbox_runtime::observe::TARGET);
    let message = format!("{:?}", warning.fields);
    assert!(
        message.contains("2026-12-08-000000_claim_token"),
        "{message}"
    );
}

inbox_tests::backend_tests!(only [mysql]: a_missing_claim_token_column_is_reported_once);
