//! The batch claim: one statement that claims many ids of one handler (see
//! [`InboxBackend::claim_batch`](super::InboxBackend::claim_batch)). What
//! the backends share; each backend's statement is in its own file.

use diesel::QueryableByName;
use diesel::sql_types::Text;

/// What one batch claim statement inserted.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchClaimed {
    /// The ids the statement inserted (claimed for this transaction), in
    /// any order: the others were already claimed.
    Inserted(Vec<String>),
    /// Some ids were inserted and some were already there, and the backend
    /// cannot tell which (MySQL/MariaDB, whose `INSERT IGNORE` reports only
    /// a count): the caller rolls the statement back and claims the ids one
    /// by one.
    Mixed,
}

/// How a backend's batch claim statement tells which ids it inserted.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) enum BatchReports {
    /// It returns them (`RETURNING message_id`).
    Returning,
    /// It reports how many rows it inserted.
    Count,
}

impl BatchClaimed {
    /// The ids a statement's `RETURNING` reported.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn returned(rows: Vec<InsertedId>) -> BatchClaimed {
        BatchClaimed::Inserted(rows.into_iter().map(|row| row.message_id).collect())
    }

    /// What an affected-row count says about a statement that tried to
    /// insert `ids` (all distinct): all new, all present, or mixed.
    pub(crate) fn from_count(ids: &[&str], inserted: usize) -> BatchClaimed {
        if inserted == ids.len() {
            BatchClaimed::Inserted(ids.iter().map(|id| (*id).to_owned()).collect())
        } else if inserted == 0 {
            BatchClaimed::Inserted(Vec::new())
        } else {
            BatchClaimed::Mixed
        }
    }
}

/// A message id a batch claim's `RETURNING` reported.
#[derive(QueryableByName)]
pub(crate) struct InsertedId {
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
}

/// `head` followed by `rows` placeholder pairs `(?, ?)`, comma-separated,
/// then `tail`: the multi-row `VALUES` of the SQLite and MySQL statements.
pub(crate) fn values_sql(head: &str, rows: usize, tail: &str) -> String {
    const ROW: &str = "(?, ?)";
    let mut sql = String::with_capacity(head.len() + rows * (ROW.len() + 2) + tail.len());
    sql.push_str(head);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push_str(ROW);
    }
    sql.push_str(tail);
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_tell_all_new_or_all_present_only() {
        let ids = ["a", "b", "c"];
        assert_eq!(
            BatchClaimed::from_count(&ids, 3),
            BatchClaimed::Inserted(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(
            BatchClaimed::from_count(&ids, 0),
            BatchClaimed::Inserted(vec![])
        );
        assert_eq!(BatchClaimed::from_count(&ids, 2), BatchClaimed::Mixed);
    }

    #[test]
    fn values_lists_one_pair_per_row() {
        assert_eq!(values_sql("V ", 2, ";"), "V (?, ?), (?, ?);");
        assert_eq!(values_sql("V ", 1, ""), "V (?, ?)");
    }
}
