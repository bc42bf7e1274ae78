//! Refuses ids read from broker fields that change between deliveries of the
//! same message.
//!
//! [`id_root`](super::id_root) checks that the id is read from a handler
//! parameter; this check is about *which* part of it. A broker delivery
//! carries the producer's message plus data about this one delivery: an AMQP
//! delivery tag, a JetStream consumer sequence, a delivery count, the time
//! it was received, the handle used to acknowledge it. Those change when the
//! message is redelivered, so an id built from them makes every redelivery
//! look new and the handler processes it again.
//!
//! The id expression is refused when it *ends* in such a name: after
//! stripping what keeps the value as it is (`&`, `*`, parentheses, casts,
//! `?`, and conversions such as `.to_string()`, `.clone()`, `.unwrap()`),
//! the last field or argument-less method call is one of [`PER_DELIVERY`]
//! (`delivery.delivery_tag`, `msg.info()?.consumer_sequence`,
//! `msg.delivery_count().to_string()`). Each argument of a `format!` is
//! checked the same way, since one changing part changes the whole id.
//!
//! The list holds names that mean per-delivery data in the broker clients,
//! and are unlikely to name a producer's field:
//!
//! - AMQP (lapin, amqprs): `delivery_tag`, `redelivered`;
//! - JetStream (async-nats): `consumer_sequence`, and `delivered` when read
//!   from the message's `info()` (there it counts deliveries; on its own,
//!   `delivered` may be an application's field);
//! - delivery counts: `delivery_count` (Azure Service Bus, RabbitMQ's
//!   `x-delivery-count`), `redelivery_count`, `num_delivered`,
//!   `delivery_attempt` (Google Pub/Sub), `receive_count` and
//!   `approximate_receive_count` (SQS's `ApproximateReceiveCount`);
//! - receive times: `received_at`, `receive_time`, `received_time`,
//!   `receive_timestamp`, `received_timestamp` (an application may have a
//!   field of such a name, so the error says the name "reads as" a receive
//!   time; a time is a poor id either way, since two messages can share it);
//! - acknowledgement handles: `receipt_handle` (SQS), `lock_token` (Azure
//!   Service Bus), `ack_id` (Google Pub/Sub).
//!
//! Deliberately not refused, because they are the same on every delivery
//! of a message or may be an application's own field: `timestamp` (the AMQP
//! `timestamp` property and a Kafka record's timestamp are set when the
//! message is produced or appended, not when it is delivered), JetStream's
//! `stream_sequence` and `published`, Kafka's `offset` and `partition` (the
//! same on every delivery of a record; the guide says when a record's
//! position is still the wrong id), and
//! `attempt`, `attempts` or `retry_count`, which may number the producer's
//! own attempts at a business operation.

use proc_macro2::Ident;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprMacro, Lit, Member, Token, UnOp};

use super::Subject;
use super::id_root::is_format;
use crate::errors::Errors;
use crate::render::code;

/// The producer's own id, in the words of each broker: what to use instead.
const PRODUCER_ID: &str = "the id the producer set on the message: the AMQP `message_id` \
    property (with lapin: `delivery.properties.message_id()`), the JetStream `Nats-Msg-Id` \
    header, or a header or attribute the producer sets (Kafka, SQS)";

/// The AMQP `message_id` property, for AMQP's fields.
const AMQP_MESSAGE_ID: &str = "the `message_id` property the producer sets (with lapin: \
    `delivery.properties.message_id()`)";

/// The producer's id on SQS, for SQS's fields.
const SQS_ID: &str = "a message attribute holding the producer's id, or the FIFO queue's \
    `MessageDeduplicationId`";

/// The JetStream `Nats-Msg-Id` header, for JetStream's fields.
const NATS_MSG_ID: &str = "the `Nats-Msg-Id` header the publisher sets (with async-nats: \
    `message.headers.as_ref().and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))`)";

/// Names that mean per-delivery data: what they are, and what to use
/// instead.
struct PerDelivery {
    /// The field or method names.
    names: &'static [&'static str],
    /// What it is, completing "`expr` ..." ("is ...", or "reads as ..." for
    /// names an application might also use).
    what: &'static str,
    /// The stable id to use instead.
    instead: &'static str,
}

/// Every refused name except `delivered` (see [`JETSTREAM_DELIVERED`]).
const PER_DELIVERY: &[PerDelivery] = &[
    PerDelivery {
        names: &["delivery_tag"],
        what: "is the AMQP delivery tag, which the broker assigns anew to each delivery",
        instead: AMQP_MESSAGE_ID,
    },
    PerDelivery {
        names: &["redelivered"],
        what: "is the AMQP redelivered flag, which is false on the first delivery and true on \
               later ones",
        instead: AMQP_MESSAGE_ID,
    },
    PerDelivery {
        names: &["consumer_sequence"],
        what: "is the JetStream consumer sequence, which grows with every delivery, \
               redeliveries included",
        instead: NATS_MSG_ID,
    },
    PerDelivery {
        names: &["delivery_count", "num_delivered"],
        what: "is a delivery count, which grows with every redelivery",
        instead: PRODUCER_ID,
    },
    PerDelivery {
        names: &["redelivery_count"],
        what: "is a redelivery count, which grows with every redelivery",
        instead: PRODUCER_ID,
    },
    PerDelivery {
        names: &["delivery_attempt"],
        what: "is the delivery attempt number, which grows with every redelivery",
        instead: PRODUCER_ID,
    },
    PerDelivery {
        names: &["receive_count"],
        what: "is a receive count, which grows with every receive",
        instead: PRODUCER_ID,
    },
    PerDelivery {
        names: &["approximate_receive_count"],
        what: "is the SQS receive count, which grows with every receive",
        instead: SQS_ID,
    },
    PerDelivery {
        names: &[
            "received_at",
            "receive_time",
            "received_time",
            "receive_timestamp",
            "received_timestamp",
        ],
        what: "reads as the time this delivery was received, which differs between deliveries",
        instead: PRODUCER_ID,
    },
    PerDelivery {
        names: &["receipt_handle"],
        what: "is the SQS receipt handle, which is new on every receive of the message",
        instead: SQS_ID,
    },
    PerDelivery {
        names: &["lock_token"],
        what: "is the Azure Service Bus lock token, which is new on every delivery of the message",
        instead: "the `message_id` the sending application sets",
    },
    PerDelivery {
        names: &["ack_id"],
        what: "is the Google Pub/Sub ack id, which is new on every delivery of the message",
        instead: "an attribute holding the producer's id",
    },
];

