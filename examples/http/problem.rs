//! Error responses as `application/problem+json` (RFC 9457), and which
//! status each failure gets.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use inbox_runtime::{InboxError, Recovery, StoredResultProblem};

use super::key::KeyError;
use super::payments::{InvalidBody, PaymentError};

/// An error response: `type`, `title`, `status` and `detail`, and a
/// `Retry-After` for the ones worth retrying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The status code.
    pub status: StatusCode,
    /// The problem type: `/problems/<slug>`, one per kind of failure.
    pub kind: &'static str,
    /// A short summary of the kind.
    pub title: &'static str,
    /// This occurrence, in words.
    pub detail: String,
    /// Seconds to wait before retrying (`Retry-After`), for 409 and 503.
    pub retry_after: Option<u32>,
}

impl Problem {
    fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: String) -> Self {
        Problem {
            status,
            kind,
            title,
            detail,
            retry_after: None,
        }
    }

    fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The request has no usable `Idempotency-Key`: 400.
    pub fn of_key(error: &KeyError) -> Problem {
        let (kind, title) = match error {
            KeyError::Missing => ("idempotency-key-missing", "Idempotency-Key is missing"),
            KeyError::Repeated | KeyError::Malformed(_) => {
                ("idempotency-key-invalid", "Idempotency-Key is invalid")
            }
        };
        Problem::new(StatusCode::BAD_REQUEST, kind, title, error.to_string())
    }

    /// The body was refused before anything was claimed: 400 or 422.
    pub fn of_body(error: &InvalidBody) -> Problem {
        match error.status {
            400 => Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed-request",
                "The body is not a payment request",
                error.detail.clone(),
            ),
            _ => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-payment",
                "The payment is invalid",
                error.detail.clone(),
            ),
        }
    }

    /// A connection could not be had from the pool: 503.
    pub fn unavailable(detail: String) -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database-unavailable",
            "The database is unavailable",
            detail,
        )
        .retry_after(1)
    }

    /// Anything else: 500. Nothing was committed (every failure after the
    /// commit is a replay's, answered by [`Problem::used_key`]).
    pub fn internal(detail: String) -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal-error",
            "The payment could not be created",
            detail,
        )
    }

    /// A key whose request was made, but whose response cannot be
    /// replayed (`why`: none is stored, or it no longer reads): 409. The
    /// request is not run again; the client must not take it as undone.
    pub fn used_key(key: &str, why: &str) -> Problem {
        Problem::new(
            StatusCode::CONFLICT,
            "idempotency-key-used",
            "Idempotency-Key was already used",
            format!("the key {key:?} was already used, and {why}"),
        )
    }

    /// A claimed key whose claim holds no response (a claim made by
    /// something other than this handler).
    pub fn no_stored_response(key: &str) -> Problem {
        Problem::used_key(key, "no response is stored for it")
    }

    /// What creating the payment failed with: nothing was committed, except
    /// for a replay whose stored response no longer reads (409), and a
    /// connection lost during the commit (503: the outcome is unknown, and
    /// a retry with the same key replays it or runs anew).
    pub fn of_error(error: &PaymentError) -> Problem {
        match error {
            PaymentError::Inbox(error) => Problem::of_inbox(error),
            PaymentError::Database(error) => match InboxError::find_in(error) {
                Some(inbox) => Problem::of_inbox(inbox),
                None => Problem::of_database(error),
            },
        }
    }

    fn of_inbox(error: &InboxError) -> Problem {
        match error {
            InboxError::InvalidMessageId { .. } => Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency-key-invalid",
                "Idempotency-Key is invalid",
                error.to_string(),
            ),
            InboxError::Conflict(conflict) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key was used with another payload",
                format!(
                    "the key {} was already used for a request with a different body \
                     (fingerprint {}, this request's {}); a retry must repeat the body exactly, \
                     and a new request needs a new key",
                    conflict.message_id,
                    conflict
                        .stored
                        .map_or_else(|| "unknown".to_owned(), |stored| stored.to_hex()),
                    conflict.delivered.to_hex(),
                ),
            ),
            InboxError::StoredResult {
                message_id,
                problem: StoredResultProblem::Unreadable { .. },
                ..
            } => Problem::used_key(
                message_id,
                "its stored response can no longer be read (stored by another version of the \
                 service)",
            ),
            // A request with the same key is still being processed: the
            // claim waited `Config::claim_wait` for it.
            InboxError::InProgress { .. } => Problem::new(
                StatusCode::CONFLICT,
                "request-in-progress",
                "A request with this Idempotency-Key is in progress",
                "a request with the same key is still being processed; retry later to get \
                 its response"
                    .to_owned(),
            )
            .retry_after(1),
            InboxError::Database(cause) => Problem::of_database(cause),
            error if error.recovery() == Recovery::Reconnect => {
                Problem::unavailable(error.to_string())
            }
            error => Problem::internal(error.to_string()),
        }
    }

    fn of_database(error: &diesel::result::Error) -> Problem {
        match inbox_runtime::recovery(error) {
            Recovery::Reconnect => Problem::unavailable(error.to_string()),
            _ => Problem::internal(error.to_string()),
        }
    }

    /// The problem's JSON body.
    pub fn body(&self) -> String {
        serde_json::json!({
            "type": format!("/problems/{}", self.kind),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        })
        .to_string()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
