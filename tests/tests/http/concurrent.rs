//! N requests with one key at once (a client retrying in parallel, a
//! double submit): exactly one payment, whatever the interleaving.

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use crate::client::Response;
use crate::support::{Service, payment};

const N: usize = 8;

/// `bodies[i]` sent by thread `i` with `key`, all released at once.
fn at_once(service: &Service, key: &str, bodies: &[String]) -> Vec<Response> {
    let barrier = Barrier::new(bodies.len());
    thread::scope(|scope| {
        let threads: Vec<_> = bodies
            .iter()
            .map(|body| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    service.post(Some(key), body)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// What the requests got, printed (`--nocapture` shows it).
fn report(test: &str, responses: &[Response]) {
    let replayed = responses.iter().filter(|r| r.replayed()).count();
    let slowest = responses
        .iter()
        .map(|r| r.elapsed)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{test}: statuses {:?}, {replayed} replayed, slowest {slowest:.2?}",
        statuses(responses)
    );
}

fn statuses(responses: &[Response]) -> Vec<u16> {
    let mut statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    statuses.sort_unstable();
    statuses
}

/// One response made the payment (201, not replayed); returns it.
fn the_one_processed(responses: &[Response]) -> &Response {
    let processed: Vec<_> = responses
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .collect();
    assert_eq!(processed.len(), 1, "{:?}", statuses(responses));
    processed[0]
}

#[test]
fn parallel_retries_of_one_request_make_one_payment_and_identical_responses() {
    const TEST: &str = "parallel_retries_of_one_request_make_one_payment_and_identical_responses";
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_millis(300);
        config.claim_wait = Duration::from_secs(5);
    }) else {
        return;
    };
    let bodies = vec![payment("acc-1", 250); N];
    let responses = at_once(&service, "key-1", &bodies);
    report(TEST, &responses);
    let first = the_one_processed(&responses);
    for response in &responses {
        assert_eq!(response.status, 201, "{:?}", statuses(&responses));
        assert_eq!(response.body, first.body);
    }
    assert_eq!(service.payments("key-1"), 1);
    assert_eq!(service.claims(), 1);
}

#[test]
fn parallel_retries_beyond_the_claim_wait_are_409_and_make_one_payment() {
    const TEST: &str = "parallel_retries_beyond_the_claim_wait_are_409_and_make_one_payment";
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_secs(3);
        config.claim_wait = Duration::from_millis(500);
    }) else {
        return;
    };
    let bodies = vec![payment("acc-1", 250); N];
    let responses = at_once(&service, "key-1", &bodies);
    report(TEST, &responses);
    let first = the_one_processed(&responses);
    for response in &responses {
        match response.status {
            201 => assert_eq!(response.body, first.body),
            409 => assert_eq!(response.problem(), "/problems/request-in-progress"),
            _ => panic!("201 or 409 only: {:?}", statuses(&responses)),
        }
    }
    assert!(
        responses.iter().any(|r| r.status == 409),
        "the others waited 0.5 s for a request holding 3 s: {:?}",
        statuses(&responses)
    );
    assert_eq!(service.payments("key-1"), 1);
    assert_eq!(service.claims(), 1);
}

#[test]
fn parallel_requests_with_one_key_and_different_bodies_make_one_payment() {
    const TEST: &str = "parallel_requests_with_one_key_and_different_bodies_make_one_payment";
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_millis(300);
        config.claim_wait = Duration::from_secs(5);
    }) else {
        return;
    };
    let bodies: Vec<String> = (1..=N as i64).map(|i| payment("acc-1", i * 100)).collect();
    let responses = at_once(&service, "key-1", &bodies);
    report(TEST, &responses);
    let first = the_one_processed(&responses);
    for response in &responses {
        if !std::ptr::eq(response, first) {
            assert_eq!(response.status, 422, "{:?}", statuses(&responses));
            assert_eq!(response.problem(), "/problems/idempotency-key-reused");
        }
    }
    let amount = first.json()["amount_cents"].as_i64().unwrap();
    assert_eq!(
        service.amounts("key-1"),
        [amount],
        "the winner's payment only"
    );
    assert_eq!(service.claims(), 1);
}

#[test]
fn parallel_requests_with_different_bodies_beyond_the_claim_wait_are_409() {
    const TEST: &str = "parallel_requests_with_different_bodies_beyond_the_claim_wait_are_409";
    let Some(service) = Service::with(|config| {
        config.hold = Duration::from_secs(3);
        config.claim_wait = Duration::from_millis(500);
    }) else {
        return;
    };
    let bodies: Vec<String> = (1..=N as i64).map(|i| payment("acc-1", i * 100)).collect();
    let responses = at_once(&service, "key-1", &bodies);
    report(TEST, &responses);
    let first = the_one_processed(&responses);
    for response in &responses {
        if !std::ptr::eq(response, first) {
            assert!(
                matches!(response.status, 409 | 422),
                "{:?}",
                statuses(&responses)
            );
        }
    }
    assert!(
        responses.iter().any(|r| r.status == 409),
        "{:?}",
        statuses(&responses)
    );
    let amount = first.json()["amount_cents"].as_i64().unwrap();
    assert_eq!(service.amounts("key-1"), [amount]);
    assert_eq!(service.claims(), 1);
}
