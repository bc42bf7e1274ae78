//! The handler registry (`inbox_runtime::registry`) against real databases:
//! PostgreSQL, MariaDB/MySQL and SQLite (see `inbox_tests`).
//!
//! - `listing`: every `#[idempotent]` function of this binary is listed once
//!   (generic, async and methods too), sorted by scope, with its file, line
//!   and settings; `describe` joins them with a retention policy;
//! - `shared`: a scope declared by two handlers without `shared_scope` is
//!   reported by `check`, and a delivery to either handler is refused with
//!   `InboxError::SharedScope` (retryable, nothing claimed, the body not
//!   run) on every backend, while a scope all of whose handlers say
//!   `shared_scope` is accepted;
//! - `pruning`: a pruning run reports the scopes in the inbox that no
//!   handler declares (in its report and as one warning), and not the
//!   registered ones, nor the scopes given to `register_scope`.
//!
//! This binary declares the scope `registry.shared` twice on purpose: the
//! refusal concerns that scope only.
//!
//! Run: `INBOX_REQUIRE_DATABASES=1 cargo test -p inbox-tests --all-features --test registry`

#![allow(missing_docs)]

mod handlers;
mod listing;
mod pruning;
mod shared;
