//! The end-of-run check, one function for every run (the outbox's and the
//! mutants'): what A applied, what A's outbox holds, what B recorded.

use std::collections::BTreeMap;
use std::fmt;

use diesel::PgConnection;
use inbox_examples::brokers::check::receipts;
use inbox_examples::brokers::ledger::{Payment, Receipt};
use inbox_tests::SqlRows;

/// What the check found, by kind of violation (each a list of payment
/// ids, with what was found).
#[derive(Debug, Default)]
pub struct Findings {
    /// A applied the payment, B recorded no receipt of it.
    pub lost: Vec<String>,
    /// B recorded the receipt of a payment more than once.
    pub doubled: Vec<String>,
    /// B recorded a receipt of a payment A did not apply (rejected, or
    /// rolled back).
    pub ghosts: Vec<String>,
    /// B recorded another account or amount than A applied.
    pub altered: Vec<String>,
    /// A's ledger: a payment not applied exactly as published (good: once;
    /// rejected: never).
    pub ledger: Vec<String>,
    /// A's outbox: through the outbox, one receipt per applied payment and
    /// none for another, nothing pending, nothing dead; without it (a
    /// mutant), nothing.
    pub outbox: Vec<String>,
    /// Receipts in A's outbox.
    pub in_outbox: usize,
    /// Receipts B recorded (rows).
    pub recorded: usize,
}

impl Findings {
    /// Nothing found: every receipt once in A's outbox and once in B, none
    /// for a payment A did not apply.
    pub fn is_clean(&self) -> bool {
        self.hop_is_clean() && self.ledger.is_empty() && self.outbox.is_empty()
    }

    /// The hop to B is right: no receipt lost, doubled, ghostly or altered.
    pub fn hop_is_clean(&self) -> bool {
        self.lost.is_empty()
            && self.doubled.is_empty()
            && self.ghosts.is_empty()
            && self.altered.is_empty()
    }
}

/// Checks the run: `published` are the payments the producer published
/// (each once in the list); `through_outbox` whether A records its
/// receipts in the outbox (the product) or publishes them itself (a
/// mutant).
pub fn check(db: &mut PgConnection, published: &[Payment], through_outbox: bool) -> Findings {
    let mut findings = Findings::default();
    let mut entries: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for row in db.texts(
        "SELECT message_id || ' ' || account_id || ' ' || amount_cents AS value FROM ledger_entries",
    ) {
        let mut words = row.split(' ');
        let (Some(id), Some(account), Some(cents)) = (words.next(), words.next(), words.next())
        else {
            panic!("a ledger entry: {row}");
        };
        entries
            .entry(id.to_owned())
            .or_default()
            .push((account.parse().expect("an account"), cents.parse().expect("cents")));
    }

    // A's ledger, against what was published.
    for payment in published {
        let expected = usize::from(good(payment));
        let found = entries.get(&payment.id).map_or(0, Vec::len);
        if found != expected {
            findings
                .ledger
                .push(format!("{} ({found} entries)", payment.id));
        }
    }
    let unpublished = entries
        .keys()
        .filter(|id| !published.iter().any(|payment| &payment.id == *id));
    findings
        .ledger
        .extend(unpublished.map(|id| format!("{id} (never published)")));

    // A's outbox.
    let outbox = receipts(db).expect("read A's outbox");
    findings.in_outbox = outbox.values().map(Vec::len).sum();
    for (id, applied) in &entries {
        let found = outbox.get(id).map_or(&[][..], Vec::as_slice);
        match (through_outbox, found) {
            (true, [receipt]) if as_applied(receipt, applied) => {}
            (false, []) => {}
            (_, found) => findings.outbox.push(format!("{id}: {found:?}")),
        }
    }
    findings.outbox.extend(
        outbox
            .iter()
            .filter(|(id, _)| !entries.contains_key(*id))
            .map(|(id, found)| format!("{id} (not applied): {found:?}")),
    );
    let pending = db.bigint(
        "SELECT count(*) AS value FROM inbox_outbox WHERE sent_at IS NULL AND dead_at IS NULL",
    );
    let dead = db.bigint("SELECT count(*) AS value FROM inbox_outbox WHERE dead_at IS NOT NULL");
    if pending > 0 {
        findings.outbox.push(format!("{pending} pending"));
    }
    if dead > 0 {
        findings.outbox.push(format!("{dead} dead"));
    }

    // B: one receipt per payment A applied, as A applied it.
    let mut recorded: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for row in db.texts(
        "SELECT payment || ' ' || account || ' ' || cents AS value FROM hop_receipts ORDER BY id",
    ) {
        findings.recorded += 1;
        let mut words = row.split(' ');
        let (Some(id), Some(account), Some(cents)) = (words.next(), words.next(), words.next())
        else {
            panic!("a receipt: {row}");
        };
        recorded.entry(id.to_owned()).or_default().push((
            account.parse().expect("an account"),
            cents.parse().expect("cents"),
        ));
    }
    for (id, applied) in &entries {
        match recorded.get(id).map_or(0, Vec::len) {
            0 => findings.lost.push(id.clone()),
            1 => {}
            n => findings.doubled.push(format!("{id} ({n} times)")),
        }
        let wrong = recorded
            .get(id)
            .into_iter()
            .flatten()
            .filter(|receipt| !applied.contains(receipt));
        findings
            .altered
            .extend(wrong.map(|(account, cents)| format!("{id} ({account}, {cents})")));
    }
    for (id, found) in &recorded {
        if !entries.contains_key(id) {
            let rejected = published
                .iter()
                .any(|payment| &payment.id == id && !good(payment));
            let what = if rejected { "rejected" } else { "not applied" };
            findings
                .ghosts
                .push(format!("{id} ({what}, {} times)", found.len()));
        }
    }
    findings
}

/// A good payment: to an account that exists (see `payment`).
fn good(payment: &Payment) -> bool {
    payment.body.account <= crate::chaos::ACCOUNTS
}

fn as_applied(receipt: &Receipt, applied: &[(i64, i64)]) -> bool {
    applied.contains(&(receipt.account, receipt.cents))
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return f.write_str(
                "check      OK: every applied payment's receipt once in A's outbox and once in B, \
                 none for a payment A did not apply",
            );
        }
        let kinds = [
            (
                "receipts LOST (applied by A, never recorded by B)",
                &self.lost,
            ),
            ("receipts DOUBLED (recorded twice by B)", &self.doubled),
            (
                "GHOST receipts (recorded by B, not applied by A)",
                &self.ghosts,
            ),
            (
                "receipts ALTERED (another account or amount)",
                &self.altered,
            ),
            ("A's ledger not as published", &self.ledger),
            ("A's outbox not as expected", &self.outbox),
        ];
        let mut first = true;
        for (what, ids) in kinds {
            if ids.is_empty() {
                continue;
            }
            if !first {
                writeln!(f)?;
            }
            first = false;
            let shown: Vec<&str> = ids.iter().take(8).map(String::as_str).collect();
            let more = ids.len().saturating_sub(shown.len());
            write!(f, "PROBLEM    {what}: {}: {}", ids.len(), shown.join(", "))?;
            if more > 0 {
                write!(f, ", and {more} more")?;
            }
        }
        Ok(())
    }
}
