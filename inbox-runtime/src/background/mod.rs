//! What the runtime's background workers share: the pruner
//! ([`BackgroundPruner`](crate::prune::BackgroundPruner)) and the outbox
//! relay ([`BackgroundRelay`](crate::outbox::BackgroundRelay)) each run on a
//! thread of their own over an r2d2 pool (feature `r2d2`) or as a tokio task
//! over a diesel-async pool (feature `tokio`), and hand back the same
//! handles: a [`WorkerThread`] or a [`WorkerTask`], with `run_now`, `stop`
//! and `is_finished`. A task checks its connections out of an
//! [`AsyncPool`] (deadpool's or bb8's, or a pool of your own).
//!
//! ```no_run
//! # #[cfg(all(feature = "postgres", feature = "r2d2"))] {
//! use diesel::r2d2::{ConnectionManager, Pool};
//! use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
//!
//! let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
//! let pruner: inbox_runtime::background::WorkerThread =
//!     BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?)).spawn(pool, |_| {})?;
//! pruner.run_now();
//! pruner.stop().expect("a background worker never panics");
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "tokio")]
mod task;
#[cfg(feature = "r2d2")]
mod thread;

#[cfg(feature = "tokio")]
pub(crate) use task::checkout;
#[cfg(feature = "tokio")]
pub use task::{AsyncPool, WorkerTask};
#[cfg(feature = "r2d2")]
pub use thread::WorkerThread;
