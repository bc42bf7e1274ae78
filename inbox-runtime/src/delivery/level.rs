//! One transaction level on an executor (a handler's, a batch's, the short
//! transaction that records a failure): begun, committed or rolled back by
//! the one set of rules, blocking and async alike.

use diesel::QueryResult;

use super::executor::Executor;
use crate::backend::LateTripwire;
use crate::error::InboxError;
use crate::error::Recovery;
use crate::key::ClaimKey;
use crate::recovery::{is_commit_unanswered, recovery};
use crate::scope::{Scope, either, report_after_failed_rollback};

/// A level of a [`Scope`], begun and ended through an [`Executor`].
#[derive(Debug)]
pub(crate) struct Level {
    /// Where the level sits, and its SQL.
    pub(crate) scope: Scope,
}

impl Level {
    /// A handler's level on `exec`: the outermost transaction (bounded by
    /// the executor's idle limit) or a savepoint in the caller's. A broken
    /// connection is refused with `BrokenTransactionManager`.
    pub(crate) fn of_handler<X: Executor>(exec: &mut X) -> QueryResult<Level> {
        let idle_limit = exec.idle_limit();
        let scope = Scope::bounded::<X::Backend>(exec.status(), idle_limit)?;
        Ok(Level { scope })
    }

    /// The short transaction that records a failed attempt after the
    /// handler's level rolled back (never bounded: it sits idle for no one).
    pub(crate) fn short<X: Executor>(exec: &mut X) -> QueryResult<Level> {
        let scope = Scope::new::<X::Backend>(exec.status())?;
        Ok(Level { scope })
    }

    /// Whether this is the outermost transaction (no caller's around it).
    pub(crate) fn is_outermost(&self) -> bool {
        self.scope.is_outermost()
    }

    /// Sends `BEGIN` (or the savepoint). Marked open first, so a
    /// cancellation while it is in flight also marks the connection broken.
    pub(crate) async fn begin<X: Executor>(&self, exec: &mut X) -> Result<(), InboxError> {
        self.begin_with(exec, &self.scope.begin_sql()).await
    }

    /// [`begin`](Self::begin) for a claim whose body may not run: where the
    /// backend's outermost transaction has a tripwire and each statement
    /// costs the executor a round trip, the tripwire is left unset and the
    /// session gets a claim token new to this level (see [`LateTripwire`]):
    /// a single delivery's claim writes it and its commit checks it
    /// ([`commit_claimed`](Self::commit_claimed)); a batch sets the
    /// tripwire with [`arm`](Self::arm) once its ids are claimed. A
    /// duplicate then costs no tripwire at all. Otherwise the level's begin
    /// goes through [`Executor::hold_begin`], which may hold an outermost
    /// `BEGIN` to send with the claim.
    pub(crate) async fn begin_for_claim<X: Executor>(
        &self,
        exec: &mut X,
    ) -> Result<Tripwire, InboxError> {
        match self.scope.late_tripwire() {
            Some(late) if exec.pays_per_statement(&self.scope) => {
                self.begin_with(exec, late.begin).await?;
                Ok(Tripwire::Unset(late))
            }
            _ => {
                if exec.hold_begin(&self.scope) {
                    // Held, to go with the claim: open from here on.
                    exec.set_open(true);
                    self.entered(exec, Ok(()))?;
                } else {
                    self.begin(exec).await?;
                }
                Ok(Tripwire::Set)
            }
        }
    }

    /// Sets the tripwire [`begin_for_claim`](Self::begin_for_claim) left
    /// unset, once an id is claimed and before a body runs (the level's
    /// commit then releases it).
    pub(crate) async fn arm<X: Executor>(
        &self,
        exec: &mut X,
        tripwire: &mut Tripwire,
    ) -> Result<(), InboxError> {
        if let Tripwire::Unset(late) = *tripwire {
            exec.level_sql(&self.scope, late.set).await?;
            *tripwire = Tripwire::Set;
        }
        Ok(())
    }

    /// Commits a level [`begin_for_claim`](Self::begin_for_claim) began,
    /// a batch's or a duplicate's: with [`commit`](Self::commit) once
    /// armed, otherwise (no id claimed, no body ran, nothing written)
    /// without the tripwire's release.
    pub(crate) async fn commit_after_claim<X: Executor>(
        &self,
        exec: &mut X,
        tripwire: Tripwire,
    ) -> Result<(), InboxError> {
        match tripwire {
            Tripwire::Set => self.commit(exec).await,
            Tripwire::Unset(late) => {
                self.commit_sql(exec, "", Ending::Text(late.end_unset))
                    .await
            }
        }
    }

