//! One request at a time: each after the previous one's response.

use std::net::TcpListener;
use std::time::Duration;

use inbox_examples::http::{Config, HANDLER, PaymentsService, Server};
use inbox_tests::{PgServer, SqlRows};

use crate::client;
use crate::support::{Service, loopback, payment};

#[test]
fn a_new_key_creates_one_payment_and_its_retries_replay_the_response() {
    let Some(service) = Service::start() else {
        return;
    };
    let body = payment("acc-1", 250);
    let first = service.post(Some("key-1"), &body);
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed(), "{first:?}");
    assert_eq!(first.header("content-type"), Some("application/json"));
    let created = first.json();
    assert!(created["id"].as_i64().is_some(), "{created}");
    assert_eq!(created["amount_cents"], 250);
    assert_eq!(created["account"], "acc-1");
    assert_eq!(service.payments("key-1"), 1);
    assert_eq!(service.claims(), 1);

    for _ in 0..2 {
        let retry = service.post(Some("key-1"), &body);
        assert_eq!(retry.status, 201, "{retry:?}");
        assert!(retry.replayed(), "{retry:?}");
        assert_eq!(retry.body, first.body, "the stored body, byte for byte");
        assert_eq!(retry.header("content-type"), Some("application/json"));
    }
    assert_eq!(service.payments("key-1"), 1);
    assert_eq!(service.all_payments(), 1);
    assert_eq!(service.claims(), 1);

    // Another key is another payment, with the same body.
    let other = service.post(Some("key-2"), &body);
    assert_eq!(other.status, 201, "{other:?}");
    assert!(!other.replayed());
    assert_ne!(other.json()["id"], created["id"]);
    assert_eq!(service.all_payments(), 2);
    assert_eq!(service.claims(), 2);
}

#[test]
fn a_key_reused_with_another_body_is_422_and_changes_nothing() {
    let Some(service) = Service::start() else {
        return;
    };
    let first = service.post(Some("key-1"), &payment("acc-1", 250));
    assert_eq!(first.status, 201, "{first:?}");

    let other_amount = service.post(Some("key-1"), &payment("acc-1", 999));
    assert_eq!(other_amount.status, 422, "{other_amount:?}");
    assert_eq!(other_amount.problem(), "/problems/idempotency-key-reused");
    assert!(!other_amount.replayed());
    let detail = other_amount.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("different body"), "{detail}");

    // The fingerprint is of the raw bytes: the same JSON spaced otherwise
    // is another payload.
    let spaced = r#"{"account": "acc-1", "amount_cents": 250, "currency": "EUR"}"#;
    let respaced = service.post(Some("key-1"), spaced);
    assert_eq!(respaced.status, 422, "{respaced:?}");
    assert_eq!(respaced.problem(), "/problems/idempotency-key-reused");

    assert_eq!(service.amounts("key-1"), [250], "the first payment only");
    assert_eq!(service.claims(), 1);

    // The original body still gets the stored response.
    let retry = service.post(Some("key-1"), &payment("acc-1", 250));
    assert_eq!((retry.status, retry.replayed()), (201, true), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(service.all_payments(), 1);
}

/// A key whose claim holds no response (claimed by something other than
/// this handler) and a key whose stored response no longer reads (written
/// by another version of the service): the request was made, so the answer
/// is 409 "already used", never a 5xx saying nothing was committed, and
/// nothing runs again.
#[test]
fn a_used_key_without_a_readable_response_is_409_and_runs_nothing() {
    let Some(service) = Service::start() else {
        return;
    };
    let body = payment("acc-1", 250);
    let first = service.post(Some("key-1"), &body);
    assert_eq!(first.status, 201, "{first:?}");
    service.execute(&format!(
        "UPDATE inbox_messages SET result = convert_to('{{\"unexpected\": 1}}', 'UTF8') \
         WHERE handler = '{HANDLER}' AND message_id = 'key-1'"
    ));
    let unreadable = service.post(Some("key-1"), &body);
    assert_eq!(unreadable.status, 409, "{unreadable:?}");
    assert_eq!(unreadable.problem(), "/problems/idempotency-key-used");
    let detail = unreadable.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("can no longer be read"), "{detail}");

    service.execute(&format!(
        "UPDATE inbox_messages SET result = NULL \
         WHERE handler = '{HANDLER}' AND message_id = 'key-1'"
    ));
    let without = service.post(Some("key-1"), &body);
    assert_eq!(without.status, 409, "{without:?}");
    assert_eq!(without.problem(), "/problems/idempotency-key-used");
    assert_eq!(service.payments("key-1"), 1, "nothing ran again");
    assert_eq!(service.claims(), 1);
}

