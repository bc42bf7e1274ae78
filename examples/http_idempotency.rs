//! An HTTP service whose `POST /payments` honours `Idempotency-Key`, on
//! PostgreSQL (`inbox_examples::http` has the design and the behaviour
//! table):
//!
//! ```text
//! cargo run --example http_idempotency --features http            # port 3000
//! cargo run --example http_idempotency --features http -- 8080    # or PORT=8080
//! ```
//!
//! Needs PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); its tables (the inbox's and
//! `http_payments`) go in schema `http_idempotency_example`, created if
//! missing (`HTTP_EXAMPLE_SCHEMA` names another). It listens on 127.0.0.1
//! until Ctrl-C. Try it:
//!
//! ```text
//! curl -i -X POST localhost:3000/payments -H 'Idempotency-Key: 4f1c…' \
//!      -d '{"account":"acc-1","amount_cents":250,"currency":"EUR"}'   # 201
//! # the same command again: the same 201 and body, with Idempotent-Replayed: true
//! # the same key with "amount_cents":251: 422; without the header: 400
//! ```

use std::process::ExitCode;

use inbox_examples::http::{BoxError, Config, PaymentsService};

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const DEFAULT_PORT: u16 = 3000;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("http_idempotency: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let port = match std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PORT").ok())
    {
        Some(port) => port
            .parse::<u16>()
            .map_err(|error| format!("port {port:?}: {error}"))?,
        None => DEFAULT_PORT,
    };
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let mut config = Config::new(url);
    config.schema = Some(
        std::env::var("HTTP_EXAMPLE_SCHEMA")
            .unwrap_or_else(|_| "http_idempotency_example".to_owned()),
    );
    let service = PaymentsService::new(&config)?;
    let setup = service.clone();
    tokio::task::spawn_blocking(move || setup.setup()).await??;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "POST http://{}/payments (Idempotency-Key required); schema {}; a retry waits up to {:?} \
         for a request in flight; Ctrl-C stops",
        listener.local_addr()?,
        config.schema.as_deref().unwrap_or_default(),
        config.claim_wait,
    );
    inbox_examples::http::server::serve(listener, service.router(), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
