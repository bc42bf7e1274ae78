//! The handlers under test, written once with `#[idempotent]` and expanded
//! into every backend module (where `Conn` is that backend's connection).

/// Expands the handlers inside a backend module (after `backend_support!`).
macro_rules! handlers {
    () => {
        use inbox_runtime::{idempotent, Outcome};

        /// The handler name `apply` (and `gated`) claim under.
        pub const APPLY: &str = "e2e.apply";
        /// The second handler of the same messages.
        pub const AUDIT: &str = "e2e.audit";

        /// The workhorse: `()` result, application error type, behaviour
        /// chosen by the message's mode.
        #[idempotent(id = msg.id, handler = "e2e.apply")]
        pub fn apply(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
            msg.ran();
            if msg.mode == Mode::EarlyReturn {
                return Ok(());
            }
            record_effect(conn, APPLY, &msg.id, 0, "apply")?;
            match msg.mode {
                Mode::Fail => Err(AppError::Rejected("the body failed")),
                Mode::Panic => std::panic::panic_any(DeliberatePanic("apply")),
                Mode::RejectWithQuestionMark => {
                    msg.check()?;
                    unreachable!("the check fails in this mode")
                }
                Mode::DbErrorWithQuestionMark => {
                    diesel::sql_query("SELECT no_such_column FROM no_such_table").execute(conn)?;
                    unreachable!("the statement fails")
                }
                Mode::Apply | Mode::EarlyReturn => Ok(()),
            }
        }

        /// Another handler of the same messages: its own deduplication scope.
        #[idempotent(id = msg.id, handler = "e2e.audit")]
        pub fn audit(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
            msg.ran();
            record_effect(conn, AUDIT, &msg.id, 0, "audit")?;
            Ok(())
        }

        /// `Outcome<T>` result; `T` is the id's length in bytes.
        #[idempotent(id = msg.id, handler = "e2e.valued")]
        pub fn valued(conn: &mut Conn, msg: &Msg) -> Result<Outcome<usize>, AppError> {
            msg.ran();
            if msg.mode == Mode::EarlyReturn {
                return Ok(Outcome::Processed(0));
            }
            record_effect(conn, "e2e.valued", &msg.id, 0, "valued")?;
            msg.check()?;
            match msg.mode {
                Mode::Fail => Err(AppError::Rejected("the body failed")),
                Mode::Panic => std::panic::panic_any(DeliberatePanic("valued")),
                _ => Ok(msg.id.len().into()),
            }
        }

        /// No `handler = ...`: the name is the function's path.
        #[idempotent(id = msg.id)]
        pub fn default_named(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
            msg.ran();
            record_effect(conn, "default_named", &msg.id, 0, "default_named")?;
            Ok(())
        }

        /// The handler name `default_named` should get.
        pub const DEFAULT_NAMED: &str = concat!(module_path!(), "::default_named");

        /// Plain Diesel error type.
        #[idempotent(id = msg.id, handler = "e2e.diesel_typed")]
        pub fn diesel_typed(conn: &mut Conn, msg: &Msg) -> QueryResult<Outcome<()>> {
            msg.ran();
            record_effect(conn, "e2e.diesel_typed", &msg.id, 0, "diesel_typed")?;
            match msg.mode {
                Mode::Fail => Err(diesel::result::Error::NotFound),
                _ => Ok(Outcome::Processed(())),
            }
        }

        /// Integer ids.
        #[idempotent(id = msg.seq, handler = "e2e.numbered")]
        pub fn numbered(conn: &mut Conn, msg: &Numbered) -> Result<(), AppError> {
            record_effect(conn, "e2e.numbered", &msg.seq.to_string(), 0, "numbered")?;
            Ok(())
        }

        /// UUID ids.
        #[idempotent(id = msg.uuid, handler = "e2e.uuided")]
        pub fn uuided(conn: &mut Conn, msg: &Uuided) -> Result<Outcome<()>, AppError> {
            record_effect(conn, "e2e.uuided", &msg.uuid.to_string(), 0, "uuided")?;
            Ok(Outcome::Processed(()))
        }

        /// A pooled connection by `&mut`.
        #[idempotent(id = msg.id, handler = "e2e.pooled")]
        pub fn pooled_by_ref(
            conn: &mut PooledConnection<ConnectionManager<Conn>>,
            msg: &Msg,
        ) -> Result<Outcome<()>, AppError> {
            msg.ran();
            record_effect(conn, "e2e.pooled", &msg.id, 0, "by_ref")?;
            Ok(Outcome::Processed(()))
        }

        /// A pooled connection moved in (binding without `mut`).
        #[idempotent(id = msg.id, handler = "e2e.pooled")]
        pub fn pooled_by_value(
            conn: PooledConnection<ConnectionManager<Conn>>,
            msg: &Msg,
        ) -> Result<Outcome<()>, AppError> {
            msg.ran();
            record_effect(conn, "e2e.pooled", &msg.id, 0, "by_value")?;
            Ok(Outcome::Processed(()))
        }

        /// A pooled connection moved in, with a `mut` binding. Inside the
        /// body `conn` is the transaction's `&mut PooledConnection`, so the
        /// body writes `execute(conn)`: the `execute(&mut conn)` an owned
        /// binding would take does not compile under the attribute.
        #[idempotent(id = msg.id, handler = "e2e.pooled")]
        pub fn pooled_by_mut_value(
            mut conn: PooledConnection<ConnectionManager<Conn>>,
            msg: &Msg,
        ) -> Result<Outcome<()>, AppError> {
            msg.ran();
            diesel::insert_into(effects::table)
                .values((
                    effects::handler.eq("e2e.pooled"),
                    effects::message_id.eq(&msg.id),
                    effects::worker.eq(0),
                    effects::note.eq("by_mut_value"),
                ))
                .execute(conn)?;
            Ok(Outcome::Processed(()))
        }

        /// Claims under `APPLY`, tells the test, and waits for its verdict.
        #[idempotent(id = msg.id, handler = "e2e.apply")]
        pub fn gated(conn: &mut Conn, msg: &Gated) -> Result<(), AppError> {
            record_effect(conn, APPLY, &msg.id, 0, "gated")?;
            msg.claimed.send(()).expect("the test listens");
            if msg.outcome.recv().expect("the test decides") {
                Ok(())
            } else {
                Err(AppError::Rejected("the gated delivery was told to fail"))
            }
        }

        /// The handler name `nested_transaction` claims under.
        pub const NESTED: &str = "e2e.nested_transaction";

        /// Opens a Diesel transaction of its own inside the body (a
        /// savepoint of the handler's transaction) and, in `Mode::Panic`,
        /// panics inside it: Diesel's `transaction` has no unwind guard, so
        /// the savepoint is still open when the panic reaches the handler.
        #[idempotent(id = msg.id, handler = "e2e.nested_transaction")]
        pub fn nested_transaction(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
            msg.ran();
            record_effect(conn, NESTED, &msg.id, 0, "before the savepoint")?;
            conn.transaction(|conn| {
                record_effect(conn, NESTED, &msg.id, 0, "inside the savepoint")?;
                if msg.mode == Mode::Panic {
                    std::panic::panic_any(DeliberatePanic("inside a nested transaction"));
                }
                Ok::<_, AppError>(())
            })
        }

        /// The handler name `swallows_a_failure` claims under.
        pub const SWALLOW: &str = "e2e.swallow";

        /// Ignores the error of a failing statement (`let _ = …`) between
        /// two effects, then reports success.
        #[idempotent(id = msg.id, handler = "e2e.swallow")]
        pub fn swallows_a_failure(conn: &mut Conn, msg: &Msg) -> Result<Outcome<()>, AppError> {
            msg.ran();
            record_effect(conn, SWALLOW, &msg.id, 0, "before")?;
            if msg.mode == Mode::DbErrorWithQuestionMark {
                let _ = diesel::sql_query("SELECT no_such_column FROM no_such_table").execute(conn);
            }
            // Ignored too: on PostgreSQL it fails once the transaction is aborted.
            let _ = record_effect(conn, SWALLOW, &msg.id, 0, "after");
            Ok(Outcome::Processed(()))
        }

        /// The race test's handler: one effect row per processed delivery.
        #[idempotent(id = msg.id, handler = "e2e.race")]
        pub fn race(conn: &mut Conn, msg: &RaceDelivery<'_>) -> Result<Outcome<()>, AppError> {
            msg.in_flight
                .store(true, std::sync::atomic::Ordering::SeqCst);
            record_effect(conn, "e2e.race", msg.id, msg.worker, "race")?;
            if msg.fail {
                return Err(AppError::Rejected("deliberate failure in the race"));
            }
            Ok(Outcome::Processed(()))
        }
    };
}
