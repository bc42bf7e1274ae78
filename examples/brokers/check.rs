//! The proof of a run: the ledger, the inbox's dead messages and the
//! broker's queues against the producer's [`Plan`].
//!
//! - every good payment has exactly one ledger entry (none lost, none
//!   doubled), no poison payment has one, and every balance is the sum of
//!   its account's good payments;
//! - every good payment has exactly one receipt in the outbox, with its
//!   account and amount, and no poison payment has one (a receipt is
//!   recorded in the payment's transaction: a killed or failed attempt
//!   leaves none behind);
//! - the inbox holds every poison payment as dead, and nothing else:
//!   rejected ones as rejected, the others after at least
//!   [`MAX_ATTEMPTS`] failed attempts (two copies of a payment that fail at
//!   the same time may both be counted); no good payment has a failed
//!   attempt recorded;
//! - the broker's dead-letter queue holds each stored copy of a poison
//!   payment, and of a message without an id, exactly once, and nothing
//!   else;
//! - nothing is left in the queue.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use diesel::{ExpressionMethods, PgConnection, QueryDsl, RunQueryDsl};
use inbox_runtime::dead_letters;
use inbox_runtime::HandlerName;

use super::ledger::{
    inbox_failures, ledger_accounts, ledger_entries, Receipt, HANDLER, MAX_ATTEMPTS, RECEIPTS,
};
use super::plan::{Kind, Plan};
use super::{Backlog, BoxError, DeadLetterQueue};

/// What a run's check found.
#[derive(Debug, Clone)]
pub struct Verification {
    /// Good payments published.
    pub good: usize,
    /// Payments to an account that does not exist.
    pub rejected: usize,
    /// Payments in a currency with no rate.
    pub exhausted: usize,
    /// Messages without an id: published, stored.
    pub missing_ids: (u64, u64),
    /// Copies published, and stored by the broker, of every message.
    pub copies: (u64, u64),
    /// Ledger entries found.
    pub entries: u64,
    /// Receipts found in the outbox.
    pub receipts: u64,
    /// The sum of all balances, in cents.
    pub balance_total: i64,
    /// The sum of the good payments, in cents.
    pub balance_expected: i64,
    /// Payments the inbox holds as dead.
    pub dead_in_inbox: usize,
    /// Messages in the broker's dead-letter queue.
    pub dead_letter_copies: usize,
    /// Copies the dead-letter queue must hold.
    pub dead_letter_copies_expected: u64,
    /// JetStream advisories of messages that reached `max_deliver`.
    pub max_deliveries_advisories: u64,
    /// What was left in the queue after the consumers stopped.
    pub left: Backlog,
    /// Everything that is not as it must be (empty: the run is proven).
    pub problems: Vec<String>,
}

