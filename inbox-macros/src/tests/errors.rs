//! The text of the errors about the arguments, the id and the signature.

use super::{HANDLER, assert_errors, assert_no_errors, assert_one_error, errors};

#[test]
fn accepts_rooted_ids() {
    let item = "fn f(&self, conn: &mut C, msg: &Msg, (a, b): (u32, u32), Env { key, .. }: Env) -> Result<(), E> { Ok(()) }";
    for id in [
        "msg.id",
        "&msg.id",
        "*msg.id",
        "msg.header(\"id\")?.as_str()",
        "msg.ids[now()]",
        "(msg.seq as u64)",
        "msg.seq as u64",
        "a",
        "key.to_string()",
        "self.id",
        "format!(\"{}-{}\", msg.kind, b)",
        "format!(\"{}-{n}\", msg.kind, n = b)",
        "std::format!(\"{}\", msg.id)",
        "\"msg.id\"",
    ] {
        assert_eq!(
            errors(&format!("id = {id}, handler = \"h\""), item),
            Vec::<String>::new(),
            "id = {id}"
        );
    }
}

#[test]
fn refuses_ids_the_consumer_generates() {
    let prefix = "the message id must come from the message: ";
    let cases: &[(&str, &str)] = &[
        (
            "Uuid::new_v4()",
            "`Uuid::new_v4()` is not rooted in a handler parameter; deduplication must key on a stable, producer-assigned id, and a value the consumer generates is different on every delivery",
        ),
        ("now()", "`now()` is not rooted"),
        (
            "rand::random::<u64>()",
            "`rand::random::<u64>()` is not rooted",
        ),
        (
            "SystemTime::now().elapsed()",
            "`SystemTime::now()` is not rooted",
        ),
        ("{ msg.id }", "`{ msg.id }` is not rooted"),
        (
            "\"abc\".to_string()",
            "`\"abc\"` is a literal, and a literal is the same for every message",
        ),
        ("42", "`42` is a literal"),
        ("ID", "`ID` is not a parameter of this handler"),
        (
            "crate::ID",
            "`crate::ID` is a path to an item, not a handler parameter",
        ),
        (
            "conn.id",
            "`conn` is the database connection, not the message; read it from `msg`",
        ),
        ("self.id", "`self` is not a parameter of this handler"),
        ("uuid!(\"x\")", "`uuid!(\"x\")` is a macro call"),
        (
            "format!(\"{msg_id}\")",
            "this `format!` has no argument rooted in a handler parameter; inline `{name}` captures in the format string are not checked",
        ),
        ("format!(\"{}\", now())", "`now()` is not rooted"),
    ];
    for (id, message) in cases {
        assert_one_error(&format!("id = {id}"), HANDLER, &[prefix, message]);
    }
}

#[test]
fn accepts_ids_that_are_the_same_on_every_delivery() {
    for id in [
        "msg.properties.message_id()",
        "msg.headers.as_ref().and_then(|h| h.get(\"Nats-Msg-Id\"))",
        "msg.info()?.stream_sequence",
        "msg.info()?.published",
        "msg.properties.timestamp()",
        "msg.timestamp",
        "format!(\"{}:{}\", msg.partition(), msg.offset())",
        "msg.header(\"delivery_count\")",
        // Not read from a JetStream message's `info()`: an application's field.
        "msg.delivered",
        "msg.attempt",
        "msg.retry_count",
        // A method with arguments is not the broker's accessor.
        "msg.delivery_tag(1)",
    ] {
        assert_no_errors(&format!("id = {id}, handler = \"h\""), HANDLER);
    }
}

