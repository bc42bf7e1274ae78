//! The guide (`docs/src/`), compiled: one module per chapter whose
//! documentation is the chapter's Markdown, so that `cargo test --doc`
//! compiles every Rust block of the guide, and runs those that are not
//! `no_run` (the blocks on embedded SQLite). A chapter is gated on the
//! features its blocks need; the whole suite (`--all-features`) has them
//! all.
//!
//! [`CHAPTERS`] lists the chapter files from the same invocation that
//! includes them: the `docs` suite fails when a file of `docs/src/` is not
//! in it, so no chapter escapes compilation.

/// Declares one module per chapter, documented with the chapter's file, and
/// [`CHAPTERS`], the list of those files.
macro_rules! chapters {
    ($($(#[$gate:meta])* $module:ident => $file:literal,)*) => {
        /// Every chapter's file name in `docs/src/`, gated or not, in the
        /// order of the guide's `SUMMARY.md`.
        pub const CHAPTERS: &[&str] = &[$($file),*];

        $(
            $(#[$gate])*
            #[doc = include_str!(concat!("../../docs/src/", $file))]
            pub mod $module {}
        )*
    };
}

chapters! {
    introduction => "introduction.md",
    #[cfg(feature = "sqlite")]
    attribute => "attribute.md",
    #[cfg(all(feature = "sqlite", feature = "outbox-brokers"))]
    message_ids => "message-ids.md",
    #[cfg(feature = "sqlite")]
    schema => "schema.md",
    #[cfg(all(feature = "sqlite", feature = "postgres"))]
    testing => "testing.md",
    #[cfg(all(feature = "postgres", feature = "async"))]
    async_handlers => "async-handlers.md",
    #[cfg(all(feature = "postgres", feature = "outbox-brokers"))]
    rabbitmq_blocking_consumer => "rabbitmq-blocking-consumer.md",
    errors => "errors.md",
    poison_messages => "poison-messages.md",
    in_flight => "in-flight.md",
    #[cfg(feature = "sqlite")]
    batches => "batches.md",
    #[cfg(feature = "postgres")]
    database_outages => "database-outages.md",
    #[cfg(feature = "postgres")]
    pgbouncer => "pgbouncer.md",
    #[cfg(all(feature = "sqlite", feature = "serde"))]
    fingerprints => "fingerprints.md",
    #[cfg(feature = "http")]
    http => "http.md",
    #[cfg(all(feature = "sqlite", feature = "serde"))]
    outbox => "outbox.md",
    semantics => "semantics.md",
    #[cfg(feature = "sqlite")]
    retention => "retention.md",
    #[cfg(feature = "sqlite")]
    registry => "registry.md",
    observability => "observability.md",
    real_brokers => "real-brokers.md",
    mistakes => "mistakes.md",
    distributed_sql => "distributed-sql.md",
}
