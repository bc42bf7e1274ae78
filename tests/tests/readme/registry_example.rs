use diesel::prelude::*;
use inbox_runtime::{HandlerName, Prune, RetentionPolicy, idempotent, registry};

#[idempotent(id = id, handler = "shipping.dispatch", max_attempts = 3)]
pub fn dispatch(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    diesel::sql_query("UPDATE stock SET reserved = reserved + 1").execute(conn)?;
    Ok(())
}

// Two versions of one handler, deployed one at a time, share a scope on
// purpose: without `shared_scope` on both, their deliveries are refused.
#[idempotent(id = id, handler = "shipping.cancel", shared_scope)]
pub fn cancel(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    diesel::sql_query("UPDATE stock SET reserved = reserved - 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = id, handler = "shipping.cancel", shared_scope, max_attempts = 5)]
pub fn cancel_v2(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    diesel::sql_query("UPDATE stock SET reserved = MAX(reserved - 1, 0)").execute(conn)?;
    Ok(())
}

pub fn start_up(conn: &mut SqliteConnection) -> Result<(), Box<dyn std::error::Error>> {
    // Two handlers declaring one scope (without `shared_scope`): stop here.
    registry::check()?;

    // Every handler: scope, function, file:line:column, retention, settings.
    let policy = RetentionPolicy::parse("7d", "2d")?.with_handler(
        HandlerName::new("shipping.dispatch")?,
        std::time::Duration::from_secs(30 * 86_400),
    );
    print!("{}", registry::describe(&policy));
    // shipping.cancel  app::cancel  src/app.rs:12:1  keep 7d  max_attempts 5 (default)  sync  shared_scope
    // shipping.cancel  app::cancel_v2  src/app.rs:18:1  keep 7d  max_attempts 5  sync  shared_scope
    // shipping.dispatch  app::dispatch  src/app.rs:4:1  keep 30d (own window)  max_attempts 3  sync

    // A scope claimed through `run_idempotent` with a name made at run time.
    registry::register_scope(&HandlerName::new("shipping.import.tenant-7")?);

    // Scopes in the inbox that no handler declares (a renamed handler's old
    // ids): in the report, and one warning per run (tracing, log).
    let report = Prune::new(policy).run(conn)?;
    for scope in &report.unregistered_scopes {
        eprintln!("ids of `{scope}` are kept, but no handler declares it");
    }
    Ok(())
}
