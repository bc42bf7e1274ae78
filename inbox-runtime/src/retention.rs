//! How long claimed ids are kept: the retention window, and why it is part of
//! the guarantee; and the durations of configuration files and command lines
//! ([`parse_duration`], [`format_duration`]).
//!
//! The inbox turns a redelivery into a no-op only while the first delivery's
//! id is still in the table. Once pruning removes it, a redelivery of that
//! message is processed again. So the window must outlast every way a message
//! can come back: broker retries, dead-letter replays, a consumer group
//! rewound by hand. [`RetentionPolicy`] makes both numbers explicit and refuses
//! a window shorter than the redelivery window you declare.

use std::fmt;
use std::time::Duration;

pub use crate::duration::format_duration;
use crate::error::InboxError;
pub use crate::error::RetentionProblem;
use crate::key::HandlerName;

/// The longest retention window accepted: 100 years (36,500 days).
///
/// Longer windows would overflow the databases' interval arithmetic; nobody
/// needs them.
///
/// ```
/// assert_eq!(inbox_runtime::MAX_RETENTION.as_secs(), 36_500 * 86_400);
/// ```
pub const MAX_RETENTION: Duration = Duration::from_secs(36_500 * 86_400);

/// How long claimed ids are kept, checked against how late a message can be
/// redelivered, for every handler or per handler.
///
/// - `keep`: ids older than this (by the database clock) may be pruned.
/// - `redelivery_window`: the longest a message can take to come back
///   (broker retries, dead-letter replays, manual replays). `keep` shorter than
///   this is refused, since it would silently let duplicates through.
///
/// A policy covers every handler by default. [`with_handler`](Self::with_handler)
/// gives one handler a longer (or shorter, but still safe) window of its own,
/// and [`only`](Self::only) restricts pruning to one handler's rows. The
/// default windows are checked when the policy is made; the handlers' own
/// windows by [`check`](Self::check), which every pruning run calls first.
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::{HandlerName, RetentionPolicy};
///
/// const DAY: Duration = Duration::from_secs(86_400);
/// let policy = RetentionPolicy::new(7 * DAY, 2 * DAY)?
///     .with_handler(HandlerName::new("ledger.post")?, 30 * DAY);
/// policy.check()?;
/// assert_eq!(policy.keep_for(&HandlerName::new("ledger.post")?), 30 * DAY);
/// assert_eq!(policy.keep_for(&HandlerName::new("mailer.send")?), 7 * DAY);
///
/// // Too short for the declared redelivery window: refused.
/// assert!(RetentionPolicy::new(DAY, 2 * DAY).is_err());
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    keep: Duration,
    redelivery_window: Duration,
    overrides: Vec<(HandlerName, Duration)>,
    only: Option<HandlerName>,
}

impl RetentionPolicy {
    /// A policy keeping every handler's ids for `keep`, refused (with
    /// [`InboxError::InvalidRetention`]) when `keep` is zero, longer than
    /// [`MAX_RETENTION`], or shorter than `redelivery_window`, or when
    /// `redelivery_window` is zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{InboxError, RetentionPolicy, RetentionProblem};
    ///
    /// let hour = Duration::from_secs(3_600);
    /// assert!(RetentionPolicy::new(24 * hour, 6 * hour).is_ok());
    /// let err = RetentionPolicy::new(Duration::ZERO, hour).unwrap_err();
    /// assert!(matches!(err, InboxError::InvalidRetention { problem: RetentionProblem::ZeroWindow, .. }));
    /// assert!(!err.is_retryable());
    /// ```
    pub fn new(keep: Duration, redelivery_window: Duration) -> Result<Self, InboxError> {
        if redelivery_window.is_zero() {
            return Err(invalid(None, RetentionProblem::ZeroRedeliveryWindow));
        }
        if redelivery_window > MAX_RETENTION {
            return Err(invalid(
                None,
                RetentionProblem::TooLong { max: MAX_RETENTION },
            ));
        }
        check_window(None, keep, redelivery_window)?;
        Ok(RetentionPolicy {
            keep,
            redelivery_window,
            overrides: Vec::new(),
            only: None,
        })
    }

