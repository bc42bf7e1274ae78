//! The producer's side: which payments are published, which of them are
//! poison, which are published again, and what the ledger must look like
//! afterwards.
//!
//! A plan is made of waves. Each wave publishes new payments and, as a
//! producer that timed out waiting for its broker does, publishes again a
//! share of the previous wave's (a "late" retry, which a JetStream stream
//! may no longer drop as a duplicate) and of its own (an "early" retry).
//! Among the payments: poison ones, to an account that does not exist
//! (rejected: dead at once) or in a currency with no rate (dead after
//! [`MAX_ATTEMPTS`](super::ledger::MAX_ATTEMPTS) failed attempts), and
//! now and then a message without an id. A wave may also carry slow
//! payments (their handler holds its transaction open for a while),
//! published as a storm of copies at once, as a producer that retries on a
//! short timeout does: the copies arrive while the first delivery runs.

use std::collections::{BTreeMap, HashMap};

use super::ledger::{PaymentBody, LEDGER_CURRENCY, UNQUOTED_CURRENCY};
use super::Outgoing;

/// A small deterministic random generator (SplitMix64): a run is repeated
/// by its seed.
///
/// ```
/// use inbox_examples::brokers::plan::Rng;
/// let mut a = Rng::new(7);
/// let mut b = Rng::new(7);
/// assert_eq!(a.below(1000), b.below(1000));
/// ```
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A seed from the clock and the process id.
    pub fn seed_from_clock() -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        nanos ^ (u64::from(std::process::id()) << 32)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// `true` with `percent` % probability.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a payment is, and so what must become of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Applied exactly once.
    Good,
    /// To an account that does not exist: rejected, dead at once, no effect.
    Rejected,
    /// In a currency with no rate: dead after the handler's attempts, no
    /// effect.
    Exhausted,
}

/// How a plan mixes its messages (percent of each wave's new payments).
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Accounts `1..=accounts` exist.
    pub accounts: i64,
    /// Payments published again in the next wave.
    pub late_retry_percent: u64,
    /// Payments published twice in their own wave.
    pub early_retry_percent: u64,
    /// Payments to an account that does not exist.
    pub rejected_percent: u64,
    /// Payments in a currency with no rate.
    pub exhausted_percent: u64,
    /// Messages without an id, per wave.
    pub missing_ids_per_wave: usize,
    /// Slow good payments per wave, beside the new payments.
    pub slow_per_wave: usize,
    /// How long a slow payment's handler holds its transaction, in ms.
    pub slow_hold_ms: u64,
    /// Copies of each slow payment published at once (at least 1).
    pub storm_copies: u32,
}

impl Default for Mix {
    /// 10 accounts; 15 % late and 5 % early retries; 3 % rejected, 3 %
    /// exhausted; one message without an id per wave; no slow payments.
    fn default() -> Self {
        Mix {
            accounts: 10,
            late_retry_percent: 15,
            early_retry_percent: 5,
            rejected_percent: 3,
            exhausted_percent: 3,
            missing_ids_per_wave: 1,
            slow_per_wave: 0,
            slow_hold_ms: 0,
            storm_copies: 1,
        }
    }
}

/// What the producer published about one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// What it is.
    pub kind: Kind,
    /// Its payload.
    pub body: PaymentBody,
    /// Copies published.
    pub published: u32,
    /// Copies the broker stored (a JetStream stream drops a re-publish
    /// within its duplicate window).
    pub stored: u32,
}

/// The producer's plan, and its record of what the broker stored.
///
/// ```
/// use inbox_examples::brokers::plan::{Mix, Plan};
/// let mut plan = Plan::new("demo", 1, Mix::default());
/// let wave = plan.wave(100);
/// assert!(wave.len() > 100); // retries and a message without an id
/// plan.record(&wave, &vec![true; wave.len()]);
/// assert_eq!(plan.payments().count(), 100);
/// ```
#[derive(Debug, Clone)]
pub struct Plan {
    run: String,
    rng: Rng,
    mix: Mix,
    next: u64,
    payments: BTreeMap<String, Planned>,
    late: Vec<Outgoing>,
    missing_id_published: u64,
    missing_id_stored: u64,
}

impl Plan {
    /// An empty plan for `run`, drawing from `seed`.
    pub fn new(run: &str, seed: u64, mix: Mix) -> Self {
        Plan {
            run: run.to_owned(),
            rng: Rng::new(seed),
            mix,
            next: 0,
            payments: BTreeMap::new(),
            late: Vec::new(),
            missing_id_published: 0,
            missing_id_stored: 0,
        }
    }

    /// The mix.
    pub fn mix(&self) -> &Mix {
        &self.mix
    }

    /// The next wave: `new_payments` new payments, the previous wave's late
    /// retries, this wave's early retries, its slow payments (each
    /// [`Mix::storm_copies`] times) and its messages without an id,
    /// shuffled. Publish it, then [`record`](Self::record) what the broker
    /// stored.
    pub fn wave(&mut self, new_payments: usize) -> Vec<Outgoing> {
        let mut wave = std::mem::take(&mut self.late);
        for _ in 0..new_payments {
            let message = self.new_payment();
            if self.rng.percent(self.mix.early_retry_percent) {
                wave.push(message.clone());
            }
            if self.rng.percent(self.mix.late_retry_percent) {
                self.late.push(message.clone());
            }
            wave.push(message);
        }
        for _ in 0..self.mix.slow_per_wave {
            let message = self.slow_payment();
            for _ in 0..self.mix.storm_copies.max(1) {
                wave.push(message.clone());
            }
        }
        for _ in 0..self.mix.missing_ids_per_wave {
            let body = self.body(Kind::Good);
            wave.push(Outgoing {
                id: None,
                body: body.encode(),
            });
        }
        self.shuffle(&mut wave);
        wave
    }

