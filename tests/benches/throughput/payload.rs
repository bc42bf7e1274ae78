//! What payload fingerprints and stored results cost (blocking connections):
//!
//! - `fingerprint`: `handler` with `fingerprint = body`, a 1 KiB body
//!   (different per message): the hash, and 32 more bytes in the claim;
//! - `fingerprint-duplicate`: a redelivery of a fingerprinted id: `duplicate`
//!   plus the read of the stored fingerprint and the comparison;
//! - `stored-result`: `fingerprint` plus `store_result` of a receipt of
//!   about 120 bytes of JSON: its encoding and the `UPDATE` of the claim's
//!   row before the commit (feature `serde`);
//! - `stored-duplicate`: a redelivery answered with the stored receipt: the
//!   read and the decoding (feature `serde`).
//!
//! Compare `fingerprint` and `stored-result` with `handler`, the duplicates
//! with `duplicate`, within one run (`INBOX_BENCH_VARIANTS=handler,duplicate,fingerprint,fingerprint-duplicate,stored-result,stored-duplicate`).

use diesel::QueryResult;
use inbox_runtime::{ClaimKey, Fingerprint, HandlerName, Outcome, run_idempotent};

use super::connections::BenchConnection;
use super::{REDELIVERED, Variant, Worker, fresh_ids, key};

/// The size of a message's body.
pub const BODY_BYTES: usize = 1024;

/// A worker's payloads: a body to fingerprint, and ids claimed with a
/// fingerprint (and a stored result) to redeliver.
pub struct Payloads {
    body: Vec<u8>,
    fingerprinted: Vec<u64>,
    #[cfg(feature = "serde")]
    stored: Vec<u64>,
    next: usize,
}

impl Payloads {
    pub fn new() -> Self {
        Payloads {
            body: (0..BODY_BYTES).map(|n| (n % 251) as u8).collect(),
            fingerprinted: Vec::new(),
            #[cfg(feature = "serde")]
            stored: Vec::new(),
            next: 0,
        }
    }

    /// The key of message `id`, fingerprinted: its body starts with the id,
    /// so every message's body differs, as in real traffic.
    fn key(&mut self, handler: &HandlerName, id: u64) -> ClaimKey {
        self.body[..8].copy_from_slice(&id.to_be_bytes());
        let fingerprint = Fingerprint::of(&self.body[..]).expect("bytes always fingerprint");
        key(handler, id).with_fingerprint(fingerprint)
    }

    fn next_of(&mut self, ids: &[u64]) -> u64 {
        self.next += 1;
        ids[self.next % ids.len()]
    }
}

/// Prints what taking a fingerprint costs alone, per payload kind: the
/// median of 15 timings of 20,000 fingerprints each.
pub fn print_hash_cost() {
    let body: Vec<u8> = (0..BODY_BYTES).map(|n| (n % 251) as u8).collect();
    let text: String = body
        .iter()
        .map(|byte| char::from(b'a' + byte % 26))
        .collect();
    let per = |what: &dyn Fn() -> Fingerprint| {
        let mut timings: Vec<f64> = (0..15)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..20_000 {
                    std::hint::black_box(what());
                }
                start.elapsed().as_nanos() as f64 / 20_000.0
            })
            .collect();
        timings.sort_by(f64::total_cmp);
        timings[timings.len() / 2]
    };
    let bytes = per(&|| Fingerprint::of(std::hint::black_box(&body[..])).expect("bytes"));
    let text = per(&|| Fingerprint::of(std::hint::black_box(text.as_str())).expect("text"));
    print!(
        "fingerprint alone: {BODY_BYTES} bytes {bytes:.0} ns, {BODY_BYTES} bytes of text {text:.0} ns"
    );
    #[cfg(feature = "serde")]
    {
        let receipt = Receipt {
            message: 42,
            account: 7,
            status: "accepted".into(),
            note: "a receipt of about the size an API returns".into(),
        };
        let value = per(&|| Fingerprint::of(std::hint::black_box(&receipt)).expect("a struct"));
        print!(", a 4-field struct {value:.0} ns");
    }
    println!(
        " ({} path)",
        if cfg!(feature = "serde") {
            "serde's canonical"
        } else {
            "direct"
        }
    );
}

/// A receipt, as a request/response handler stores it.
#[cfg(feature = "serde")]
#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    message: u64,
    account: i64,
    status: String,
    note: String,
}

impl<C: BenchConnection> Worker<C> {
    /// One delivery of a payload variant.
    pub(super) fn deliver_payload(&mut self, variant: Variant) {
        #[cfg(feature = "serde")]
        let account = self.account;
        let handler = self.handler.clone();
        match variant {
            Variant::Fingerprint => {
                let key = self.payloads.key(&handler, fresh_ids(1));
                self.fingerprinted(key);
            }
            Variant::FingerprintDuplicate => {
                if self.payloads.fingerprinted.is_empty() {
                    let first = fresh_ids(REDELIVERED);
                    for id in first..first + REDELIVERED as u64 {
                        let key = self.payloads.key(&handler, id);
                        self.fingerprinted(key);
                        self.payloads.fingerprinted.push(id);
                    }
                }
                let id = self.payloads.next_of(&self.payloads.fingerprinted.clone());
                let key = self.payloads.key(&handler, id);
                let outcome = run_idempotent(&mut self.conn, key, |_: &mut C| {
                    QueryResult::Ok(Outcome::Processed(()))
                })
                .expect("fingerprint-duplicate");
                assert!(outcome.is_duplicate());
            }
            #[cfg(feature = "serde")]
            Variant::Stored => {
                let key = self.payloads.key(&handler, fresh_ids(1));
                self.stored(key, account);
            }
            #[cfg(feature = "serde")]
            Variant::StoredDuplicate => {
                if self.payloads.stored.is_empty() {
                    let first = fresh_ids(REDELIVERED);
                    for id in first..first + REDELIVERED as u64 {
                        let key = self.payloads.key(&handler, id);
                        self.stored(key, account);
                        self.payloads.stored.push(id);
                    }
                }
                let id = self.payloads.next_of(&self.payloads.stored.clone());
                let key = self.payloads.key(&handler, id);
                let outcome = inbox_runtime::run_idempotent_storing(
                    &mut self.conn,
                    key,
                    inbox_runtime::MaxAttempts::Unbounded,
                    |_: &mut C| -> QueryResult<inbox_runtime::StoredOutcome<Receipt>> {
                        unreachable!("a duplicate's body does not run")
                    },
                )
                .expect("stored-duplicate");
                assert!(outcome.is_replayed());
            }
            other => unreachable!("{} is not a payload variant", other.name()),
        }
    }

    fn fingerprinted(&mut self, key: ClaimKey) {
        let account = self.account;
        run_idempotent(&mut self.conn, key, |conn: &mut C| {
            conn.effect(account).map(drop)
        })
        .expect("fingerprint");
    }

    #[cfg(feature = "serde")]
    fn stored(&mut self, key: ClaimKey, account: i64) {
        let message = key.message_id().parse().expect("a numeric id");
        let outcome = inbox_runtime::run_idempotent_storing(
            &mut self.conn,
            key,
            inbox_runtime::MaxAttempts::Unbounded,
            |conn: &mut C| {
                conn.effect(account)?;
                QueryResult::Ok(inbox_runtime::StoredOutcome::Processed(Receipt {
                    message,
                    account,
                    status: "accepted".into(),
                    note: "a receipt of about the size an API returns".into(),
                }))
            },
        )
        .expect("stored-result");
        assert!(outcome.is_processed() || outcome.is_replayed());
    }
}