impl Verification {
    /// Whether the run is proven.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the ledger in `db`, the inbox and the broker's `dead_letter_queue`
/// and `left` backlog against `plan`.
pub fn verify(
    plan: &Plan,
    db: &mut PgConnection,
    dead_letter_queue: &DeadLetterQueue,
    left: Backlog,
) -> Result<Verification, BoxError> {
    let mut problems = Vec::new();

    // The effects.
    let entries: Vec<(String, i64)> = ledger_entries::table
        .group_by(ledger_entries::message_id)
        .select((ledger_entries::message_id, diesel::dsl::count_star()))
        .load(db)?;
    let entries: BTreeMap<String, i64> = entries.into_iter().collect();
    let mut lost = Vec::new();
    let mut doubled = Vec::new();
    let mut poison_applied = Vec::new();
    for (id, planned) in plan.published() {
        let found = entries.get(id).copied().unwrap_or(0);
        match (planned.kind, found) {
            (Kind::Good, 1) | (Kind::Rejected | Kind::Exhausted, 0) => {}
            (Kind::Good, 0) => lost.push(id.to_owned()),
            (Kind::Good, _) => doubled.push(format!("{id} ({found} entries)")),
            (_, _) => poison_applied.push(id.to_owned()),
        }
    }
    let unplanned: Vec<String> = entries
        .keys()
        .filter(|id| plan.get(id).is_none_or(|planned| planned.published == 0))
        .cloned()
        .collect();
    report(&mut problems, "good payments lost (no ledger entry)", &lost);
    report(
        &mut problems,
        "good payments applied more than once",
        &doubled,
    );
    report(&mut problems, "poison payments applied", &poison_applied);
    report(
        &mut problems,
        "ledger entries of no published payment",
        &unplanned,
    );

    let receipts = receipts(db)?;
    let mut receipts_wrong = Vec::new();
    for (id, planned) in plan.published() {
        let found = receipts.get(id).map_or(&[][..], Vec::as_slice);
        let as_planned = |receipt: &Receipt| {
            receipt.account == planned.body.account && receipt.cents == planned.body.amount_cents
        };
        match (planned.kind, found) {
            (Kind::Good, [receipt]) if as_planned(receipt) => {}
            (Kind::Rejected | Kind::Exhausted, []) => {}
            (kind, found) => receipts_wrong.push(format!("{id} ({kind:?}): {found:?}")),
        }
    }
    receipts_wrong.extend(
        receipts
            .keys()
            .filter(|id| plan.get(id).is_none_or(|planned| planned.published == 0))
            .map(|id| format!("{id} (never published)")),
    );
    report(
        &mut problems,
        "receipts in the outbox not one per applied payment",
        &receipts_wrong,
    );

    let balances: Vec<(i64, i64)> = ledger_accounts::table
        .select((ledger_accounts::id, ledger_accounts::balance_cents))
        .load(db)?;
    let expected = plan.expected_balances();
    let wrong_balances: Vec<String> = balances
        .iter()
        .filter(|(account, balance)| expected.get(account).copied().unwrap_or(0) != *balance)
        .map(|(account, balance)| {
            format!(
                "account {account}: {balance} cents, expected {}",
                expected.get(account).copied().unwrap_or(0)
            )
        })
        .collect();
    report(&mut problems, "wrong balances", &wrong_balances);

    // The inbox's dead messages.
    let handler = HandlerName::new(HANDLER)?;
    let mut dead = Vec::new();
    let mut after = None;
    loop {
        let page = dead_letters::list(db, &handler, after.as_ref(), dead_letters::MAX_PAGE_SIZE)?;
        dead.extend(page.letters);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut wrong_dead = Vec::new();
    let dead_ids: BTreeSet<&str> = dead.iter().map(|d| d.message_id.as_str()).collect();
    for letter in &dead {
        let kind = plan
            .get(&letter.message_id)
            .filter(|planned| planned.published > 0)
            .map(|planned| planned.kind);
        let as_expected = match kind {
            Some(Kind::Rejected) => letter.rejected,
            Some(Kind::Exhausted) => !letter.rejected && letter.attempts >= MAX_ATTEMPTS,
            Some(Kind::Good) | None => false,
        };
        if !as_expected {
            wrong_dead.push(format!(
                "{} ({:?}, rejected {}, {} attempts: {})",
                letter.message_id, kind, letter.rejected, letter.attempts, letter.last_error
            ));
        }
    }
    let missing_dead: Vec<String> = plan
        .published()
        .filter(|(id, p)| p.kind != Kind::Good && !dead_ids.contains(id))
        .map(|(id, _)| id.to_owned())
        .collect();
    report(
        &mut problems,
        "dead in the inbox, but not as planned",
        &wrong_dead,
    );
    report(
        &mut problems,
        "poison payments not dead in the inbox",
        &missing_dead,
    );

    let failed: Vec<String> = inbox_failures::table
        .filter(inbox_failures::handler.eq(HANDLER))
        .select(inbox_failures::message_id)
        .load(db)?;
    let good_failed: Vec<String> = failed
        .into_iter()
        .filter(|id| {
            plan.get(id)
                .is_some_and(|planned| planned.published > 0 && planned.kind == Kind::Good)
        })
        .collect();
    report(
        &mut problems,
        "good payments with a failed attempt recorded",
        &good_failed,
    );

    // The broker's dead-letter queue: each stored copy of a poison payment
    // and of a message without an id, once.
    let mut in_queue: BTreeMap<Option<&str>, u64> = BTreeMap::new();
    for copy in &dead_letter_queue.copies {
        *in_queue.entry(copy.message_id.as_deref()).or_default() += 1;
    }
    let mut wrong_copies = Vec::new();
    let mut expected_copies = 0;
    for (id, planned) in plan.published() {
        let expected = match planned.kind {
            Kind::Good => 0,
            Kind::Rejected | Kind::Exhausted => u64::from(planned.stored),
        };
        expected_copies += expected;
        let found = in_queue.remove(&Some(id)).unwrap_or(0);
        if found != expected {
            wrong_copies.push(format!(
                "{id} ({:?}): {found} copies, expected {expected}",
                planned.kind
            ));
        }
    }
    let (_, missing_id_stored) = plan.missing_ids();
    expected_copies += missing_id_stored;
    let without_id = in_queue.remove(&None).unwrap_or(0);
    if without_id != missing_id_stored {
        wrong_copies.push(format!(
            "messages without an id: {without_id} copies, expected {missing_id_stored}"
        ));
    }
    wrong_copies.extend(
        in_queue
            .into_iter()
            .map(|(id, n)| format!("{} (never published): {n} copies", id.unwrap_or("-"))),
    );
    report(
        &mut problems,
        "dead-letter queue not as expected",
        &wrong_copies,
    );
    if dead_letter_queue.max_deliveries_advisories > 0 {
        problems.push(format!(
            "{} messages reached max_deliver (JetStream gave up on them)",
            dead_letter_queue.max_deliveries_advisories
        ));
    }
    if !left.is_settled() {
        problems.push(format!("left in the queue: {left:?}"));
    }

    Ok(Verification {
        good: plan.count(Kind::Good),
        rejected: plan.count(Kind::Rejected),
        exhausted: plan.count(Kind::Exhausted),
        missing_ids: plan.missing_ids(),
        copies: plan.copies(),
        entries: entries.values().map(|&n| n as u64).sum(),
        receipts: receipts.values().map(|found| found.len() as u64).sum(),
        balance_total: balances.iter().map(|(_, balance)| balance).sum(),
        balance_expected: expected.values().sum(),
        dead_in_inbox: dead.len(),
        dead_letter_copies: dead_letter_queue.copies.len(),
        dead_letter_copies_expected: expected_copies,
        max_deliveries_advisories: dead_letter_queue.max_deliveries_advisories,
        left,
        problems,
    })
}

/// The receipts in the outbox, by payment.
pub fn receipts(db: &mut PgConnection) -> Result<BTreeMap<String, Vec<Receipt>>, BoxError> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Binary)]
        payload: Vec<u8>,
    }
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT payload FROM inbox_outbox WHERE destination = $1 ORDER BY position",
    )
    .bind::<diesel::sql_types::Text, _>(RECEIPTS)
    .load(db)?;
    let mut receipts: BTreeMap<String, Vec<Receipt>> = BTreeMap::new();
    for row in rows {
        let receipt = Receipt::parse(&row.payload)?;
        receipts
            .entry(receipt.payment.clone())
            .or_default()
            .push(receipt);
    }
    Ok(receipts)
}

