//! The README's first example, as written: it compiles without a warning
//! (this file denies them), and it does what the README says against a real
//! PostgreSQL server. `tests/readme/first_example.rs` is that block of the
//! README, character for character (checked below). Also the guide's blocks
//! that are files of the repository: the registry chapter's example (run
//! here on SQLite) and the HTTP chapter's handler (`examples/http/`).
#![deny(warnings)]

#[cfg(feature = "postgres")]
mod first_example;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod registry_example;

#[test]
fn the_readme_shows_the_example_file_verbatim() {
    let readme = include_str!("../../../README.md");
    assert_eq!(first_rust_block(readme), include_str!("first_example.rs"));
}

/// The first ```` ```rust ```` block of `text`, between its fences.
fn first_rust_block(text: &str) -> &str {
    text.split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a rust block")
}

/// The guide's registry chapter shows `tests/readme/registry_example.rs`,
/// character for character; it runs below, on SQLite.
#[test]
fn the_registry_chapter_shows_its_example_file_verbatim() {
    let chapter = include_str!("../../../docs/src/registry.md");
    assert_eq!(
        first_rust_block(chapter),
        include_str!("registry_example.rs")
    );
}

/// The guide's HTTP chapter shows the handler of `examples/http/payments.rs`
/// as written there, but for its hidden lines (`# use …`), which import the
/// example's types so that the block compiles as a doctest.
#[test]
fn the_http_chapter_shows_the_handler_as_written() {
    let chapter = include_str!("../../../docs/src/http.md");
    let block = first_rust_block(chapter);
    let shown: String = block
        .lines()
        .filter(|line| *line != "#" && !line.starts_with("# "))
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(shown.starts_with("#[idempotent("), "{shown}");
    let source = include_str!("../../../examples/http/payments.rs");
    assert!(
        source.contains(&shown),
        "the HTTP chapter's block is not in examples/http/payments.rs as written:\n{shown}"
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn the_registry_example_runs() {
    use diesel::prelude::*;
    use inbox_runtime::{ClaimKey, HandlerName, registry};

    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    diesel::sql_query("CREATE TABLE stock (reserved BIGINT NOT NULL)")
        .execute(&mut conn)
        .unwrap();
    diesel::sql_query("INSERT INTO stock VALUES (0)")
        .execute(&mut conn)
        .unwrap();
    registry_example::dispatch(&mut conn, "o-1").unwrap();
    registry_example::cancel(&mut conn, "o-1").unwrap();
    registry_example::cancel_v2(&mut conn, "o-1").unwrap(); // a duplicate
    let old = ClaimKey::new(HandlerName::new("shipping.dispatch_v0").unwrap(), "o-0").unwrap();
    inbox_runtime::run_idempotent(&mut conn, old, |_| Ok::<(), diesel::result::Error>(())).unwrap();
    registry_example::start_up(&mut conn).unwrap();

    let policy = inbox_runtime::RetentionPolicy::parse("7d", "2d").unwrap();
    let lines: Vec<String> = registry::describe(&policy)
        .to_string()
        .lines()
        .map(str::to_owned)
        .collect();
    let scopes: Vec<&str> = lines
        .iter()
        .filter_map(|line| line.split("  ").next())
        .collect();
    assert!(
        scopes.ends_with(&["shipping.cancel", "shipping.cancel", "shipping.dispatch"]),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.ends_with("max_attempts 3  sync")),
        "{lines:?}"
    );
}
