//! One handler, one message: first delivery, redelivery, failures, panics,
//! early returns, `?`, two handlers, the default handler name.

macro_rules! delivery_tests {
    () => {
        use std::panic::{catch_unwind, AssertUnwindSafe};

        #[test]
        fn processed_then_duplicate() {
            let Some((db, mut conn)) = fresh() else {
                return;
            };
            let first = Msg::new("order-1");
            apply(&mut conn, &first).expect("first delivery");
            assert_eq!(first.runs.get(), 1, "the body ran on the first delivery");

            let again = Msg::new("order-1");
            apply(&mut conn, &again).expect("redelivery");
            assert_eq!(again.runs.get(), 0, "a duplicate skips the body");

            // A redelivery to another consumer instance (another connection).
            let mut other = db.connect();
            let elsewhere = Msg::new("order-1");
            apply(&mut other, &elsewhere).expect("redelivery elsewhere");
            assert_eq!(elsewhere.runs.get(), 0);

            assert_eq!(
                effects_for(&mut conn, "order-1"),
                1,
                "the effect applied once"
            );
            assert_eq!(
                inbox_rows(&mut other),
                vec![(APPLY.to_owned(), "order-1".to_owned())],
                "exactly one inbox row, with the handler and the id"
            );
            let age = received_age_micros(&mut conn, APPLY, "order-1");
            assert!(
                (-1_000_000..300_000_000).contains(&age),
                "received_at is set by the database clock, just now (age {age} µs)"
            );
            assert_connection_usable(&mut conn);
        }

        #[test]
        fn outcome_handler_returns_processed_then_duplicate() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            let first = Msg::new("abcde");
            assert_eq!(
                valued(&mut conn, &first).expect("first"),
                Outcome::Processed(5)
            );
            let again = Msg::new("abcde");
            assert_eq!(
                valued(&mut conn, &again).expect("again"),
                Outcome::Duplicate
            );
            assert_eq!((first.runs.get(), again.runs.get()), (1, 0));
            assert_eq!(effects_for(&mut conn, "abcde"), 1);
            assert_eq!(inbox_count(&mut conn, "e2e.valued", "abcde"), 1);
        }

        #[test]
        fn error_in_body_rolls_back_claim_and_effects() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            let failing = Msg::with_mode("pay-7", Mode::Fail);
            let err = apply(&mut conn, &failing).expect_err("the body fails");
            assert!(
                matches!(err, AppError::Rejected("the body failed")),
                "{err:?}"
            );
            assert_eq!(failing.runs.get(), 1);
            assert_eq!(inbox_rows(&mut conn), NO_ROWS, "the claim rolled back");
            assert_eq!(effects_for(&mut conn, "pay-7"), 0, "the effect rolled back");
            assert_connection_usable(&mut conn);

            let redelivery = Msg::new("pay-7");
            apply(&mut conn, &redelivery).expect("redelivery");
            assert_eq!(redelivery.runs.get(), 1, "a redelivery processes again");
            let third = Msg::new("pay-7");
            apply(&mut conn, &third).expect("third delivery");
            assert_eq!(third.runs.get(), 0);
            assert_eq!(effects_for(&mut conn, "pay-7"), 1);
            assert_eq!(inbox_count(&mut conn, APPLY, "pay-7"), 1);
        }

        #[test]
        fn panic_in_body_rolls_back_and_leaves_connection_usable() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            let panicking = Msg::with_mode("boom-1", Mode::Panic);
            let payload = catch_unwind(AssertUnwindSafe(|| apply(&mut conn, &panicking)))
                .expect_err("the panic is resumed after the rollback");
            assert_eq!(
                payload.downcast_ref::<DeliberatePanic>(),
                Some(&DeliberatePanic("apply")),
                "the original panic payload comes out"
            );
            assert_eq!(panicking.runs.get(), 1);
            assert_connection_usable(&mut conn);
            assert_eq!(inbox_rows(&mut conn), NO_ROWS);
            assert_eq!(effects_for(&mut conn, "boom-1"), 0);

            // Same with an `Outcome` handler.
            let panicking = Msg::with_mode("boom-1", Mode::Panic);
            let payload = catch_unwind(AssertUnwindSafe(|| valued(&mut conn, &panicking)))
                .expect_err("the panic is resumed");
            assert_eq!(
                payload.downcast_ref::<DeliberatePanic>(),
                Some(&DeliberatePanic("valued"))
            );
            assert_connection_usable(&mut conn);
            assert_eq!(inbox_rows(&mut conn), NO_ROWS);

            let redelivery = Msg::new("boom-1");
            apply(&mut conn, &redelivery).expect("redelivery");
            assert_eq!(redelivery.runs.get(), 1);
            assert_eq!(
                valued(&mut conn, &Msg::new("boom-1")).unwrap(),
                Outcome::Processed(6)
            );
            apply(&mut conn, &Msg::new("boom-1")).expect("duplicate");
            assert_eq!(effects_by(&mut conn, APPLY, "boom-1"), 1);
            assert_eq!(effects_by(&mut conn, "e2e.valued", "boom-1"), 1);
        }

        #[test]
        fn early_return_commits_the_claim() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            let early = Msg::with_mode("early-1", Mode::EarlyReturn);
            apply(&mut conn, &early).expect("early return is a success");
            assert_eq!(early.runs.get(), 1);
            assert_eq!(
                inbox_count(&mut conn, APPLY, "early-1"),
                1,
                "the claim committed"
            );
            assert_eq!(
                effects_for(&mut conn, "early-1"),
                0,
                "no effect was written"
            );

            let redelivery = Msg::new("early-1");
            apply(&mut conn, &redelivery).expect("redelivery");
            assert_eq!(redelivery.runs.get(), 0, "the message counts as processed");
            assert_eq!(effects_for(&mut conn, "early-1"), 0);

            let early = Msg::with_mode("early-2", Mode::EarlyReturn);
            assert_eq!(valued(&mut conn, &early).unwrap(), Outcome::Processed(0));
            assert_eq!(
                valued(&mut conn, &Msg::new("early-2")).unwrap(),
                Outcome::Duplicate
            );
            assert_connection_usable(&mut conn);
        }

        #[test]
        fn question_mark_error_rolls_back() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            // `?` on an application error.
            let rejected = Msg::with_mode("q-1", Mode::RejectWithQuestionMark);
            let err = apply(&mut conn, &rejected).expect_err("the check fails");
            assert!(matches!(err, AppError::Rejected(_)), "{err:?}");
            let err = valued(
                &mut conn,
                &Msg::with_mode("q-1", Mode::RejectWithQuestionMark),
            )
            .expect_err("the check fails");
            assert!(matches!(err, AppError::Rejected(_)), "{err:?}");
            // `?` on a failing statement (on PostgreSQL this aborts the
            // transaction, which must still roll back cleanly).
            let broken = Msg::with_mode("q-2", Mode::DbErrorWithQuestionMark);
            let err = apply(&mut conn, &broken).expect_err("the statement fails");
            assert!(matches!(err, AppError::Db(_)), "{err:?}");
            assert_connection_usable(&mut conn);
            assert_eq!(inbox_rows(&mut conn), NO_ROWS);
            assert_eq!(all_effects(&mut conn), NO_EFFECTS);

            for id in ["q-1", "q-2"] {
                let redelivery = Msg::new(id);
                apply(&mut conn, &redelivery).expect("redelivery");
                assert_eq!(redelivery.runs.get(), 1, "{id} is processed on redelivery");
                assert_eq!(effects_for(&mut conn, id), 1);
            }
            assert_eq!(
                valued(&mut conn, &Msg::new("q-1")).unwrap(),
                Outcome::Processed(3)
            );
        }

        #[test]
        fn two_handlers_each_process_the_same_message_once() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            for _ in 0..3 {
                apply(&mut conn, &Msg::new("evt-1")).expect("apply");
                audit(&mut conn, &Msg::new("evt-1")).expect("audit");
            }
            assert_eq!(effects_by(&mut conn, APPLY, "evt-1"), 1);
            assert_eq!(effects_by(&mut conn, AUDIT, "evt-1"), 1);
            let mut expected = vec![
                (APPLY.to_owned(), "evt-1".to_owned()),
                (AUDIT.to_owned(), "evt-1".to_owned()),
            ];
            expected.sort();
            assert_eq!(inbox_rows(&mut conn), expected);
        }

        #[test]
        fn default_handler_name_is_the_function_path() {
            let Some((_db, mut conn)) = fresh() else {
                return;
            };
            let first = Msg::new("d-1");
            default_named(&mut conn, &first).expect("first");
            default_named(&mut conn, &Msg::new("d-1")).expect("again");
            assert_eq!(first.runs.get(), 1);
            assert!(
                DEFAULT_NAMED.ends_with("::default_named"),
                "{DEFAULT_NAMED}"
            );
            assert_eq!(
                inbox_rows(&mut conn),
                vec![(DEFAULT_NAMED.to_owned(), "d-1".to_owned())]
            );
            assert_eq!(effects_for(&mut conn, "d-1"), 1);
        }
    };
}
