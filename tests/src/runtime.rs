//! The tokio runtimes [`backend_tests!`](crate::backend_tests) runs async
//! test bodies on: the ones `#[tokio::test]` builds.

/// A current-thread runtime with I/O and timers, as `#[tokio::test]` builds.
///
/// ```
/// let answer = inbox_tests::runtime::current_thread().block_on(async { 42 });
/// assert_eq!(answer, 42);
/// ```
pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime")
}

/// A multi-threaded runtime of `workers` worker threads, as
/// `#[tokio::test(flavor = "multi_thread", worker_threads = N)]` builds.
///
/// ```
/// let runtime = inbox_tests::runtime::multi_thread(2);
/// assert_eq!(runtime.block_on(async { tokio::spawn(async { 1 }).await.unwrap() }), 1);
/// ```
pub fn multi_thread(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("build a tokio runtime")
}