    /// The retries still owed by the last wave: publish them at the end.
    pub fn last_retries(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.late)
    }

    /// Another copy of every published payment of the kinds `kinds`, as a
    /// producer that replays its outbox publishes them (after the broker's
    /// duplicate window, if the broker has one).
    pub fn republish(&self, kinds: &[Kind]) -> Vec<Outgoing> {
        self.published()
            .filter(|(_, planned)| kinds.contains(&planned.kind))
            .map(|(id, planned)| Outgoing {
                id: Some(id.to_owned()),
                body: planned.body.encode(),
            })
            .collect()
    }

    /// Records what the broker stored of `published` (the result of
    /// `Broker::publish`, one flag per message).
    pub fn record(&mut self, published: &[Outgoing], stored: &[bool]) {
        assert_eq!(published.len(), stored.len(), "one flag per message");
        for (message, &stored) in published.iter().zip(stored) {
            match &message.id {
                Some(id) => {
                    let planned = self.payments.get_mut(id).expect("a planned payment");
                    planned.published += 1;
                    planned.stored += u32::from(stored);
                }
                None => {
                    self.missing_id_published += 1;
                    self.missing_id_stored += u64::from(stored);
                }
            }
        }
    }

    /// Every planned payment, by id.
    pub fn payments(&self) -> impl Iterator<Item = (&str, &Planned)> {
        self.payments
            .iter()
            .map(|(id, planned)| (id.as_str(), planned))
    }

    /// The planned payment `id`.
    pub fn get(&self, id: &str) -> Option<&Planned> {
        self.payments.get(id)
    }

    /// The payments that have been published (recorded at least once).
    pub fn published(&self) -> impl Iterator<Item = (&str, &Planned)> {
        self.payments().filter(|(_, planned)| planned.published > 0)
    }

    /// How many published payments there are of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.published().filter(|(_, p)| p.kind == kind).count()
    }

    /// Copies published, and stored by the broker, over every message
    /// (payments and messages without an id).
    pub fn copies(&self) -> (u64, u64) {
        let (published, stored) = self.published().fold((0, 0), |(p, s), (_, planned)| {
            (
                p + u64::from(planned.published),
                s + u64::from(planned.stored),
            )
        });
        (
            published + self.missing_id_published,
            stored + self.missing_id_stored,
        )
    }

    /// Messages without an id: published, and stored.
    pub fn missing_ids(&self) -> (u64, u64) {
        (self.missing_id_published, self.missing_id_stored)
    }

    /// The balance each account must end with: the sum of its good
    /// payments.
    pub fn expected_balances(&self) -> HashMap<i64, i64> {
        let mut balances: HashMap<i64, i64> = (1..=self.mix.accounts).map(|a| (a, 0)).collect();
        for (_, planned) in self.published() {
            if planned.kind == Kind::Good {
                *balances.entry(planned.body.account).or_default() += planned.body.amount_cents;
            }
        }
        balances
    }

    fn new_payment(&mut self) -> Outgoing {
        let roll = self.rng.below(100);
        let kind = if roll < self.mix.rejected_percent {
            Kind::Rejected
        } else if roll < self.mix.rejected_percent + self.mix.exhausted_percent {
            Kind::Exhausted
        } else {
            Kind::Good
        };
        let body = self.body(kind);
        self.plan_payment(kind, body)
    }

    fn slow_payment(&mut self) -> Outgoing {
        let body = PaymentBody {
            hold_ms: self.mix.slow_hold_ms,
            ..self.body(Kind::Good)
        };
        self.plan_payment(Kind::Good, body)
    }

    fn plan_payment(&mut self, kind: Kind, body: PaymentBody) -> Outgoing {
        self.next += 1;
        let id = format!("pay-{}-{:06}", self.run, self.next);
        let message = Outgoing {
            id: Some(id.clone()),
            body: body.encode(),
        };
        self.payments.insert(
            id,
            Planned {
                kind,
                body,
                published: 0,
                stored: 0,
            },
        );
        message
    }

    fn body(&mut self, kind: Kind) -> PaymentBody {
        let account = match kind {
            Kind::Rejected => self.mix.accounts + 1 + self.rng.below(1000) as i64,
            Kind::Good | Kind::Exhausted => 1 + self.rng.below(self.mix.accounts as u64) as i64,
        };
        let currency = match kind {
            Kind::Exhausted => UNQUOTED_CURRENCY,
            Kind::Good | Kind::Rejected => LEDGER_CURRENCY,
        };
        PaymentBody {
            account,
            amount_cents: 1 + self.rng.below(100_000) as i64,
            currency: currency.to_owned(),
            hold_ms: 0,
        }
    }

    fn shuffle(&mut self, wave: &mut [Outgoing]) {
        for i in (1..wave.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            wave.swap(i, j);
        }
    }
}
