//! Retries while the first request with the key is still in its
//! transaction: the first request's body holds its transaction open
//! (`Config::hold`), so its claim's row stays locked, and the retry's
//! claim waits on that lock for at most `Config::claim_wait`.

use std::thread;
use std::time::Duration;

use crate::support::{Service, payment};

#[test]
fn a_retry_waits_for_the_request_in_flight_and_gets_its_response() {
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_secs(1);
        config.claim_wait = Duration::from_secs(5);
    }) else {
        return;
    };
    let body = payment("acc-1", 250);
    thread::scope(|scope| {
        let first = scope.spawn(|| service.post(Some("key-1"), &body));
        service.wait_in_flight(1);
        assert_eq!(service.all_payments(), 0, "not committed yet");

        let same = scope.spawn(|| service.post(Some("key-1"), &body));
        let other = scope.spawn(|| service.post(Some("key-1"), &payment("acc-1", 999)));
        let missing = service.post(None, &body);
        assert_eq!(missing.status, 400, "{missing:?}");
        assert!(
            !first.is_finished(),
            "no key: answered at once, not after the first"
        );

        let first = first.join().unwrap();
        let same = same.join().unwrap();
        let other = other.join().unwrap();
        assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
        assert_eq!((same.status, same.replayed()), (201, true), "{same:?}");
        assert_eq!(same.body, first.body);
        assert!(
            same.elapsed > Duration::from_millis(100) && same.elapsed < Duration::from_secs(5),
            "the retry waited for the first request, within the claim wait: {same:?}"
        );
        assert_eq!(other.status, 422, "{other:?}");
        assert_eq!(other.problem(), "/problems/idempotency-key-reused");
        eprintln!(
            "in flight, finishing within the wait: first {} in {:.2?}; same body {} replayed in \
             {:.2?}; other body {} in {:.2?}",
            first.status, first.elapsed, same.status, same.elapsed, other.status, other.elapsed
        );
    });
    assert_eq!(service.amounts("key-1"), [250]);
    assert_eq!(service.all_payments(), 1);
    assert_eq!(service.claims(), 1);
}

#[test]
fn a_retry_still_waiting_after_the_claim_wait_is_409_and_then_replays() {
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_secs(4);
        config.claim_wait = Duration::from_secs(1);
    }) else {
        return;
    };
    let body = payment("acc-1", 250);
    thread::scope(|scope| {
        let first = scope.spawn(|| service.post(Some("key-1"), &body));
        service.wait_in_flight(1);

        let same = scope.spawn(|| service.post(Some("key-1"), &body));
        let other = service.post(Some("key-1"), &payment("acc-1", 999));
        let same = same.join().unwrap();
        for retry in [&same, &other] {
            assert_eq!(retry.status, 409, "{retry:?}");
            assert_eq!(retry.problem(), "/problems/request-in-progress");
            assert_eq!(retry.header("retry-after"), Some("1"));
            // The claim's bound (`claim_wait`), and the round trips.
            assert!(
                retry.elapsed >= Duration::from_millis(900)
                    && retry.elapsed < Duration::from_secs(4),
                "waited about the claim wait: {retry:?}"
            );
        }
        eprintln!(
            "in flight beyond the wait: same body {} in {:.2?}, other body {} in {:.2?}",
            same.status, same.elapsed, other.status, other.elapsed
        );
        assert_eq!(service.all_payments(), 0, "the first is still in flight");
        assert_eq!(service.claims(), 0);

        let first = first.join().unwrap();
        assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");

        // Done: the retry gets the stored response, the other body 422.
        let retry = service.post(Some("key-1"), &body);
        assert_eq!((retry.status, retry.replayed()), (201, true), "{retry:?}");
        assert_eq!(retry.body, first.body);
        assert!(
            retry.elapsed < Duration::from_secs(2),
            "no wait once done: {retry:?}"
        );
        let other = service.post(Some("key-1"), &payment("acc-1", 999));
        assert_eq!(other.status, 422, "{other:?}");
    });
    assert_eq!(service.amounts("key-1"), [250]);
    assert_eq!(service.claims(), 1);
}

#[test]
fn a_request_whose_connection_dies_in_flight_is_503_and_commits_nothing() {
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_secs(1);
    }) else {
        return;
    };
    let body = payment("acc-1", 250);
    let first = thread::scope(|scope| {
        let first = scope.spawn(|| service.post(Some("key-1"), &body));
        service.wait_in_flight(1);
        service.terminate_connections();
        first.join().unwrap()
    });
    assert_eq!(first.status, 503, "{first:?}");
    assert_eq!(first.problem(), "/problems/database-unavailable");
    assert_eq!(service.all_payments(), 0);
    assert_eq!(
        service.claims(),
        0,
        "the claim rolled back with the payment"
    );

    // The key is free: the retry is processed, not replayed.
    let retry = service.post(Some("key-1"), &body);
    assert_eq!((retry.status, retry.replayed()), (201, false), "{retry:?}");
    assert_eq!(service.payments("key-1"), 1);
    assert_eq!(service.claims(), 1);
}