fn report(problems: &mut Vec<String>, what: &str, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    const SHOWN: usize = 10;
    let more = ids.len().saturating_sub(SHOWN);
    let mut line = format!("{what}: {}", ids.len());
    line.push_str(&format!(" ({}", ids[..ids.len().min(SHOWN)].join(", ")));
    if more > 0 {
        line.push_str(&format!(", and {more} more"));
    }
    line.push(')');
    problems.push(line);
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let poison = self.rejected + self.exhausted;
        writeln!(
            f,
            "published      {} good payments, {} rejected and {} exhausting poison payments, {} messages without an id; {} copies published, {} stored by the broker",
            self.good, self.rejected, self.exhausted, self.missing_ids.0, self.copies.0, self.copies.1
        )?;
        writeln!(
            f,
            "effects        {} ledger entries and {} receipts for {} good payments; balances total {} cents, expected {}",
            self.entries, self.receipts, self.good, self.balance_total, self.balance_expected
        )?;
        writeln!(
            f,
            "dead letters   {} dead in the inbox of {poison} poison payments; {} copies in the broker's dead-letter queue, expected {}; {} max-deliveries advisories",
            self.dead_in_inbox,
            self.dead_letter_copies,
            self.dead_letter_copies_expected,
            self.max_deliveries_advisories
        )?;
        write!(
            f,
            "left in queue  {} waiting, {} unacknowledged, {} stored",
            self.left.waiting,
            self.left
                .unacknowledged
                .map_or("(not reported)".to_owned(), |n| n.to_string()),
            self.left
                .stored
                .map_or("(not reported)".to_owned(), |n| n.to_string())
        )?;
        if self.is_ok() {
            write!(f, "\ncheck          OK: every good payment applied exactly once, every poison message dead-lettered, nothing stuck")
        } else {
            for problem in &self.problems {
                write!(f, "\nPROBLEM        {problem}")?;
            }
            Ok(())
        }
    }
}