/// `delivered`, refused only when read from a JetStream message's `info()`.
const JETSTREAM_DELIVERED: PerDelivery = PerDelivery {
    names: &["delivered"],
    what: "is the JetStream delivery count, which grows with every redelivery",
    instead: NATS_MSG_ID,
};

/// Method calls that keep the value they are called on: the id still ends
/// in what they are called on.
const KEEPS_VALUE: &[&str] = &[
    "to_string",
    "to_owned",
    "clone",
    "cloned",
    "copied",
    "as_str",
    "as_ref",
    "as_deref",
    "as_bytes",
    "to_vec",
    "borrow",
    "into",
    "unwrap",
    "expect",
    "unwrap_or_default",
];

/// Records an error if `id` (or an argument of it, when it is `format!`)
/// ends in a name that changes per delivery.
pub(crate) fn check(id: &Expr, subject: Subject, errors: &mut Errors) {
    match value_of(id) {
        Expr::Macro(mac) if is_format(mac) => {
            for arg in format_args(mac) {
                let value = match &arg {
                    Expr::Assign(assign) => &*assign.right,
                    other => other,
                };
                check_one(value, subject, errors);
            }
        }
        _ => check_one(id, subject, errors),
    }
}

/// Checks one expression (not a `format!`).
fn check_one(expr: &Expr, subject: Subject, errors: &mut Errors) {
    let end = value_of(expr);
    let Some((name, base)) = last_name(end) else {
        return;
    };
    let found = PER_DELIVERY
        .iter()
        .find(|entry| entry.names.iter().any(|refused| name == refused))
        .or_else(|| (name == "delivered" && read_from_info(base)).then_some(&JETSTREAM_DELIVERED));
    if let Some(entry) = found {
        let instead = match subject {
            Subject::Id => entry.instead,
            Subject::Fingerprint => "the message's payload (its body) instead",
        };
        errors.push(syn::Error::new_spanned(
            end,
            format!(
                "{}: `{}` {}, {}; use {instead}",
                subject.stable_prefix(),
                code(end),
                entry.what,
                subject.if_per_delivery(),
            ),
        ));
    }
}

/// `expr` without what keeps its value: `&`, `*`, parentheses, casts, `?`
/// and [`KEEPS_VALUE`] calls.
fn value_of(expr: &Expr) -> &Expr {
    match expr {
        Expr::Reference(reference) => value_of(&reference.expr),
        Expr::Unary(unary) if matches!(unary.op, UnOp::Deref(_)) => value_of(&unary.expr),
        Expr::Paren(paren) => value_of(&paren.expr),
        Expr::Group(group) => value_of(&group.expr),
        Expr::Cast(cast) => value_of(&cast.expr),
        Expr::Try(try_expr) => value_of(&try_expr.expr),
        Expr::MethodCall(call) if KEEPS_VALUE.iter().any(|name| call.method == name) => {
            value_of(&call.receiver)
        }
        other => other,
    }
}

/// The name `expr` ends in, and what it is read from: a named field, or a
/// method called without arguments.
fn last_name(expr: &Expr) -> Option<(&Ident, &Expr)> {
    match expr {
        Expr::Field(field) => match &field.member {
            Member::Named(name) => Some((name, &field.base)),
            Member::Unnamed(_) => None,
        },
        Expr::MethodCall(call) if call.args.is_empty() => Some((&call.method, &call.receiver)),
        _ => None,
    }
}

/// Whether `base` is a JetStream message's `info()` (`msg.info()?`,
/// `msg.info().unwrap()`) or a binding named `info`.
fn read_from_info(base: &Expr) -> bool {
    match value_of(base) {
        Expr::MethodCall(call) => call.method == "info",
        Expr::Path(path) => path.path.is_ident("info"),
        Expr::Field(field) => matches!(&field.member, Member::Named(name) if name == "info"),
        _ => false,
    }
}

/// The arguments of `format!(fmt, args..)`, without the format string; none
/// if it does not parse (the root check reports that).
fn format_args(mac: &ExprMacro) -> Vec<Expr> {
    let Ok(args) = mac
        .mac
        .parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated)
    else {
        return Vec::new();
    };
    let mut args: Vec<Expr> = args.into_iter().collect();
    if matches!(args.first(), Some(Expr::Lit(lit)) if matches!(lit.lit, Lit::Str(_))) {
        args.remove(0);
    }
    args
}
