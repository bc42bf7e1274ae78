//! The compile-fail cases of `#[idempotent]`: `tests/ui/fail/<group>/*.rs`,
//! each with the compiler's message a user sees in the `.stderr` file
//! beside it, checked by trybuild (`tests/ui/main.rs`). The compile-pass
//! cases are binaries of `inbox-tests` (its `ui` suite).
//!
//! After a deliberate change of a message, regenerate them with
//! `TRYBUILD=overwrite cargo test -p inbox-compile-fail` and read the diff.