    /// Parses both durations (see [`parse_duration`]) and builds the policy,
    /// for windows read from configuration or a command line.
    ///
    /// ```
    /// use inbox_runtime::RetentionPolicy;
    ///
    /// let policy = RetentionPolicy::parse("7d", "36h")?;
    /// assert_eq!(policy.keep().as_secs(), 7 * 86_400);
    /// assert!(RetentionPolicy::parse("-7d", "1d").is_err());
    /// assert!(RetentionPolicy::parse("7 days", "1d").is_err());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn parse(keep: &str, redelivery_window: &str) -> Result<Self, InboxError> {
        RetentionPolicy::new(parse_duration(keep)?, parse_duration(redelivery_window)?)
    }

    /// Gives `handler` a window of its own, checked like the default one by
    /// [`check`](Self::check) (and so by every pruning run). The default
    /// window then no longer applies to that handler's rows. Setting the
    /// same handler again replaces its window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{HandlerName, RetentionPolicy};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let audit = HandlerName::new("audit")?;
    /// let policy = RetentionPolicy::new(7 * day, day)?.with_handler(audit.clone(), 90 * day);
    /// assert_eq!(policy.keep_for(&audit), 90 * day);
    /// // Still refused when shorter than the redelivery window:
    /// assert!(policy.with_handler(audit, Duration::from_secs(60)).check().is_err());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn with_handler(mut self, handler: HandlerName, keep: Duration) -> Self {
        match self.overrides.iter_mut().find(|(name, _)| *name == handler) {
            Some((_, window)) => *window = keep,
            None => self.overrides.push((handler, keep)),
        }
        self
    }

    /// Checks the handlers' own windows like the default one (not zero, not
    /// longer than [`MAX_RETENTION`], not shorter than the redelivery
    /// window): [`InboxError::InvalidRetention`] names the first handler
    /// whose window is refused.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{HandlerName, RetentionPolicy};
    ///
    /// let policy = RetentionPolicy::parse("7d", "1d")?;
    /// assert!(policy.check().is_ok());
    /// let short = policy.with_handler(HandlerName::new("h")?, Duration::from_secs(60));
    /// assert!(short.check().unwrap_err().to_string().contains("`h`"));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn check(&self) -> Result<(), InboxError> {
        check_window(None, self.keep, self.redelivery_window)?;
        for (handler, keep) in &self.overrides {
            check_window(Some(handler), *keep, self.redelivery_window)?;
        }
        Ok(())
    }

    /// Restricts pruning to `handler`'s rows (with its own window if it has
    /// one, the default otherwise); other handlers' rows are left alone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{HandlerName, RetentionPolicy};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let policy = RetentionPolicy::new(7 * day, day)?.only(HandlerName::new("billing")?);
    /// assert_eq!(policy.only_handler().map(|h| h.as_str()), Some("billing"));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn only(mut self, handler: HandlerName) -> Self {
        self.only = Some(handler);
        self
    }

    /// The default retention window.
    ///
    /// ```
    /// # use inbox_runtime::RetentionPolicy;
    /// assert_eq!(RetentionPolicy::parse("2d", "1d")?.keep().as_secs(), 172_800);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn keep(&self) -> Duration {
        self.keep
    }

    /// The declared redelivery window every window is checked against.
    ///
    /// ```
    /// # use inbox_runtime::RetentionPolicy;
    /// assert_eq!(RetentionPolicy::parse("2d", "12h")?.redelivery_window().as_secs(), 43_200);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn redelivery_window(&self) -> Duration {
        self.redelivery_window
    }

    /// The window that applies to `handler`'s ids.
    ///
    /// ```
    /// # use inbox_runtime::{HandlerName, RetentionPolicy};
    /// let policy = RetentionPolicy::parse("2d", "1d")?;
    /// assert_eq!(policy.keep_for(&HandlerName::new("any")?), policy.keep());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn keep_for(&self, handler: &HandlerName) -> Duration {
        self.overrides
            .iter()
            .find(|(name, _)| name == handler)
            .map_or(self.keep, |(_, keep)| *keep)
    }

    /// The handlers with a window of their own.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{HandlerName, RetentionPolicy};
    /// let policy = RetentionPolicy::parse("2d", "1d")?
    ///     .with_handler(HandlerName::new("a")?, Duration::from_secs(5 * 86_400));
    /// assert_eq!(policy.handler_windows().len(), 1);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn handler_windows(&self) -> &[(HandlerName, Duration)] {
        &self.overrides
    }

    /// The one handler pruning is restricted to, if any.
    ///
    /// ```
    /// # use inbox_runtime::RetentionPolicy;
    /// assert!(RetentionPolicy::parse("2d", "1d")?.only_handler().is_none());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn only_handler(&self) -> Option<&HandlerName> {
        self.only.as_ref()
    }

    /// The longest window of the policy: what must be kept when rows cannot
    /// be told apart by handler (the partitioned layout).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{HandlerName, RetentionPolicy};
    /// let policy = RetentionPolicy::parse("2d", "1d")?
    ///     .with_handler(HandlerName::new("a")?, Duration::from_secs(5 * 86_400));
    /// assert_eq!(policy.longest_window().as_secs(), 5 * 86_400);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn longest_window(&self) -> Duration {
        self.overrides
            .iter()
            .map(|(_, keep)| *keep)
            .fold(self.keep, Duration::max)
    }
}

