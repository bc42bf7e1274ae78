//! The operator's dead-letter tool: lists the messages the inbox gave up on
//! (a handler rejected them, or they failed `max_attempts` times), revives
//! them so their next delivery is processed, or purges their records.
//!
//! ```text
//! DATABASE_URL=postgres://app@db/app cargo run --example dead_letters --features postgres -- summary
//! DATABASE_URL=/var/lib/app/inbox.sqlite3 cargo run --example dead_letters -- list orders.reserve --limit 20
//! DATABASE_URL=mysql://app@db/app cargo run --example dead_letters --features mysql -- \
//!     revive orders.reserve order-17 order-18
//! DATABASE_URL=... cargo run --example dead_letters -- purge orders.reserve --all
//! ```
//!
//! Commands:
//! - `summary`: every handler with dead messages, how many, since when.
//! - `list <handler> [--after <cursor>] [--limit <n>]`: a page of the
//!   handler's dead messages, oldest first (default 50, at most 1000); the
//!   last line gives the `--after` cursor of the next page.
//! - `revive <handler> (<id>... | --all)`: deletes the claims and failure
//!   records of those dead messages, so the next delivery of each runs the
//!   handler again with a fresh attempt count. Replay them from the broker's
//!   dead-letter queue afterwards: the inbox does not deliver messages.
//! - `purge <handler> (<id>... | --all)`: deletes the failure records and
//!   keeps the claims, so redeliveries stay skipped until retention prunes
//!   them.
//!
//! Each command is one transaction. Exit status: 0 done, 1 database failure,
//! 2 bad arguments or an invalid id.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::connection::LoadConnection;
use diesel::Connection;
use inbox_runtime::dead_letters::{self, Cursor, DeadLetter};
use inbox_runtime::{HandlerName, InboxBackend, InboxError};

const USAGE: &str = "usage: dead_letters summary\n\
       dead_letters list <handler> [--after <cursor>] [--limit <n>]\n\
       dead_letters revive <handler> (<id>... | --all)\n\
       dead_letters purge <handler> (<id>... | --all)\n\
reads the database URL from DATABASE_URL";

/// A parsed command line.
enum Command {
    Summary,
    List {
        handler: HandlerName,
        after: Option<Cursor>,
        limit: u32,
    },
    Revive {
        handler: HandlerName,
        ids: Selection,
    },
    Purge {
        handler: HandlerName,
        ids: Selection,
    },
}

/// The dead messages a revive or purge covers.
enum Selection {
    All,
    Ids(Vec<String>),
}

/// Why the tool failed, and its exit status.
enum Failure {
    Usage(String),
    Database(String),
}

