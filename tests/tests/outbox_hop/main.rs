//! Two services, exactly once hop by hop, on real brokers and PostgreSQL,
//! every part a process the test kills.
//!
//! - **Service A** consumes payments from RabbitMQ: the test publishes them
//!   (with stable ids; every odd one published again in the next wave, a
//!   producer's retry; one in 13 to an account that does not exist), and
//!   two consumer processes (`outbox-hop consumer`) run
//!   `inbox_examples::brokers::ledger::apply_payment` on each (the inbox,
//!   the ledger, and the payment's receipt recorded through the outbox, in
//!   one transaction), then ack, requeue or dead-letter it as
//!   `inbox_runtime::ack_decision` says. The first delivery of every
//!   seventh payment is dropped partway (a consumer shut down
//!   mid-delivery) before it runs again.
//! - Three **relay** processes of A (`outbox-hop relay`) publish the
//!   receipts to NATS JetStream: a throwaway `nats-server -js` the test
//!   starts on a free port with a store of its own.
//! - Two processes of **service B** (`outbox-hop receipts`) record the
//!   receipts, each with its own inbox keyed by the receipt's message id.
//!
//! Meanwhile the test, in a shuffled order, SIGKILLs and restarts A's
//! consumers at random moments, inside the handler's transaction, and
//! between the commit and the ack (the redelivery must be absorbed as a
//! duplicate by another consumer); SIGKILLs relays at random moments and
//! between the broker's confirmation of a batch and its mark; SIGKILLs B's
//! processes; SIGKILLs the JetStream server, lets A apply payments while it
//! is down, and starts it again on the same port and store (the relays back
//! off, then resume); cuts the database sessions of all of A's consumers
//! and relays while a consumer is inside a transaction (its delivery is
//! retried), and those of one of B's processes (`pg_terminate_backend`,
//! found by `application_name`).
//!
//! Proven at the end (`check::check`): every payment A applied has exactly
//! one receipt in A's outbox and exactly one recorded by B, with its
//! account and amount (none lost, none doubled); a payment A did not apply
//! has none anywhere (no ghost); A's ledger holds every good payment once
//! and no rejected one; nothing is pending or dead in the outbox. The
//! stream's duplicate window is short (200 ms), so a relay's re-publish
//! after its lease reaches B, whose inbox absorbs it. The report prints
//! the figures: deliveries and duplicates at A, kills of each kind, broker
//! restarts and the rounds the relays backed off, sessions cut,
//! re-publishes, B's duplicates, the time to drain.
//!
//! The same check must catch the two designs the outbox replaces, so two
//! runs mutate A's consumers (`--mutation`) to publish the receipt to
//! JetStream themselves, and expect the check to report it:
//!
//! - `publish-in-body`, from inside the handler's body: every rejected
//!   payment's receipt is out before the rejection (ghosts), and every
//!   delivery killed inside its transaction has published one its
//!   redelivery publishes again (doubles);
//! - `publish-after-commit`, after the handler returned: every delivery
//!   killed between the commit and the publish loses its receipt (the
//!   redelivery is a duplicate, which publishes nothing).
//!
//! The runs take turns (a lock), so that their processes never share the
//! two CPUs. A suite of its own, so that they never share them with the
//! ledger chaos runs of `tests/brokers/` either (whose timing checks they
//! would disturb). Needs RabbitMQ (`INBOX_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), the `nats-server` binary
//! (`INBOX_TEST_NATS_SERVER`, else `PATH`, `/usr/sbin`: the test starts,
//! kills and restarts an `inbox_test_servers::NatsServer` of its own) and PostgreSQL;
//! a missing broker skips the tests, or fails them with
//! `INBOX_TEST_REQUIRE_BROKERS=1`. `INBOX_CHAOS_SEED=<seed>` (printed)
//! repeats a run's choices, not its timing; `INBOX_CHAOS_TRACE=1` prints
//! every line the processes say.
//!
//! Run: `cargo test -p inbox-tests --features brokers,outbox-brokers --test outbox_hop -- --nocapture`
#![cfg(all(feature = "brokers", feature = "outbox-brokers"))]
#![allow(missing_docs)]

mod chaos;
mod check;
mod fleet;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chaos::{Run, Scenario, Step};

/// Every kind of chaos, shuffled: 22 steps.
const OUTBOX: Scenario = Scenario {
    mutation: None,
    consumers: 2,
    relays: 3,
    receivers: 2,
    wave: 8,
    steps: &[
        Step::ConsumerAtRandom,
        Step::ConsumerAtRandom,
        Step::ConsumerAtRandom,
        Step::ConsumerMidBody,
        Step::ConsumerMidBody,
        Step::ConsumerAfterCommit,
        Step::ConsumerAfterCommit,
        Step::ConsumerAfterCommit,
        Step::RelayAtRandom,
        Step::RelayAtRandom,
        Step::RelayAtRandom,
        Step::RelayHolding,
        Step::RelayHolding,
        Step::RelayHolding,
        Step::ReceiverAtRandom,
        Step::ReceiverAtRandom,
        Step::CutA,
        Step::CutA,
        Step::CutB,
        Step::CutB,
        Step::RestartBroker,
        Step::RestartBroker,
    ],
    shuffle: true,
    limit: Duration::from_secs(150),
};