    /// Commits a single delivery's level
    /// [`begin_for_claim`](Self::begin_for_claim) began and whose claim of
    /// `key` took its id, sending `statements` first as
    /// [`commit_with`](Self::commit_with) does. Where the tripwire was left
    /// unset, the claim wrote the session's claim token: the commit is
    /// [`Executor::commit_claim_checked`], which commits nothing unless
    /// the claim's row is there with that token.
    pub(crate) async fn commit_claimed<X: Executor>(
        &self,
        exec: &mut X,
        statements: &str,
        tripwire: Tripwire,
        key: &ClaimKey,
    ) -> Result<(), InboxError> {
        match tripwire {
            Tripwire::Set => self.commit_with(exec, statements).await,
            Tripwire::Unset(late) => {
                self.commit_sql(exec, statements, Ending::ClaimChecked(key, late))
                    .await
            }
        }
    }

    /// Commits a level [`begin_for_claim`](Self::begin_for_claim) began and
    /// whose claim found its id taken (no body ran): as
    /// [`commit_after_claim`](Self::commit_after_claim), without the
    /// backend's check for an aborted transaction, which has nothing to
    /// find there.
    pub(crate) async fn commit_duplicate<X: Executor>(
        &self,
        exec: &mut X,
        tripwire: Tripwire,
    ) -> Result<(), InboxError> {
        match tripwire {
            Tripwire::Set => {
                let sql = self.scope.duplicate_commit_sql();
                self.commit_sql(exec, "", Ending::Text(&sql)).await
            }
            unset => self.commit_after_claim(exec, unset).await,
        }
    }

    /// Commits the level of a fingerprinted claim's duplicate whose stored
    /// fingerprint was not read ([`Taken::DuplicateUnchecked`], in the
    /// transaction `late` began): the commit compares `key`'s fingerprint
    /// with the stored one ([`LateTripwire::end_duplicate_checked`]). A
    /// refused commit changed nothing, and the stored claim is read in the
    /// still open transaction before it rolls back: another fingerprint is
    /// [`InboxError::Conflict`], as a duplicate that read it would say.
    ///
    /// [`Taken::DuplicateUnchecked`]: crate::claim::Taken::DuplicateUnchecked
    pub(crate) async fn commit_duplicate_checked<X: Executor>(
        &self,
        exec: &mut X,
        late: LateTripwire,
        key: &ClaimKey,
    ) -> Result<(), InboxError> {
        self.commit_sql(exec, "", Ending::FingerprintChecked(key, late))
            .await
    }

    async fn begin_with<X: Executor>(&self, exec: &mut X, sql: &str) -> Result<(), InboxError> {
        exec.set_open(true);
        let begun = exec.level_sql(&self.scope, sql).await;
        self.entered(exec, begun)
    }

    /// Records the level as open once its begin went through (the
    /// executor was marked open before it was sent).
    fn entered<X: Executor>(
        &self,
        exec: &mut X,
        begun: diesel::QueryResult<()>,
    ) -> Result<(), InboxError> {
        if let Err(error) = begun {
            exec.set_open(false);
            return Err(error.into());
        }
        self.scope.entered(exec.status())?;
        Ok(())
    }

    /// Commits the level; on failure, rolls it back and says why it did not
    /// commit.
    pub(crate) async fn commit<X: Executor>(&self, exec: &mut X) -> Result<(), InboxError> {
        self.commit_with(exec, "").await
    }

    /// [`commit`](Self::commit), sending `statements` (each ending with
    /// `;`, see [`deferred`](super::deferred)) before the commit in the
    /// same round trip: one that fails fails the commit, and nothing
    /// commits.
    pub(crate) async fn commit_with<X: Executor>(
        &self,
        exec: &mut X,
        statements: &str,
    ) -> Result<(), InboxError> {
        let sql = self.scope.commit_sql();
        self.commit_sql(exec, statements, Ending::Text(&sql)).await
    }

    /// [`commit_with`](Self::commit_with), committing with `ending`.
    async fn commit_sql<X: Executor>(
        &self,
        exec: &mut X,
        statements: &str,
        ending: Ending<'_>,
    ) -> Result<(), InboxError> {
        if !self.scope.is_open(exec.status())? {
            return Err(self.ended_by_body(exec));
        }
        let Err(commit_error) = self.send_commit(exec, statements, ending).await else {
            exec.set_open(false);
            return self.scope.left(exec.status()).map_err(Into::into);
        };
        if self.scope.is_outermost() && matches!(self.scope.is_open(exec.status()), Ok(false)) {
            // The failed COMMIT ended the transaction itself (PostgreSQL rolls
            // back a transaction whose COMMIT fails, and Diesel's blocking
            // connection saw it idle): nothing committed, nothing is left to
            // roll back, and the connection is sound.
            exec.set_open(false);
            return Err(self.scope.failed_commit(false, commit_error));
        }
        let mut aborted = false;
        // A statement sent before the commit reports its own failure (an
        // aborted transaction's included): the probe would take it for one
        // the body ignored.
        if statements.is_empty() && recovery(&commit_error) != Recovery::Reconnect {
            if let Some(probe) = self.scope.aborted_probe_sql() {
                aborted = exec.level_sql(&self.scope, probe).await.is_err();
            }
        }
        let unanswered = is_commit_unanswered(&commit_error);
        let conflict = match ending {
            Ending::FingerprintChecked(key, _)
                if recovery(&commit_error) != Recovery::Reconnect =>
            {
                stored_conflict(exec, key).await
            }
            _ => None,
        };
        let failed = conflict.unwrap_or_else(|| self.scope.failed_commit(aborted, commit_error));
        match self.roll_back(exec).await {
            Ok(()) => match ending {
                Ending::ClaimChecked(key, late)
                    if unanswered && committed(exec, key, late).await =>
                {
                    Ok(())
                }
                _ => Err(failed),
            },
            Err(rollback_error) => {
                Err(either(report_after_failed_rollback(failed, rollback_error)))
            }
        }
    }

