//! The registry lists every handler of the binary once, with its location
//! and settings.

use std::time::Duration;

use inbox_runtime::registry::{self, Flavor};
use inbox_runtime::{HandlerName, MaxAttempts, RetentionPolicy};

use crate::handlers::LISTED_LINE;

#[test]
fn every_handler_is_listed_once_sorted_by_scope() {
    let handlers = registry::handlers();
    let scopes: Vec<&str> = handlers.iter().map(|handler| handler.scope()).collect();
    let mut expected = vec![
        "registry.listed",
        "registry.method",
        "registry.shared",
        "registry.shared",
        "registry.versions",
        "registry.versions",
        "registry::handlers::defaulted",
    ];
    if cfg!(feature = "async") {
        expected.insert(0, "registry.async");
    }
    assert_eq!(
        scopes, expected,
        "generic handlers are registered once, not per instance"
    );
}

#[test]
fn a_handler_has_its_location_and_settings() {
    let listed = registry::find("registry.listed").next().expect("listed");
    assert_eq!(listed.function(), "registry::handlers::listed");
    assert_eq!(listed.module_path(), "registry::handlers");
    assert_eq!(listed.name(), "listed");
    assert!(
        listed.file().ends_with("tests/registry/handlers.rs"),
        "{}",
        listed.file()
    );
    assert_eq!(listed.line(), LISTED_LINE);
    assert_eq!(listed.column(), 1);
    assert_eq!(listed.max_attempts(), Some(MaxAttempts::limit(5)));
    assert!(listed.fingerprint() && !listed.store_result() && !listed.shared_scope());
    assert_eq!(listed.flavor(), Flavor::Sync);

    let defaulted = registry::find("registry::handlers::defaulted")
        .next()
        .expect("defaulted");
    assert_eq!(defaulted.max_attempts(), Some(MaxAttempts::Unbounded));

    let method = registry::find("registry.method")
        .next()
        .expect("the method");
    assert_eq!(method.name(), "post");
    assert!(method.store_result());

    #[cfg(feature = "async")]
    assert_eq!(
        registry::find("registry.async")
            .next()
            .expect("async")
            .flavor(),
        Flavor::Async
    );
}

#[test]
fn describe_joins_the_handlers_with_a_retention_policy() {
    let policy = RetentionPolicy::parse("7d", "1d").unwrap().with_handler(
        HandlerName::new("registry.method").unwrap(),
        Duration::from_secs(30 * 86_400),
    );
    let table = registry::describe(&policy).to_string();
    assert_eq!(table.lines().count(), registry::handlers().len(), "{table}");
    let line = |scope: &str| {
        table
            .lines()
            .find(|line| line.starts_with(&format!("{scope}  ")))
            .unwrap_or_else(|| panic!("{scope} in {table}"))
            .to_owned()
    };
    let listed = line("registry.listed");
    assert!(listed.contains("registry::handlers::listed"), "{listed}");
    assert!(
        listed.contains(&format!("handlers.rs:{LISTED_LINE}:1")),
        "{listed}"
    );
    assert!(
        listed.contains("keep 7d  max_attempts 5  sync  fingerprint"),
        "{listed}"
    );
    let method = line("registry.method");
    assert!(method.contains("keep 30d (own window)"), "{method}");
    assert!(
        method.contains("max_attempts 5 (default)  sync  store_result"),
        "{method}"
    );
}