#[test]
fn refuses_ids_that_change_per_delivery() {
    let prefix = "the message id must be the same on every delivery of a message: ";
    let redelivery = "so a redelivery would look like a new message and be processed again; use ";
    let amqp = "use the `message_id` property the producer sets (with lapin: `delivery.properties.message_id()`)";
    let nats = "use the `Nats-Msg-Id` header the publisher sets (with async-nats: `message.headers.as_ref().and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))`)";
    let producer = "use the id the producer set on the message: the AMQP `message_id` property";
    let sqs = "use a message attribute holding the producer's id, or the FIFO queue's `MessageDeduplicationId`";
    let cases: &[(&str, &str, &str)] = &[
        (
            "msg.delivery_tag",
            "`msg.delivery_tag` is the AMQP delivery tag, which the broker assigns anew to each delivery",
            amqp,
        ),
        (
            "msg.delivery_tag().to_string()",
            "`msg.delivery_tag()` is the AMQP delivery tag",
            amqp,
        ),
        (
            "&msg.redelivered",
            "`msg.redelivered` is the AMQP redelivered flag",
            amqp,
        ),
        (
            "msg.info()?.consumer_sequence",
            "`msg.info()?.consumer_sequence` is the JetStream consumer sequence, which grows with every delivery, redeliveries included",
            nats,
        ),
        (
            "msg.info().unwrap().delivered as i64",
            "`msg.info().unwrap().delivered` is the JetStream delivery count",
            nats,
        ),
        (
            "msg.delivery_count()",
            "`msg.delivery_count()` is a delivery count, which grows with every redelivery",
            producer,
        ),
        ("msg.num_delivered", "is a delivery count", producer),
        ("msg.redelivery_count", "is a redelivery count", producer),
        (
            "msg.delivery_attempt()",
            "is the delivery attempt number",
            producer,
        ),
        (
            "msg.approximate_receive_count",
            "is the SQS receive count",
            sqs,
        ),
        (
            "msg.received_at.clone()",
            "`msg.received_at` reads as the time this delivery was received, which differs between deliveries",
            producer,
        ),
        (
            "msg.receive_timestamp",
            "reads as the time this delivery was received",
            producer,
        ),
        (
            "msg.receipt_handle().unwrap()",
            "`msg.receipt_handle()` is the SQS receipt handle, which is new on every receive of the message",
            sqs,
        ),
        (
            "msg.lock_token",
            "is the Azure Service Bus lock token",
            "use the `message_id` the sending application sets",
        ),
        (
            "msg.ack_id",
            "is the Google Pub/Sub ack id",
            "use an attribute holding the producer's id",
        ),
        (
            "format!(\"{}-{}\", msg.id, msg.redelivered)",
            "`msg.redelivered` is the AMQP redelivered flag",
            amqp,
        ),
        (
            "format!(\"{}-{t}\", msg.id, t = msg.delivery_tag)",
            "`msg.delivery_tag` is the AMQP delivery tag",
            amqp,
        ),
    ];
    for (id, what, instead) in cases {
        assert_one_error(
            &format!("id = {id}, handler = \"h\""),
            HANDLER,
            &[prefix, what, redelivery, instead],
        );
    }
}

#[test]
fn reports_per_delivery_ids_with_the_other_errors() {
    assert_errors(
        "id = format!(\"{}-{}\", now(), msg.delivery_tag), colour = 1",
        "fn f(msg: &Msg) -> Result<(), E> { Ok(()) }",
        &[
            &["unknown argument `colour`"],
            &["no connection parameter"],
            &["`now()` is not rooted"],
            &["`msg.delivery_tag` is the AMQP delivery tag"],
        ],
    );
}

#[test]
fn reports_argument_mistakes_together() {
    let found = errors(
        "id = msg.id, id = msg.id, colour = \"red\", handler = 42, conn = a.b, crate = 1, \
         max_attempts = 0",
        HANDLER,
    );
    assert_eq!(
        found,
        [
            "duplicate argument `id`: each argument may be given only once",
            "unknown argument `colour`; `#[idempotent]` takes `id`, `handler`, `conn`, `max_attempts`, `claim_wait`, `fingerprint`, `trace`, `store_result`, `shared_scope`, `crate` and `outside_transaction`",
            "`handler` takes a string literal, e.g. `handler = \"billing.apply_payment\"`",
            "`conn` takes the name of the connection parameter, e.g. `conn = db`",
            "`crate` takes the path of the `inbox_runtime` crate, e.g. `crate = \"::my_inbox\"`",
            "`max_attempts = 0` would never run the handler: a message gets at least one attempt; \
             write `max_attempts = 1` to give up after the first failure",
        ]
    );
}

#[test]
fn refuses_claim_waits_that_are_not_durations() {
    const USAGE: &str = "`claim_wait` takes a duration such as `\"2s\"`, `\"500ms\"` or `\"1m\"`, `unbounded`, or an expression of type `ClaimWait`";
    for wait in ["\"2 weeks\"", "\"2h\"", "\"s\"", "2", "true"] {
        assert_one_error(
            &format!("id = msg.id, claim_wait = {wait}"),
            HANDLER,
            &[USAGE],
        );
    }
}