impl fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.only {
            Some(handler) => write!(
                f,
                "keep handler `{handler}`'s ids for {}",
                format_duration(self.keep_for(handler))
            )?,
            None => {
                write!(f, "keep ids for {}", format_duration(self.keep))?;
                for (handler, keep) in &self.overrides {
                    write!(f, ", `{handler}`'s for {}", format_duration(*keep))?;
                }
            }
        }
        write!(
            f,
            " (redelivery window {})",
            format_duration(self.redelivery_window)
        )
    }
}

fn invalid(handler: Option<&HandlerName>, problem: RetentionProblem) -> InboxError {
    InboxError::InvalidRetention {
        handler: handler.map(|h| h.as_str().to_owned()),
        problem,
    }
}

fn check_window(
    handler: Option<&HandlerName>,
    keep: Duration,
    redelivery_window: Duration,
) -> Result<(), InboxError> {
    if keep.is_zero() {
        Err(invalid(handler, RetentionProblem::ZeroWindow))
    } else if keep > MAX_RETENTION {
        Err(invalid(
            handler,
            RetentionProblem::TooLong { max: MAX_RETENTION },
        ))
    } else if keep < redelivery_window {
        Err(invalid(
            handler,
            RetentionProblem::ShorterThanRedelivery {
                keep,
                redelivery_window,
            },
        ))
    } else {
        Ok(())
    }
}

