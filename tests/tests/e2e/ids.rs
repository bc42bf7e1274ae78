//! Message ids: rejected before any transaction when they cannot be stored,
//! otherwise stored and compared as exact bytes.

use diesel::prelude::*;

use crate::handlers::*;
use crate::support::*;

use inbox_runtime::{
    AckDecision, InboxError, KeyProblem, MAX_MESSAGE_ID_BYTES, Outcome, ack_decision,
};

/// The invalid ids and the problem each must be reported with.
fn invalid_ids() -> Vec<(String, KeyProblem)> {
    vec![
        (String::new(), KeyProblem::Empty),
        (
            "x".repeat(256),
            KeyProblem::TooLong {
                bytes: 256,
                max_bytes: 255,
            },
        ),
        // 128 characters but 256 bytes: the limit is in bytes.
        (
            "é".repeat(128),
            KeyProblem::TooLong {
                bytes: 256,
                max_bytes: 255,
            },
        ),
        (
            "a\0b".to_owned(),
            KeyProblem::ContainsNul { byte_offset: 1 },
        ),
        ("\0".to_owned(), KeyProblem::ContainsNul { byte_offset: 0 }),
    ]
}

fn assert_invalid(error: &InboxError, handler: &str, expected: KeyProblem) {
    match error {
        InboxError::InvalidMessageId {
            handler: reported,
            problem,
            ..
        } => {
            assert_eq!(reported, handler);
            assert_eq!(*problem, expected);
        }
        other => panic!("expected InvalidMessageId({expected:?}), got {other:?}"),
    }
    assert!(!error.is_retryable(), "a malformed id must not be retried");
    assert!(error.is_invalid_message());
}

pub fn invalid_ids_are_rejected_before_anything_runs<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    for (id, problem) in invalid_ids() {
        let msg = Msg::new(id.clone());
        let err = apply(&mut conn, &msg).expect_err("an invalid id is refused");
        assert_invalid(err.inbox().expect("an inbox error"), APPLY, problem);

        let msg_valued = Msg::new(id.clone());
        let err = valued(&mut conn, &msg_valued).expect_err("an invalid id is refused");
        assert_invalid(err.inbox().expect("an inbox error"), "e2e.valued", problem);

        // Not even a transaction was opened: the same holds inside an
        // outer transaction, which stays usable.
        let msg_nested = Msg::new(id.clone());
        conn.transaction(|conn| {
            let err = apply(conn, &msg_nested).expect_err("refused");
            assert_invalid(err.inbox().expect("an inbox error"), APPLY, problem);
            conn.record_effect("outer", "still-usable", 0, "outer")
        })
        .expect("the outer transaction is unaffected");

        assert_eq!(
            (msg.runs.get(), msg_valued.runs.get(), msg_nested.runs.get()),
            (0, 0, 0),
            "the body did not run for {id:?}"
        );
        assert_connection_usable(&mut conn);
    }
    assert_eq!(conn.inbox_rows(), NO_ROWS, "nothing recorded");
    assert_eq!(conn.effects_for("still-usable"), invalid_ids().len() as i64);
    assert_eq!(
        conn.all_effects().len(),
        invalid_ids().len(),
        "no body effect"
    );
}

pub fn longest_ids_are_stored_verbatim<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let ids = [
        "é".repeat(127) + "x",
        "😀".repeat(63) + "abc",
        "日本".repeat(42) + "abc",
        "x".repeat(MAX_MESSAGE_ID_BYTES),
    ];
    for id in &ids {
        assert_eq!(id.len(), MAX_MESSAGE_ID_BYTES, "{id}");
        let first = Msg::new(id.clone());
        apply(&mut conn, &first).expect("a 255-byte id is accepted");
        assert_eq!(first.runs.get(), 1);
        let again = Msg::new(id.clone());
        apply(&mut conn, &again).expect("redelivery");
        assert_eq!(again.runs.get(), 0, "duplicate of a 255-byte id");
        assert_eq!(conn.inbox_count(APPLY, id), 1);
    }
    let mut expected: Vec<(String, String)> = ids
        .iter()
        .map(|id| (APPLY.to_owned(), id.clone()))
        .collect();
    expected.sort();
    assert_eq!(db.connect().inbox_rows(), expected, "stored verbatim");
}