#[test]
fn reports_missing_empty_and_unparsable_ids() {
    assert_one_error("", HANDLER, &["missing `id = ...`"]);
    assert_one_error("handler = \"x\"", HANDLER, &["missing `id = ...`"]);
    assert_one_error("id = \"\"", HANDLER, &["`id` is empty"]);
    assert_one_error(
        "id = \"msg.\"",
        HANDLER,
        &["`id = \"msg.\"` is not a Rust expression"],
    );
    assert_one_error("id", HANDLER, &["`id` needs a value: write `id = ...`"]);
    assert_eq!(errors("id = , handler = \"\"", HANDLER).len(), 2);
}

#[test]
fn validates_literal_handler_names() {
    assert_one_error(
        "id = msg.id, handler = \"\"",
        HANDLER,
        &["the handler name is empty"],
    );
    let long = format!("id = msg.id, handler = \"{}\"", "h".repeat(256));
    assert_one_error(
        &long,
        HANDLER,
        &["the handler name is 256 bytes long; the inbox table stores at most 255 bytes"],
    );
    assert_one_error(
        "id = msg.id, handler = \"a\\0b\"",
        HANDLER,
        &["NUL character"],
    );
    assert!(
        errors(
            &format!("id = msg.id, handler = \"{}\"", "h".repeat(255)),
            HANDLER
        )
        .is_empty()
    );
}

#[test]
fn checks_the_signature() {
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) { }",
        &["an idempotent handler must return `Result<_, _>`"],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) -> ! { loop {} }",
        &["must return `Result<_, _>`"],
    );
    assert_one_error(
        "id = msg.id",
        "fn f(conn: &mut C, msg: &M) -> Result<impl Debug, E> { todo!() }",
        &["`impl Trait` cannot appear in the return type"],
    );
    assert_one_error(
        "id = msg.id",
        "const fn f(conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        &["cannot be applied to a `const fn`"],
    );
    assert_one_error(
        "id = msg.id, handler = \"h\"",
        "fn f<'a, 'async_trait>(&'a self, conn: &'a mut C, msg: &'a M) -> Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'async_trait>> { Box::pin(async move { Ok(()) }) }",
        &["cannot wrap a method rewritten by `#[async_trait]`"],
    );
    assert_one_error(
        "id = msg.id",
        "struct S;",
        &["applies to a function with a body"],
    );
}

#[test]
fn methods_need_an_explicit_handler_name() {
    let needs_name = "a method needs an explicit `handler = \"...\"`: the default scope (module path and function name) would be shared by a method of the same name on another type in this module, and the two would skip each other's messages";
    for item in [
        "fn f(&self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(&mut self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(self: Box<Self>, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(mut self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        "fn f(conn: &mut C, msg: &Self) -> Result<(), E> { Ok(()) }",
        "fn f(conn: &mut C, msg: &M) -> Result<Outcome<Self>, E> { todo!() }",
        "fn f(conn: &mut C, msg: &M) -> Result<(), Self::Error> { Ok(()) }",
        "fn f<T>(conn: &mut C, msg: &M) -> Result<(), E> where T: From<Self> { Ok(()) }",
        "fn f(conn: &mut C, msg: &M, other: ty!(Self)) -> Result<(), E> { Ok(()) }",
    ] {
        assert_one_error("id = msg.id", item, &[needs_name]);
        assert!(
            errors("id = msg.id, handler = \"billing.handle\"", item).is_empty(),
            "{item}"
        );
    }
    // `Self` in the body only is not a method's signature; the body is the user's.
    assert!(
        errors(
            "id = msg.id",
            "fn f(conn: &mut C, msg: &M) -> Result<(), E> { let _ = Self::X; Ok(()) }"
        )
        .is_empty()
    );
    // An invalid `handler = ...` is reported once, not also as missing.
    assert_one_error(
        "id = msg.id, handler = \"\"",
        "fn f(&self, conn: &mut C, msg: &M) -> Result<(), E> { Ok(()) }",
        &["the handler name is empty"],
    );
}