/// The kills that make publishing from the body go wrong, and rejected
/// payments from the first wave on (payment 6).
const PUBLISH_IN_BODY: Scenario = Scenario {
    mutation: Some("publish-in-body"),
    consumers: 2,
    relays: 0,
    receivers: 2,
    wave: 8,
    steps: &[
        Step::ConsumerMidBody,
        Step::ConsumerAtRandom,
        Step::ConsumerMidBody,
        Step::ReceiverAtRandom,
    ],
    shuffle: false,
    limit: Duration::from_secs(60),
};

/// The kills that make publishing after the commit go wrong.
const PUBLISH_AFTER_COMMIT: Scenario = Scenario {
    mutation: Some("publish-after-commit"),
    consumers: 2,
    relays: 0,
    receivers: 2,
    wave: 8,
    steps: &[
        Step::ConsumerAfterCommit,
        Step::ConsumerAtRandom,
        Step::ConsumerAfterCommit,
        Step::ReceiverAtRandom,
    ],
    shuffle: false,
    limit: Duration::from_secs(60),
};

/// One run at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `found` (a check's list) names payment `id`.
fn names(found: &[String], id: &str) -> bool {
    found
        .iter()
        .any(|entry| entry == id || entry.starts_with(&format!("{id} ")))
}

#[test]
fn a_payment_chain_is_exactly_once_hop_by_hop() {
    let _turn = one_at_a_time();
    let Some(run) = chaos::run(&OUTBOX) else {
        return;
    };
    let Run {
        findings,
        report,
        kills,
        tally,
        killed_after_commit,
        not_absorbed,
        ..
    } = &run;
    assert!(findings.is_clean(), "{report}");
    assert!(
        tally.unexpected_exits.is_empty(),
        "processes exited by themselves: {:?}\n{report}",
        tally.unexpected_exits
    );
    for &step in OUTBOX.steps {
        let planned = OUTBOX.steps.iter().filter(|s| **s == step).count() as u32;
        assert_eq!(
            kills.get(&step).copied().unwrap_or(0),
            planned,
            "{} performed",
            step.name()
        );
    }
    assert!(
        not_absorbed.is_empty(),
        "deliveries killed between commit and ack whose redelivery no other consumer absorbed \
         as a duplicate: {not_absorbed:?} (of {killed_after_commit:?})\n{report}"
    );
    assert!(
        tally.rounds_unavailable > 0,
        "no relay round met JetStream down: the restarts proved nothing\n{report}"
    );
    assert!(
        tally.verdict("duplicate") > 0 && tally.recorded_duplicates > 0,
        "no duplicate absorbed at A or at B\n{report}"
    );
}

#[test]
fn mutation_publish_in_body_is_caught() {
    let _turn = one_at_a_time();
    let Some(run) = chaos::run(&PUBLISH_IN_BODY) else {
        return;
    };
    let findings = &run.findings;
    let report = &run.report;
    assert!(
        !run.rejected.is_empty() && !run.killed_mid_body.is_empty(),
        "the run had no rejected payment or no kill inside a transaction\n{report}"
    );
    for id in &run.rejected {
        assert!(
            names(&findings.ghosts, id),
            "the check did not report the ghost receipt of rejected {id}\n{report}"
        );
    }
    for id in &run.killed_mid_body {
        assert!(
            names(&findings.doubled, id),
            "the check did not report the double receipt of {id}, killed after its body \
             published\n{report}"
        );
    }
    // The mutation, and only it: A's ledger is right, its outbox unused,
    // and nothing lost (a receipt goes out before its payment commits).
    assert!(
        findings.ledger.is_empty() && findings.outbox.is_empty() && findings.lost.is_empty(),
        "{report}"
    );
}

#[test]
fn mutation_publish_after_commit_is_caught() {
    let _turn = one_at_a_time();
    let Some(run) = chaos::run(&PUBLISH_AFTER_COMMIT) else {
        return;
    };
    let findings = &run.findings;
    let report = &run.report;
    assert!(
        !run.killed_after_commit.is_empty(),
        "the run had no kill between commit and publish\n{report}"
    );
    for id in &run.killed_after_commit {
        assert!(
            names(&findings.lost, id),
            "the check did not report the lost receipt of {id}, killed between its commit and \
             its publish\n{report}"
        );
    }
    // The mutation, and only it: A's ledger is right, its outbox unused,
    // and no receipt doubled or ghostly (one publish per applied payment,
    // after its commit).
    assert!(
        findings.ledger.is_empty()
            && findings.outbox.is_empty()
            && findings.doubled.is_empty()
            && findings.ghosts.is_empty(),
        "{report}"
    );
}
