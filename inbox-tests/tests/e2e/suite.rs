//! `backend_suite!`: one module of tests per backend, from the behaviours
//! written once in the sibling files.

/// `backend_suite!(name, DatabaseType, dialect_module)` expands
/// `mod name { .. }` holding every test against that backend.
macro_rules! backend_suite {
    ($name:ident, $database:ty, $dialect:path) => {
        pub mod $name {
            pub use $dialect as dialect;
            /// This backend's test database.
            pub type Db = $database;

            backend_support!();
            handlers!();

            mod delivery {
                use super::*;
                delivery_tests!();
            }

            mod nesting {
                use super::*;
                nesting_tests!();
            }

            mod failure {
                use super::*;
                failure_tests!();
                ignored_failure_tests!();
            }

            mod ids {
                use super::*;
                id_tests!();
            }

            mod api {
                use super::*;
                api_tests!();
            }

            pub mod concurrency {
                use super::*;
                concurrency_tests!();
            }
        }
    };
}