/// Parses a duration such as `7d`, `36h`, `90m`, `1d12h` or `500ms`.
///
/// Units: `w` (weeks), `d`, `h`, `m`, `s`, `ms`, `us` (or `µs`); each segment
/// is a whole number. Surrounding whitespace is ignored. A leading `-` is
/// refused as [`RetentionProblem::Negative`], anything longer than
/// [`MAX_RETENTION`] as [`RetentionProblem::TooLong`], and anything else
/// malformed as [`RetentionProblem::Unparsable`]. `0s` parses (to zero); a
/// policy then refuses it.
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::retention::parse_duration;
///
/// assert_eq!(parse_duration("7d")?, Duration::from_secs(7 * 86_400));
/// assert_eq!(parse_duration("1h30m")?, Duration::from_secs(5_400));
/// assert_eq!(parse_duration("250ms")?, Duration::from_millis(250));
/// assert!(parse_duration("-1d").is_err());
/// assert!(parse_duration("7").is_err());
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, InboxError> {
    let trimmed = text.trim();
    let unparsable = || {
        invalid(
            None,
            RetentionProblem::Unparsable {
                input: trimmed.chars().take(40).collect(),
            },
        )
    };
    if let Some(rest) = trimmed.strip_prefix('-') {
        // Refuse a negative duration as such, but only when the rest parses:
        // "-abc" is plain garbage.
        return match parse_duration(rest) {
            Ok(d) if d.is_zero() => Ok(d),
            Ok(_)
            | Err(InboxError::InvalidRetention {
                problem: RetentionProblem::TooLong { .. },
                ..
            }) => Err(invalid(None, RetentionProblem::Negative)),
            Err(_) => Err(unparsable()),
        };
    }
    if trimmed.is_empty() {
        return Err(unparsable());
    }
    let too_long = || invalid(None, RetentionProblem::TooLong { max: MAX_RETENTION });
    let mut total: u128 = 0; // microseconds
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(unparsable());
        }
        let number: u128 = rest[..digits].parse().map_err(|_| too_long())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let micros_per_unit: u128 = match &rest[..unit_len] {
            "w" => 7 * 86_400_000_000,
            "d" => 86_400_000_000,
            "h" => 3_600_000_000,
            "m" | "min" => 60_000_000,
            "s" => 1_000_000,
            "ms" => 1_000,
            "us" | "µs" => 1,
            _ => return Err(unparsable()),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(micros_per_unit)
            .and_then(|micros| total.checked_add(micros))
            .ok_or_else(too_long)?;
    }
    if total > MAX_RETENTION.as_micros() {
        return Err(too_long());
    }
    let total = u64::try_from(total).map_err(|_| too_long())?;
    Ok(Duration::from_micros(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(result: Result<impl fmt::Debug, InboxError>) -> RetentionProblem {
        match result {
            Err(InboxError::InvalidRetention { problem, .. }) => problem,
            other => panic!("expected an invalid retention error, got {other:?}"),
        }
    }

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(
            parse_duration("2w").unwrap(),
            Duration::from_secs(14 * 86_400)
        );
        assert_eq!(
            parse_duration(" 1d12h ").unwrap(),
            Duration::from_secs(36 * 3_600)
        );
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15min").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("7us").unwrap(), Duration::from_micros(7));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("-0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refuses_malformed_negative_and_huge_durations() {
        assert_eq!(problem(parse_duration("-7d")), RetentionProblem::Negative);
        assert_eq!(
            problem(parse_duration("-99999999999999999999999d")),
            RetentionProblem::Negative
        );
        for text in ["", "7", "d", "7 days", "1.5h", "7x", "-", "--1d", "7d-1h"] {
            assert!(
                matches!(
                    problem(parse_duration(text)),
                    RetentionProblem::Unparsable { .. }
                ),
                "{text:?}"
            );
        }
        assert!(matches!(
            problem(parse_duration("36501d")),
            RetentionProblem::TooLong { .. }
        ));
        assert!(matches!(
            problem(parse_duration("99999999999999999999999999999d")),
            RetentionProblem::TooLong { .. }
        ));
    }

    #[test]
    fn formats_round_trip() {
        for text in ["7d", "36h", "90m", "45s", "1500ms", "7us"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }

    #[test]
    fn policies_refuse_nonsense() {
        let day = Duration::from_secs(86_400);
        assert_eq!(
            problem(RetentionPolicy::new(Duration::ZERO, day)),
            RetentionProblem::ZeroWindow
        );
        assert_eq!(
            problem(RetentionPolicy::new(day, Duration::ZERO)),
            RetentionProblem::ZeroRedeliveryWindow
        );
        assert_eq!(
            problem(RetentionPolicy::new(day, 2 * day)),
            RetentionProblem::ShorterThanRedelivery {
                keep: day,
                redelivery_window: 2 * day
            }
        );
        assert!(matches!(
            problem(RetentionPolicy::new(MAX_RETENTION + day, day)),
            RetentionProblem::TooLong { .. }
        ));
        assert!(
            RetentionPolicy::new(day, day).is_ok(),
            "equal windows are fine"
        );
    }

    #[test]
    fn handler_windows_are_checked_and_replaced() {
        let day = Duration::from_secs(86_400);
        let h = HandlerName::new("h").unwrap();
        let policy = RetentionPolicy::new(7 * day, day).unwrap();
        let err = policy
            .clone()
            .with_handler(h.clone(), day / 2)
            .check()
            .unwrap_err();
        assert!(
            matches!(&err, InboxError::InvalidRetention { handler: Some(name), .. } if name == "h")
        );
        assert!(err.to_string().contains("`h`"), "{err}");
        let policy = policy
            .with_handler(h.clone(), 2 * day)
            .with_handler(h.clone(), 3 * day);
        policy.check().unwrap();
        assert_eq!(policy.handler_windows(), &[(h.clone(), 3 * day)]);
        assert_eq!(policy.longest_window(), 7 * day);
        assert_eq!(
            policy.to_string(),
            "keep ids for 7d, `h`'s for 3d (redelivery window 1d)"
        );
        assert_eq!(
            policy.only(h).to_string(),
            "keep handler `h`'s ids for 3d (redelivery window 1d)"
        );
    }
}
