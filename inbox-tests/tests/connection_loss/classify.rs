//! Each server error that decides between retry, reconnect and never,
//! produced for real on each server, blocking and async: the tables they
//! print show what each driver said and what `recovery()` answered.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