pub fn sql_metacharacters_and_unicode_are_data<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    for id in TRICKY_IDS {
        let first = Msg::new(*id);
        apply(&mut conn, &first).expect("processed");
        assert_eq!(first.runs.get(), 1, "{id:?}");
    }
    for id in TRICKY_IDS {
        let again = Msg::new(*id);
        apply(&mut conn, &again).expect("redelivery");
        assert_eq!(again.runs.get(), 0, "{id:?} is a duplicate");
        assert_eq!(conn.effects_for(id), 1, "{id:?}");
    }
    let mut expected: Vec<(String, String)> = TRICKY_IDS
        .iter()
        .map(|id| (APPLY.to_owned(), (*id).to_owned()))
        .collect();
    expected.sort();
    // Both tables are still there, with exactly these rows.
    assert_eq!(db.connect().inbox_rows(), expected);
    assert_eq!(conn.all_effects().len(), TRICKY_IDS.len());
}

pub fn ids_are_exact_bytes<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    // Case, trailing and leading spaces, Unicode normalization forms.
    let ids = [
        "Abc", "abc", "ABC", "a", "a ", " a", "a  ", "é", "e\u{301}", "ß", "ss",
    ];
    for id in ids {
        let first = Msg::new(id);
        apply(&mut conn, &first).expect("processed");
        assert_eq!(first.runs.get(), 1, "{id:?} is a distinct id");
    }
    for id in ids {
        let again = Msg::new(id);
        apply(&mut conn, &again).expect("redelivery");
        assert_eq!(again.runs.get(), 0, "{id:?} is now a duplicate");
        assert_eq!(conn.inbox_count(APPLY, id), 1, "{id:?}");
        assert_eq!(conn.effects_for(id), 1, "{id:?}");
    }
    let mut expected: Vec<(String, String)> = ids
        .iter()
        .map(|id| (APPLY.to_owned(), (*id).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(conn.inbox_rows(), expected);
}

pub fn integer_and_uuid_ids_are_stored_as_canonical_text<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    numbered(&mut conn, &Numbered { seq: 42 }).expect("processed");
    numbered(&mut conn, &Numbered { seq: 42 }).expect("duplicate");
    numbered(&mut conn, &Numbered { seq: u64::MAX }).expect("processed");
    let uuid = uuid::Uuid::from_u128(0x67E5_5044_10B1_426F_9247_BB68_0E5F_E0C8);
    assert_eq!(
        uuided(&mut conn, &Uuided { uuid }).unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        uuided(&mut conn, &Uuided { uuid }).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(conn.effects_for("42"), 1);
    let mut expected = vec![
        ("e2e.numbered".to_owned(), "42".to_owned()),
        ("e2e.numbered".to_owned(), u64::MAX.to_string()),
        (
            "e2e.uuided".to_owned(),
            "67e55044-10b1-426f-9247-bb680e5fe0c8".to_owned(),
        ),
    ];
    expected.sort();
    assert_eq!(conn.inbox_rows(), expected);
}

pub fn diesel_error_type_handler<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("dt-1");
    assert_eq!(
        diesel_typed(&mut conn, &first).unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        diesel_typed(&mut conn, &Msg::new("dt-1")).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(conn.effects_for("dt-1"), 1);

    // The body's own Diesel error comes out unchanged, after a rollback.
    let failing = Msg::with_mode("dt-2", Mode::Fail);
    let err = diesel_typed(&mut conn, &failing).expect_err("the body fails");
    assert!(matches!(err, diesel::result::Error::NotFound), "{err:?}");
    assert!(InboxError::find_in(&err).is_none());
    assert_eq!(conn.inbox_count("e2e.diesel_typed", "dt-2"), 0);
    assert_eq!(conn.effects_for("dt-2"), 0);
    assert_eq!(
        diesel_typed(&mut conn, &Msg::new("dt-2")).unwrap(),
        Outcome::Processed(())
    );

    // A malformed id travels inside the Diesel error.
    for (id, problem) in invalid_ids() {
        let msg = Msg::new(id);
        let err = diesel_typed(&mut conn, &msg).expect_err("refused");
        let inbox = InboxError::find_in(&err).expect("the inbox error is recoverable");
        assert_invalid(inbox, "e2e.diesel_typed", problem);
        assert_eq!(msg.runs.get(), 0);
    }
    assert_connection_usable(&mut conn);
    assert_eq!(conn.inbox_rows().len(), 2);
}

/// A message without an id (`None`) is a typed, final error: the body does
/// not run, nothing is written, and the broker is told to dead-letter it.
pub fn a_missing_id_is_refused_before_anything_runs<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Optional::new(None, None);
    let result = optional(&mut conn, &msg);
    let err = result.as_ref().expect_err("a missing id is refused");
    assert_invalid(
        err.inbox().expect("an inbox error"),
        "e2e.optional",
        KeyProblem::Missing,
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(
        err.to_string(),
        "invalid message id for handler `e2e.optional`: the message carries no id, so \
         it cannot be deduplicated; redelivering it will not help"
    );
    assert_eq!(msg.runs.get(), 0, "the body did not run");
    assert_eq!(conn.inbox_rows(), NO_ROWS, "nothing recorded");
    assert!(conn.all_effects().is_empty(), "no body effect");
    assert_connection_usable(&mut conn);

    // `Some` is the id it holds: processed once, then a duplicate.
    let first = Optional::new(Some("opt-1"), None);
    optional(&mut conn, &first).expect("processed");
    let again = Optional::new(Some("opt-1"), None);
    optional(&mut conn, &again).expect("duplicate");
    assert_eq!((first.runs.get(), again.runs.get()), (1, 0));
    assert_eq!(
        conn.inbox_rows(),
        vec![("e2e.optional".to_owned(), "opt-1".to_owned())]
    );
}

/// An id read from bytes is stored as the UTF-8 text it is; bytes that are
/// not UTF-8 are refused, never converted lossily.
pub fn byte_ids_must_be_utf8<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let invalid = Optional::new(None, Some(b"k-\xff"));
    let result = header(&mut conn, &invalid);
    let err = result.as_ref().expect_err("refused");
    assert_invalid(
        err.inbox().expect("an inbox error"),
        "e2e.header",
        KeyProblem::NotUtf8 { valid_up_to: 2 },
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(invalid.runs.get(), 0, "the body did not run");

    // What a lossy conversion of the bytes above would have produced is a
    // valid id of its own.
    let lossy = Optional::new(None, Some("k-\u{fffd}".as_bytes()));
    header(&mut conn, &lossy).expect("processed");
    assert_eq!(lossy.runs.get(), 1);

    let missing = Optional::new(None, None);
    let err = header(&mut conn, &missing).expect_err("no header");
    assert_invalid(
        err.inbox().expect("an inbox error"),
        "e2e.header",
        KeyProblem::Missing,
    );
    assert_eq!(missing.runs.get(), 0, "the body did not run");
    assert_eq!(
        conn.inbox_rows(),
        vec![("e2e.header".to_owned(), "k-\u{fffd}".to_owned())],
        "only the valid id is recorded"
    );
}

inbox_tests::backend_tests!(
    a_missing_id_is_refused_before_anything_runs,
    byte_ids_must_be_utf8,
    invalid_ids_are_rejected_before_anything_runs,
    longest_ids_are_stored_verbatim,
    sql_metacharacters_and_unicode_are_data,
    ids_are_exact_bytes,
    integer_and_uuid_ids_are_stored_as_canonical_text,
    diesel_error_type_handler,
);

/// SQLite databases whose text encoding is UTF-16 (`PRAGMA encoding` before
/// the first table): ids up to 255 UTF-8 bytes are claimed and deduplicated
/// as in UTF-8 databases. The table's checks once counted bytes in the
/// database's encoding, so 255 ASCII characters (510 UTF-16 bytes) were
/// refused; an inbox created that way is repaired by `setup()` and by the
/// migrations, its ids kept.
#[cfg(feature = "sqlite")]
mod utf16 {
    use diesel::connection::SimpleConnection;
    use diesel::migration::{MigrationConnection, MigrationSource};
    use diesel::prelude::*;
    use diesel_migrations::MigrationHarness;
    use inbox_runtime::{ClaimKey, HandlerName, InboxError, Outcome, run_idempotent};

    const ENCODINGS: [&str; 2] = ["UTF-16le", "UTF-16be"];

    /// Valid ids of exactly 255 UTF-8 bytes, and how many bytes each takes in
    /// UTF-16.
    fn longest_ids() -> Vec<(String, usize)> {
        vec![
            ("x".repeat(255), 510),
            ("€".repeat(85), 170),
            ("é".repeat(127) + "x", 256),
            ("😀".repeat(63) + "abc", 258),
        ]
    }

    #[derive(QueryableByName)]
    struct Text {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }

    /// An empty in-memory database with text `encoding`.
    fn database(encoding: &str) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(":memory:").unwrap();
        conn.batch_execute(&format!("PRAGMA encoding = '{encoding}'"))
            .unwrap();
        conn
    }

    fn encoding(conn: &mut SqliteConnection) -> String {
        diesel::sql_query("SELECT encoding AS value FROM pragma_encoding")
            .get_result::<Text>(conn)
            .unwrap()
            .value
    }

    fn deliver(
        conn: &mut SqliteConnection,
        handler: &HandlerName,
        id: &str,
    ) -> Result<Outcome<()>, InboxError> {
        run_idempotent(conn, ClaimKey::new(handler.clone(), id)?, |_| {
            Ok::<_, InboxError>(Outcome::Processed(()))
        })
    }

    /// Every longest id (under the longest handler name) is processed once,
    /// then a duplicate.
    fn processed_once(conn: &mut SqliteConnection) {
        let handler = HandlerName::new("h".repeat(255)).unwrap();
        for (id, utf16_bytes) in longest_ids() {
            let result = deliver(conn, &handler, &id);
            assert!(
                matches!(result, Ok(Outcome::Processed(()))),
                "{} × {:?} ({} UTF-8 bytes, {utf16_bytes} in UTF-16): {result:?}",
                id.chars().count(),
                id.chars().next().unwrap(),
                id.len()
            );
            assert_eq!(
                deliver(conn, &handler, &id).unwrap(),
                Outcome::Duplicate,
                "a redelivery"
            );
        }
    }

    #[test]
    fn longest_ids_are_claimed_and_deduplicated() {
        for name in ENCODINGS {
            let mut conn = database(name);
            inbox_runtime::setup(&mut conn).unwrap();
            assert_eq!(encoding(&mut conn), name);
            processed_once(&mut conn);
            // The database still refuses what no valid id can be.
            for (handler, id) in [("h", String::new()), ("h", "x".repeat(511))] {
                let refused = conn.batch_execute(&format!(
                    "INSERT INTO inbox_messages (handler, message_id) VALUES ('{handler}', '{id}')"
                ));
                assert!(refused.is_err(), "{} bytes", id.len());
            }
        }
    }

    /// A claim of 255 ASCII bytes in the first version's UTF-16 inbox.
    fn first_version_refuses(conn: &mut SqliteConnection) {
        let handler = HandlerName::new("h").unwrap();
        assert!(deliver(conn, &handler, "kept").is_ok());
        let refused = deliver(conn, &handler, &"x".repeat(255));
        assert!(refused.is_err(), "{refused:?}");
    }

    fn upgraded(conn: &mut SqliteConnection) {
        let handler = HandlerName::new("h").unwrap();
        assert_eq!(
            deliver(conn, &handler, "kept").unwrap(),
            Outcome::Duplicate,
            "ids claimed before the upgrade are kept"
        );
        processed_once(conn);
    }

    const FIRST_SCHEMA_SQL: &str = include_str!(
        "../../../inbox-runtime/migrations/sqlite/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    #[test]
    fn setup_repairs_an_inbox_of_the_first_version() {
        for name in ENCODINGS {
            let mut conn = database(name);
            conn.batch_execute(FIRST_SCHEMA_SQL).unwrap();
            first_version_refuses(&mut conn);
            inbox_runtime::setup(&mut conn).unwrap();
            upgraded(&mut conn);
            inbox_runtime::setup(&mut conn).unwrap();
            assert_eq!(encoding(&mut conn), name);
        }
    }

    #[test]
    fn migrations_repair_an_inbox_of_the_first_version() {
        for name in ENCODINGS {
            let mut conn = database(name);
            let mut all = MigrationSource::<diesel::sqlite::Sqlite>::migrations(
                &inbox_runtime::migrations::SQLITE,
            )
            .unwrap();
            all.sort_by_key(|migration| migration.name().version().to_string());
            MigrationConnection::setup(&mut conn).unwrap();
            conn.run_migration(&*all[0]).unwrap();
            first_version_refuses(&mut conn);
            assert_eq!(
                inbox_runtime::migrations::run_pending(&mut conn).unwrap(),
                all.len() - 1
            );
            upgraded(&mut conn);
        }
    }
}