#[test]
fn a_request_without_a_key_is_400_and_creates_nothing() {
    let Some(service) = Service::start() else {
        return;
    };
    let body = payment("acc-1", 250);
    for body in [body.as_str(), body.as_str(), &payment("acc-2", 7), "{"] {
        let response = service.post(None, body);
        assert_eq!(response.status, 400, "{response:?}");
        assert_eq!(response.problem(), "/problems/idempotency-key-missing");
        let detail = response.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("Idempotency-Key"), "{detail}");
    }
    assert_eq!(service.all_payments(), 0);
    assert_eq!(service.claims(), 0);
}

/// A request's headers, values as raw bytes.
type Headers<'a> = Vec<(&'a str, &'a [u8])>;

#[test]
fn invalid_keys_are_400_and_claim_nothing() {
    let Some(service) = Service::start() else {
        return;
    };
    let body = payment("acc-1", 250);
    let too_long = "k".repeat(256);
    let cases: [(&str, Headers); 6] = [
        ("256 bytes", vec![("Idempotency-Key", too_long.as_bytes())]),
        ("empty", vec![("Idempotency-Key", b"")]),
        ("empty string", vec![("Idempotency-Key", b"\"\"")]),
        ("not ASCII", vec![("Idempotency-Key", b"caf\xc3\xa9")]),
        ("unclosed string", vec![("Idempotency-Key", b"\"abc")]),
        (
            "repeated",
            vec![("Idempotency-Key", b"a"), ("Idempotency-Key", b"b")],
        ),
    ];
    for (case, headers) in cases {
        let response = service.post_raw(&headers, &body);
        assert_eq!(response.status, 400, "{case}: {response:?}");
        assert_eq!(
            response.problem(),
            "/problems/idempotency-key-invalid",
            "{case}"
        );
    }
    let detail = service.post(Some(&too_long), &body).json()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(detail.contains("255 bytes"), "{detail}");
    assert_eq!(service.all_payments(), 0);
    assert_eq!(service.claims(), 0);

    // 255 bytes is the longest key stored.
    let longest = "k".repeat(255);
    let response = service.post(Some(&longest), &body);
    assert_eq!(response.status, 201, "{response:?}");
    assert_eq!(service.payments(&longest), 1);

    // A Structured Field String and the bare value are the same key.
    let quoted = service.post_raw(&[("Idempotency-Key", b"\"key-q\"")], &body);
    assert_eq!(
        (quoted.status, quoted.replayed()),
        (201, false),
        "{quoted:?}"
    );
    let bare = service.post(Some("key-q"), &body);
    assert_eq!((bare.status, bare.replayed()), (201, true), "{bare:?}");
    assert_eq!(bare.body, quoted.body);
    assert_eq!(service.payments("key-q"), 1);
    assert_eq!(service.all_payments(), 2);
    assert_eq!(service.claims(), 2);
}

#[test]
fn a_refused_body_claims_nothing_so_the_corrected_request_reuses_the_key() {
    let Some(service) = Service::start() else {
        return;
    };
    let cases = [
        ("{", 400, "/problems/malformed-request"),
        (
            r#"{"account":"acc-1","amount_cents":"250","currency":"EUR"}"#,
            400,
            "/problems/malformed-request",
        ),
        (
            r#"{"account":"acc-1","amount_cents":250}"#,
            400,
            "/problems/malformed-request",
        ),
        (
            r#"{"account":"acc-1","amount_cents":250,"currency":"EUR","tip":1}"#,
            400,
            "/problems/malformed-request",
        ),
        (
            r#"{"account":"acc-1","amount_cents":-250,"currency":"EUR"}"#,
            422,
            "/problems/invalid-payment",
        ),
        (
            r#"{"account":"acc-1","amount_cents":0,"currency":"EUR"}"#,
            422,
            "/problems/invalid-payment",
        ),
        (
            r#"{"account":"acc-1","amount_cents":250,"currency":"euro"}"#,
            422,
            "/problems/invalid-payment",
        ),
        (
            r#"{"account":"","amount_cents":250,"currency":"EUR"}"#,
            422,
            "/problems/invalid-payment",
        ),
    ];
    for (body, status, problem) in cases {
        for _ in 0..2 {
            let response = service.post(Some("key-1"), body);
            assert_eq!(response.status, status, "{body}: {response:?}");
            assert_eq!(response.problem(), problem, "{body}");
        }
    }
    assert_eq!(service.all_payments(), 0);
    assert_eq!(service.claims(), 0, "a refused body is not stored");

    let corrected = service.post(Some("key-1"), &payment("acc-1", 250));
    assert_eq!(
        (corrected.status, corrected.replayed()),
        (201, false),
        "{corrected:?}"
    );
    assert_eq!(service.payments("key-1"), 1);
    assert_eq!(service.claims(), 1);
    // Once the key is claimed, an invalid body is still refused as
    // invalid: validation comes before the claim.
    let invalid = service.post(Some("key-1"), "{");
    assert_eq!(invalid.status, 400, "{invalid:?}");
    assert_eq!(service.all_payments(), 1);
}

