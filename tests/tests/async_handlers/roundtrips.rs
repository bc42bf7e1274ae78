//! The async twin of the blocking suite's round-trip driver
//! (`tests/e2e/roundtrips.rs`): ignored, run on request under strace.

use inbox_runtime::Outcome;
use inbox_tests::TestBackend;

use crate::handlers::{Msg, record};
use crate::support::fresh;

async fn deliveries<B: TestBackend>() {
    let count: usize = std::env::var("INBOX_ROUNDTRIP_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let duplicates = std::env::var("INBOX_ROUNDTRIP_DUPLICATES").is_ok_and(|v| v == "1");
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let messages: Vec<Msg> = (0..count).map(|i| Msg::new(format!("rt-{i}"))).collect();
    for msg in &messages {
        assert_eq!(
            record(&mut conn, msg).await.expect("processed"),
            Outcome::Processed(0)
        );
    }
    if duplicates {
        for msg in &messages {
            assert_eq!(
                record(&mut conn, msg).await.expect("duplicate"),
                Outcome::Duplicate
            );
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
#[ignore = "a driver for strace, see tests/e2e/roundtrips.rs"]
fn postgres() {
    inbox_tests::runtime::current_thread().block_on(deliveries::<inbox_tests::Postgres>());
}

#[cfg(feature = "mysql")]
#[test]
#[ignore = "a driver for strace, see tests/e2e/roundtrips.rs"]
fn mysql() {
    inbox_tests::runtime::current_thread().block_on(deliveries::<inbox_tests::Mysql>());
}