    /// Sends `statements` and the commit `ending`: one text in one round
    /// trip, or the statements, then the statement that checks the claim
    /// token and commits (each statement of a text costs a round trip of
    /// its own where it has one anyway).
    async fn send_commit<X: Executor>(
        &self,
        exec: &mut X,
        statements: &str,
        ending: Ending<'_>,
    ) -> diesel::QueryResult<()> {
        match ending {
            Ending::Text(commit_sql) => {
                let sql = match statements {
                    "" => std::borrow::Cow::Borrowed(commit_sql),
                    statements => std::borrow::Cow::Owned(format!("{statements}{commit_sql}")),
                };
                exec.level_sql(&self.scope, &sql).await
            }
            Ending::ClaimChecked(key, _) => {
                if !statements.is_empty() {
                    exec.level_sql(&self.scope, statements).await?;
                }
                exec.commit_claim_checked(key).await
            }
            Ending::FingerprintChecked(key, late) => {
                let fingerprint = key.fingerprint().map_or(&[][..], |f| f.as_bytes());
                let binds = crate::claim::column_binds(fingerprint, key);
                exec.execute_bound(late.end_duplicate_checked, &binds)
                    .await
                    .map(drop)
            }
        }
    }

    /// Rolls back the level and whatever the body left open above it; a
    /// rollback that fails marks the connection broken.
    pub(crate) async fn roll_back<X: Executor>(&self, exec: &mut X) -> Result<(), InboxError> {
        if !self.scope.is_open(exec.status())? {
            return Err(self.ended_by_body(exec));
        }
        let rolled_back = exec
            .level_sql(&self.scope, &self.scope.rollback_sql())
            .await;
        exec.set_open(false);
        match rolled_back {
            Ok(()) => self.scope.left(exec.status()).map_err(Into::into),
            Err(error) => Err(self.scope.lose(exec.status(), error)),
        }
    }

    /// The body ended the handler's level itself: what it committed or
    /// rolled back cannot be told apart any more.
    fn ended_by_body<X: Executor>(&self, exec: &mut X) -> InboxError {
        exec.set_open(false);
        self.scope
            .lose(exec.status(), diesel::result::Error::NotInTransaction)
    }
}

/// Whether an outermost transaction's tripwire is set (see
/// [`Level::begin_for_claim`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tripwire {
    /// Set when the level began, or the level has none.
    Set,
    /// Left for after the claim: a batch's [`Level::arm`], or a single
    /// delivery's claim token ([`Level::commit_claimed`]).
    Unset(LateTripwire),
}

/// How a commit ends the level.
#[derive(Debug, Clone, Copy)]
enum Ending<'a> {
    /// A text of the level's statements.
    Text(&'a str),
    /// [`Executor::commit_claim_checked`] of the claim's key, in the
    /// transaction `LateTripwire` began.
    ClaimChecked(&'a ClaimKey, LateTripwire),
    /// [`LateTripwire::end_duplicate_checked`] of a duplicate's key and
    /// fingerprint.
    FingerprintChecked(&'a ClaimKey, LateTripwire),
}

/// The conflict a refused [`Ending::FingerprintChecked`] found, read in
/// its transaction: `key`'s claim stored another fingerprint. `None` where
/// the read finds none (the commit failed for another reason), or fails.
async fn stored_conflict<X: Executor>(exec: &mut X, key: &ClaimKey) -> Option<InboxError> {
    match crate::claim::duplicate_of(key, super::steps::stored_claim(exec, key).await.ok()?) {
        Err(conflict @ InboxError::Conflict(_)) => Some(conflict),
        _ => None,
    }
}

/// Whether the claim of `key` that the unanswered commit of a
/// token-checked transaction, since rolled back, was to commit is
/// committed after all ([`LateTripwire::committed_claim`]): its token is
/// that transaction's own, so no other transaction wrote it. Asked only
/// of a commit that failed without saying why: one that failed for a
/// reason (a conflict, a lost claim) committed nothing of what followed a
/// statement that commits implicitly, which a row would not tell. A read
/// that fails says no: the commit's own error is reported.
async fn committed<X: Executor>(exec: &mut X, key: &ClaimKey, late: LateTripwire) -> bool {
    let binds = crate::claim::key_binds(key);
    matches!(exec.load_stored_claim(late.committed_claim, &binds).await, Ok(rows) if !rows.is_empty())
}
