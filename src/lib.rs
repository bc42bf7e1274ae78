//! Support code for the inbox workspace's examples and end-to-end tests.
//!
//! [`testdb`] hands each test a database of its own on a real server:
//! a fresh PostgreSQL schema, a fresh MariaDB/MySQL database, or a fresh
//! SQLite file, with the inbox table created. Server URLs come from
//! `INBOX_TEST_POSTGRES_URL` and `INBOX_TEST_MYSQL_URL`, defaulting to the
//! local servers (`postgres://postgres@127.0.0.1:5432/test`,
//! `mysql://root@127.0.0.1:3306/test`). When a server cannot be reached the
//! test prints a `skipped:` line and passes, unless
//! `INBOX_REQUIRE_DATABASES=1`, which turns the skip into a failure.

pub mod testdb;
