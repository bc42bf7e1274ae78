//! Message ids: rejected before any transaction when they cannot be stored,
//! otherwise stored and compared as exact bytes.

macro_rules! id_tests {
    () => {
        use inbox_runtime::{InboxError, KeyProblem, MAX_MESSAGE_ID_BYTES};

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

        #[test]
        fn invalid_ids_are_rejected_before_anything_runs() {
            let Some((_db, mut conn)) = fresh() else {
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
                    record_effect(conn, "outer", "still-usable", 0, "outer")
                })
                .expect("the outer transaction is unaffected");

                assert_eq!(
                    (msg.runs.get(), msg_valued.runs.get(), msg_nested.runs.get()),
                    (0, 0, 0),
                    "the body did not run for {id:?}"
                );
                assert_connection_usable(&mut conn);
            }
            assert_eq!(inbox_rows(&mut conn), NO_ROWS, "nothing recorded");
            assert_eq!(
                effects_for(&mut conn, "still-usable"),
                invalid_ids().len() as i64
            );
            assert_eq!(
                all_effects(&mut conn).len(),
                invalid_ids().len(),
                "no body effect"
            );
        }

        #[test]
        fn longest_ids_are_stored_verbatim() {
            let Some((db, mut conn)) = fresh() else {
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
                assert_eq!(inbox_count(&mut conn, APPLY, id), 1);
            }
            let mut expected: Vec<(String, String)> = ids
                .iter()
                .map(|id| (APPLY.to_owned(), id.clone()))
                .collect();
            expected.sort();
            assert_eq!(inbox_rows(&mut db.connect()), expected, "stored verbatim");
        }

        #[test]
        fn sql_metacharacters_and_unicode_are_data() {
            let Some((db, mut conn)) = fresh() else {
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
                assert_eq!(effects_for(&mut conn, id), 1, "{id:?}");
            }
            let mut expected: Vec<(String, String)> = TRICKY_IDS
                .iter()
                .map(|id| (APPLY.to_owned(), (*id).to_owned()))
                .collect();
            expected.sort();
            // Both tables are still there, with exactly these rows.
            assert_eq!(inbox_rows(&mut db.connect()), expected);
            assert_eq!(all_effects(&mut conn).len(), TRICKY_IDS.len());
        }

        #[test]
        fn ids_are_exact_bytes() {
            let Some((_db, mut conn)) = fresh() else {
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
                assert_eq!(inbox_count(&mut conn, APPLY, id), 1, "{id:?}");
                assert_eq!(effects_for(&mut conn, id), 1, "{id:?}");
            }
            let mut expected: Vec<(String, String)> = ids
                .iter()
                .map(|id| (APPLY.to_owned(), (*id).to_owned()))
                .collect();
            expected.sort();
            assert_eq!(inbox_rows(&mut conn), expected);
        }

        #[test]
        fn integer_and_uuid_ids_are_stored_as_canonical_text() {
            let Some((_db, mut conn)) = fresh() else {
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
            assert_eq!(effects_for(&mut conn, "42"), 1);
            let mut expected = vec![
                ("e2e.numbered".to_owned(), "42".to_owned()),
                ("e2e.numbered".to_owned(), u64::MAX.to_string()),
                (
                    "e2e.uuided".to_owned(),
                    "67e55044-10b1-426f-9247-bb680e5fe0c8".to_owned(),
                ),
            ];
            expected.sort();
            assert_eq!(inbox_rows(&mut conn), expected);
        }

        #[test]
        fn diesel_error_type_handler() {
            let Some((_db, mut conn)) = fresh() else {
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
            assert_eq!(effects_for(&mut conn, "dt-1"), 1);

            // The body's own Diesel error comes out unchanged, after a rollback.
            let failing = Msg::with_mode("dt-2", Mode::Fail);
            let err = diesel_typed(&mut conn, &failing).expect_err("the body fails");
            assert!(matches!(err, diesel::result::Error::NotFound), "{err:?}");
            assert!(InboxError::find_in(&err).is_none());
            assert_eq!(inbox_count(&mut conn, "e2e.diesel_typed", "dt-2"), 0);
            assert_eq!(effects_for(&mut conn, "dt-2"), 0);
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
            assert_eq!(inbox_rows(&mut conn).len(), 2);
        }
    };
}
