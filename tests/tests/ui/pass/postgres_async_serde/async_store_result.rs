//! An async handler with a fingerprint and a stored result compiles, and
//! its future is `Send`.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel_async::AsyncPgConnection;
use inbox_runtime::{InboxError, StoredOutcome, idempotent};

pub struct Charge {
    pub key: String,
    pub body: Vec<u8>,
}

#[idempotent(id = req.key, handler = "pass.async_stored", fingerprint = req.body, store_result)]
pub async fn charge(
    conn: &mut AsyncPgConnection,
    req: &Charge,
) -> Result<StoredOutcome<String>, InboxError> {
    let _ = conn;
    Ok(StoredOutcome::Processed(format!(
        "{} bytes",
        req.body.len()
    )))
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let connect = async {
        use diesel_async::AsyncConnection;
        let mut conn = AsyncPgConnection::establish("postgres://unused")
            .await
            .unwrap();
        let req = Charge {
            key: "k".into(),
            body: vec![1],
        };
        let _ = charge(&mut conn, &req).await;
    };
    assert_send(connect);
}
