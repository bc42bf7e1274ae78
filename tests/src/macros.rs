//! [`backend_tests!`](crate::backend_tests): one `#[test]` per backend for
//! each generic test function.

/// Instantiates generic test functions once per backend.
///
/// Each named function is an ordinary `fn name<B: TestBackend>()` (or
/// `async fn`) beside the invocation; the macro expands, per backend whose
/// feature is on, a module named after the backend holding one `#[test]`
/// per function, so test names read `suite::postgres::name`.
///
/// - `backend_tests!(a, b);` — every backend (PostgreSQL, MariaDB/MySQL,
///   SQLite);
/// - `backend_tests!(only [postgres, mysql]: a, b);` — the listed ones;
/// - `backend_tests!(async a, b);` and `backend_tests!(async only [postgres,
///   mysql]: a, b);` — `async fn` bodies, each run to completion on a
///   current-thread tokio runtime built for the test (as `#[tokio::test]`
///   does); `async(multi_thread = 4) …` runs them on a multi-threaded
///   runtime of 4 workers instead (needs the `async` feature);
/// - `backend_tests! { a, b; only [postgres, mysql]: c; async only [mysql]:
///   d; }` — several of the above in one module, each ending in `;`: one
///   module per backend holds every group's tests for it.
///
/// A backend is one arm of `@backend` below plus its file in `src/backend/`.
///
/// ```
/// use inbox_tests::TestBackend;
///
/// fn opens<B: TestBackend>() {
///     let Some(db) = B::open() else { return };
///     let _conn = db.connect();
/// }
///
/// inbox_tests::backend_tests!(only [sqlite]: opens);
/// # fn main() {}
/// ```
///
/// Groups, for a module whose tests do not all run on the same backends:
///
/// ```
/// use inbox_tests::{SqlRows, TestBackend};
///
/// fn starts_empty<B: TestBackend>() {
///     let Some(db) = B::open() else { return };
///     assert_eq!(db.connect().bigint("SELECT COUNT(*) AS value FROM inbox_messages"), 0);
/// }
///
/// fn opens<B: TestBackend>() {
///     let Some(_db) = B::open() else { return };
/// }
///
/// inbox_tests::backend_tests! {
///     starts_empty;
///     only [sqlite]: opens;
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! backend_tests {
    (async $(($($runtime:tt)*))? only [$($backend:ident),+ $(,)?] : $($test:ident),+ $(,)?) => {
        $crate::backend_tests!(@each [$($backend),+] (async [$($($runtime)*)?]) [$($test),+]);
    };
    (async $(($($runtime:tt)*))? $($test:ident),+ $(,)?) => {
        $crate::backend_tests!(@each [postgres, mysql, sqlite] (async [$($($runtime)*)?]) [$($test),+]);
    };
    (only [$($backend:ident),+ $(,)?] : $($test:ident),+ $(,)?) => {
        $crate::backend_tests!(@each [$($backend),+] (sync) [$($test),+]);
    };
    ($($test:ident),+ $(,)?) => {
        $crate::backend_tests!(@each [postgres, mysql, sqlite] (sync) [$($test),+]);
    };

    (@each [$($backend:ident),+] $kind:tt $tests:tt) => {
        $( $crate::backend_tests!(@backend $backend $kind $tests); )+
    };

    // Groups, each `([backends] kind [tests])`, then one module per backend
    // with the groups that list it.
    (@groups [$($done:tt)*]) => {
        $crate::backend_tests!(@select postgres [] $($done)*);
        $crate::backend_tests!(@select mysql [] $($done)*);
        $crate::backend_tests!(@select sqlite [] $($done)*);
    };
    (@groups [$($done:tt)*] async $(($($runtime:tt)*))? only [$($backend:ident),+ $(,)?] : $($test:ident),+ $(,)? ; $($rest:tt)*) => {
        $crate::backend_tests!(@groups [$($done)* ([$($backend),+] (async [$($($runtime)*)?]) [$($test),+])] $($rest)*);
    };
    (@groups [$($done:tt)*] async $(($($runtime:tt)*))? $($test:ident),+ $(,)? ; $($rest:tt)*) => {
        $crate::backend_tests!(@groups [$($done)* ([postgres, mysql, sqlite] (async [$($($runtime)*)?]) [$($test),+])] $($rest)*);
    };
    (@groups [$($done:tt)*] only [$($backend:ident),+ $(,)?] : $($test:ident),+ $(,)? ; $($rest:tt)*) => {
        $crate::backend_tests!(@groups [$($done)* ([$($backend),+] (sync) [$($test),+])] $($rest)*);
    };
    (@groups [$($done:tt)*] $($test:ident),+ $(,)? ; $($rest:tt)*) => {
        $crate::backend_tests!(@groups [$($done)* ([postgres, mysql, sqlite] (sync) [$($test),+])] $($rest)*);
    };
    (@groups [$($done:tt)*] $($unexpected:tt)+) => {
        compile_error!("backend_tests!: expected groups `[async[(…)]] [only [backends]:] test, …;`");
    };

    (@select $backend:ident []) => {};
    (@select $backend:ident [$($picked:tt)+]) => {
        $crate::backend_tests!(@backend $backend $($picked)+);
    };
    (@select $backend:ident [$($picked:tt)*] ([$($listed:ident),+] $kind:tt $tests:tt) $($rest:tt)*) => {
        $crate::backend_tests!(@if $backend in [$($listed),+]
            { @select $backend [$($picked)* $kind $tests] $($rest)* }
            else { @select $backend [$($picked)*] $($rest)* });
    };

    // Whether a backend is in a list: one arm per backend.
    (@if postgres in [postgres $(, $other:ident)*] {$($then:tt)*} else $else:tt) => {
        $crate::backend_tests!($($then)*);
    };
    (@if mysql in [mysql $(, $other:ident)*] {$($then:tt)*} else $else:tt) => {
        $crate::backend_tests!($($then)*);
    };
    (@if sqlite in [sqlite $(, $other:ident)*] {$($then:tt)*} else $else:tt) => {
        $crate::backend_tests!($($then)*);
    };
    (@if $backend:ident in [$first:ident $(, $other:ident)*] $then:tt else $else:tt) => {
        $crate::backend_tests!(@if $backend in [$($other),*] $then else $else);
    };
    (@if $backend:ident in [] $then:tt else {$($else:tt)*}) => {
        $crate::backend_tests!($($else)*);
    };

    // One arm per backend: its module name, feature and type.
    (@backend postgres $($kind:tt $tests:tt)+) => {
        #[cfg(feature = "postgres")]
        mod postgres {
            $( $crate::backend_tests!(@tests $crate::Postgres, $kind $tests); )+
        }
    };
    (@backend mysql $($kind:tt $tests:tt)+) => {
        #[cfg(feature = "mysql")]
        mod mysql {
            $( $crate::backend_tests!(@tests $crate::Mysql, $kind $tests); )+
        }
    };
    (@backend sqlite $($kind:tt $tests:tt)+) => {
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $( $crate::backend_tests!(@tests $crate::Sqlite, $kind $tests); )+
        }
    };

    (@tests $backend:ty, (sync) [$($test:ident),+]) => {
        $(
            #[test]
            fn $test() {
                super::$test::<$backend>()
            }
        )+
    };
    (@tests $backend:ty, (async $runtime:tt) [$($test:ident),+]) => {
        $(
            #[test]
            fn $test() {
                if <$backend as $crate::TestBackend>::skips_async() {
                    return;
                }
                $crate::backend_tests!(@runtime $runtime).block_on(super::$test::<$backend>())
            }
        )+
    };

    (@runtime []) => {
        $crate::runtime::current_thread()
    };
    (@runtime [multi_thread = $workers:literal]) => {
        $crate::runtime::multi_thread($workers)
    };

    // Several groups: see above.
    ($($group:tt)+) => {
        $crate::backend_tests!(@groups [] $($group)+);
    };
}