#[test]
fn an_unreachable_database_is_503_and_a_bad_key_still_400() {
    // No PostgreSQL needed: a port nothing listens on.
    let port = TcpListener::bind(loopback())
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut config = Config::new(format!("postgres://postgres@127.0.0.1:{port}/test"));
    config.pool_timeout = Duration::from_millis(300);
    let service = PaymentsService::new(&config).expect("a service starts without its database");
    let server = Server::spawn(service, loopback()).expect("the server");
    let body = payment("acc-1", 250);
    for _ in 0..2 {
        let response = client::post(
            server.addr(),
            "/payments",
            &[("Idempotency-Key", b"key-1")],
            body.as_bytes(),
        );
        assert_eq!(response.status, 503, "{response:?}");
        assert_eq!(response.problem(), "/problems/database-unavailable");
        assert_eq!(response.header("retry-after"), Some("1"));
    }
    let missing = client::post(server.addr(), "/payments", &[], body.as_bytes());
    assert_eq!(missing.status, 400, "{missing:?}");
}

#[test]
fn connections_the_server_ended_are_replaced() {
    let Some(service) = Service::start() else {
        return;
    };
    let first = service.post(Some("key-1"), &payment("acc-1", 250));
    assert_eq!(first.status, 201, "{first:?}");
    service.terminate_connections();
    let retry = service.post(Some("key-1"), &payment("acc-1", 250));
    assert_eq!((retry.status, retry.replayed()), (201, true), "{retry:?}");
    let next = service.post(Some("key-2"), &payment("acc-1", 250));
    assert_eq!((next.status, next.replayed()), (201, false), "{next:?}");
    assert_eq!(service.all_payments(), 2);
}

#[test]
fn a_database_that_goes_away_is_503_until_it_is_back() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let mut config = Config::new(server.url());
    config.schema = Some("http_payments_test".to_owned());
    config.pool_timeout = Duration::from_millis(500);
    let service = PaymentsService::new(&config).expect("the service");
    service.setup().expect("the tables");
    let pool = service.pool().clone();
    let http = Server::spawn(service, loopback()).expect("the server");
    let post = |key: &[u8], body: &str| {
        client::post(
            http.addr(),
            "/payments",
            &[("Idempotency-Key", key)],
            body.as_bytes(),
        )
    };
    let body = payment("acc-1", 250);
    let first = post(b"key-1", &body);
    assert_eq!(first.status, 201, "{first:?}");

    server.stop_immediate();
    for key in [&b"key-1"[..], b"key-2"] {
        let response = post(key, &body);
        assert_eq!(response.status, 503, "{response:?}");
        assert_eq!(response.problem(), "/problems/database-unavailable");
        assert_eq!(response.header("retry-after"), Some("1"));
    }

    server.resume();
    let retry = post(b"key-1", &body);
    assert_eq!((retry.status, retry.replayed()), (201, true), "{retry:?}");
    assert_eq!(retry.body, first.body);
    let second = post(b"key-2", &body);
    assert_eq!(
        (second.status, second.replayed()),
        (201, false),
        "{second:?}"
    );
    let mut conn = pool.get().expect("a connection");
    let payments = (*conn).bigint("SELECT count(*) AS value FROM http_payments");
    assert_eq!(payments, 2);
}
