//! A handler body that holds an `Rc` across an `.await` makes the handler's
//! future `!Send`: spawning it on a multi-threaded runtime is refused, with
//! the compiler naming the `Rc`.

use std::rc::Rc;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> QueryResult<()> {
    let shared = Rc::new(msg.id.clone());
    diesel::sql_query("SELECT 1").execute(conn).await?;
    drop(shared);
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

async fn consume(mut conn: AsyncPgConnection, msg: Payment) {
    assert_send(apply(&mut conn, &msg));
}

fn main() {
    let _ = consume;
}