fn main() -> ExitCode {
    let outcome = parse(std::env::args().skip(1)).and_then(|command| {
        let url = std::env::var("DATABASE_URL")
            .map_err(|_| Failure::Usage("DATABASE_URL is not set".to_owned()))?;
        connect_and_run(&url, &command)
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("dead_letters: {message}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Database(message)) => {
            eprintln!("dead_letters: {message}");
            ExitCode::from(1)
        }
    }
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Command, Failure> {
    let usage = |message: &str| Failure::Usage(message.to_owned());
    let command = args.next().ok_or_else(|| usage("no command"))?;
    if command == "summary" {
        return match args.next() {
            None => Ok(Command::Summary),
            Some(extra) => Err(Failure::Usage(format!("unexpected argument `{extra}`"))),
        };
    }
    let handler = args
        .next()
        .ok_or_else(|| usage("missing the handler name"))
        .and_then(|name| HandlerName::new(name).map_err(invalid))?;
    match command.as_str() {
        "list" => {
            let (mut after, mut limit) = (None, 50);
            while let Some(flag) = args.next() {
                let value = args
                    .next()
                    .ok_or_else(|| Failure::Usage(format!("`{flag}` needs a value")))?;
                match flag.as_str() {
                    "--after" => {
                        after =
                            Some(value.parse().map_err(|error| {
                                Failure::Usage(format!("--after {value}: {error}"))
                            })?)
                    }
                    "--limit" => {
                        limit = value
                            .parse()
                            .map_err(|_| Failure::Usage(format!("--limit {value}: not a number")))?
                    }
                    other => return Err(Failure::Usage(format!("unknown option `{other}`"))),
                }
            }
            Ok(Command::List {
                handler,
                after,
                limit,
            })
        }
        "revive" | "purge" => {
            let rest: Vec<String> = args.collect();
            let ids = match rest.as_slice() {
                [] => return Err(usage("name the message ids, or --all")),
                [all] if all == "--all" => Selection::All,
                ids if ids.iter().any(|id| id == "--all") => {
                    return Err(usage("--all cannot be combined with ids"))
                }
                ids => Selection::Ids(ids.to_vec()),
            };
            Ok(if command == "revive" {
                Command::Revive { handler, ids }
            } else {
                Command::Purge { handler, ids }
            })
        }
        other => Err(Failure::Usage(format!("unknown command `{other}`"))),
    }
}

/// A refused name or id: the operator's input, not the database.
fn invalid(error: InboxError) -> Failure {
    Failure::Usage(error.to_string())
}

/// Runs `command` on any supported connection.
fn run<C>(conn: &mut C, command: &Command) -> Result<(), Failure>
where
    C: LoadConnection<Backend: InboxBackend>,
{
    let database = |error: InboxError| match error {
        InboxError::InvalidMessageId { .. }
        | InboxError::InvalidHandlerName { .. }
        | InboxError::InvalidBatchSize { .. } => invalid(error),
        other => Failure::Database(other.to_string()),
    };
    match command {
        Command::Summary => {
            let handlers = dead_letters::summary(conn).map_err(database)?;
            if handlers.is_empty() {
                println!("no dead messages");
            }
            for handler in handlers {
                println!(
                    "{}\t{} dead\toldest {}",
                    handler.handler,
                    handler.dead,
                    timestamp(handler.oldest_dead_at)
                );
            }
        }
        Command::List {
            handler,
            after,
            limit,
        } => {
            let page =
                dead_letters::list(conn, handler, after.as_ref(), *limit).map_err(database)?;
            for letter in &page.letters {
                print_letter(letter);
            }
            match page.next {
                Some(next) => println!("more: --after {next}"),
                None => println!("{} dead message(s) shown; no more", page.letters.len()),
            }
        }
        Command::Revive { handler, ids } => {
            let revived = match ids {
                Selection::All => dead_letters::revive_all(conn, handler),
                Selection::Ids(ids) => dead_letters::revive(conn, handler, ids),
            }
            .map_err(database)?;
            println!("revived {revived}: their next delivery is processed");
        }
        Command::Purge { handler, ids } => {
            let purged = match ids {
                Selection::All => dead_letters::purge_all(conn, handler),
                Selection::Ids(ids) => dead_letters::purge(conn, handler, ids),
            }
            .map_err(database)?;
            println!("purged {purged}: their redeliveries stay skipped");
        }
    }
    Ok(())
}

fn print_letter(letter: &DeadLetter) {
    let why = if letter.rejected {
        "rejected"
    } else {
        "attempts exhausted"
    };
    println!(
        "{}\t{} attempt(s)\t{why} at {}\t{}",
        letter.message_id,
        letter.attempts,
        timestamp(letter.dead_at),
        letter.last_error.replace('\n', " ")
    );
}

/// Seconds since the Unix epoch, UTC, with milliseconds: no date library.
fn timestamp(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    format!("{}.{:03} (unix)", since.as_secs(), since.subsec_millis())
}

fn connect_and_run(url: &str, command: &Command) -> Result<(), Failure> {
    let connect = |error: diesel::ConnectionError| Failure::Database(format!("connect: {error}"));
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return run(
            &mut diesel::PgConnection::establish(url).map_err(connect)?,
            command,
        );
        #[cfg(not(feature = "postgres"))]
        return Err(Failure::Usage(
            "this build has no PostgreSQL support: run with --features postgres".to_owned(),
        ));
    }
    if url.starts_with("mysql://") {
        #[cfg(feature = "mysql")]
        return run(
            &mut diesel::MysqlConnection::establish(url).map_err(connect)?,
            command,
        );
        #[cfg(not(feature = "mysql"))]
        return Err(Failure::Usage(
            "this build has no MySQL support: run with --features mysql".to_owned(),
        ));
    }
    #[cfg(feature = "sqlite")]
    return run(
        &mut diesel::SqliteConnection::establish(url).map_err(connect)?,
        command,
    );
    #[cfg(not(feature = "sqlite"))]
    {
        let _ = connect;
        Err(Failure::Usage(
            "this build has no SQLite support: use a postgres:// or mysql:// URL".to_owned(),
        ))
    }
}
