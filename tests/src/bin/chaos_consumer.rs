//! One ledger consumer process of the chaos tests (`tests/brokers/`): the
//! consumer of `inbox_examples::brokers` (its handler, its broker decision,
//! its acks), with a probe that reports every step on stdout and can stop
//! at two places until told to go on, so that the test kills it exactly
//! there.
//!
//! ```text
//! chaos-consumer <rabbitmq|nats> <broker-url> <run> <prefetch> <database-url> <name>
//! ```
//!
//! `<run>` names the run's queues or streams (declared by the test);
//! `<prefetch>` is how many deliveries it works on at once (and its pool's
//! size);
//! `<database-url>` is the ledger's database (its `search_path` included);
//! `<name>` is the consumer's name, and the `application_name` of its
//! database connections.
//!
//! stdout, one event per line (`-` for a message without an id):
//!
//! ```text
//! ready                                  subscribed: deliveries may come
//! delivered <id> <0|1>                   a delivery; 1: the broker delivered it before
//! paused transaction <id>                stopped inside the handler's transaction
//! paused settle <id> <verdict>           stopped after the handler committed, before the ack
//! settled <id> <verdict> [unsettled]     told the broker (unsettled: telling it failed)
//! stopped                                stopped on `stop`, everything it held settled
//! ```
//!
//! `<verdict>` is `applied`, `duplicate`, `dead`, `dead-again`,
//! `unprocessable` or `retry` (see `Verdict::kind`).
//!
//! stdin, one command per line:
//!
//! ```text
//! pause transaction    stop the next handler inside its transaction (after the
//!                      balance update, before the ledger entry)
//! pause settle         stop the next delivery whose handler committed (applied, or
//!                      made the message dead), before the broker is told
//! resume               go on from the pause
//! stop                 stop taking deliveries, settle those held, exit 0
//! ```
//!
//! The end of stdin (the test is gone) ends the process at once.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use inbox_examples::brokers::delivery::{Probe, Received, Verdict};
use inbox_examples::brokers::ledger::LedgerDb;
use inbox_examples::brokers::nats::Nats;
use inbox_examples::brokers::rabbitmq::RabbitMq;
use inbox_examples::brokers::{BoxError, Broker, BrokerConfig};
use tokio::sync::{Notify, oneshot};

/// The claim wait of the consumer's handler and the delay before a copy
/// answered "in progress" is delivered again.
const IN_PROGRESS_PACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Where a consumer can be told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Inside the handler's transaction.
    Transaction,
    /// After the handler committed, before the broker is told.
    Settle,
}

/// The probe: prints events, and stops where it was asked to.
struct ChaosProbe {
    armed: Mutex<Option<Pause>>,
    resume: Notify,
}

impl ChaosProbe {
    fn arm(&self, pause: Pause) {
        *self.armed.lock().expect("not poisoned") = Some(pause);
    }

    /// Disarms `pause` if it is armed, and says whether it was.
    fn take(&self, pause: Pause) -> bool {
        let mut armed = self.armed.lock().expect("not poisoned");
        if *armed == Some(pause) {
            *armed = None;
            true
        } else {
            false
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn id_or_dash(id: Option<&str>) -> &str {
    id.unwrap_or("-")
}

impl Probe for ChaosProbe {
    fn ready(&self) {
        say("ready");
    }

    fn delivered(&self, delivery: &Received<'_>) {
        say(&format!(
            "delivered {} {}",
            id_or_dash(delivery.message_id),
            u8::from(delivery.redelivered)
        ));
    }

    async fn in_transaction(&self, message_id: &str) {
        if self.take(Pause::Transaction) {
            say(&format!("paused transaction {message_id}"));
            self.resume.notified().await;
        }
    }

    async fn before_settle(&self, message_id: Option<&str>, verdict: &Verdict) {
        if verdict.committed() && self.take(Pause::Settle) {
            say(&format!(
                "paused settle {} {}",
                id_or_dash(message_id),
                verdict.kind()
            ));
            self.resume.notified().await;
        }
    }

    fn settled(&self, message_id: Option<&str>, verdict: &Verdict, told: Result<(), &str>) {
        let unsettled = if told.is_err() { " unsettled" } else { "" };
        say(&format!(
            "settled {} {}{unsettled}",
            id_or_dash(message_id),
            verdict.kind()
        ));
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [broker, url, run, prefetch, database_url, name] = args.as_slice() else {
        eprintln!(
            "usage: chaos-consumer <rabbitmq|nats> <broker-url> <run> <prefetch> <database-url> <name>"
        );
        return ExitCode::from(2);
    };
    let Ok(prefetch) = prefetch.parse() else {
        eprintln!("chaos-consumer: prefetch {prefetch:?} is not a number");
        return ExitCode::from(2);
    };
    // A copy of a slow payment waits for its first delivery this long,
    // then comes back after as long again: short, so the chaos run's storms
    // settle within its limit.
    inbox_runtime::set_default_claim_wait(inbox_runtime::ClaimWait::Bounded(IN_PROGRESS_PACE));
    let config = BrokerConfig {
        prefetch,
        in_progress_delay: IN_PROGRESS_PACE,
        ..BrokerConfig::new(url.as_str(), run.as_str())
    };
    let db = LedgerDb::new(database_url.as_str());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let served = runtime.block_on(async {
        match broker.as_str() {
            "rabbitmq" => serve::<RabbitMq>(&config, &db, name).await,
            "nats" => serve::<Nats>(&config, &db, name).await,
            other => Err(format!("unknown broker {other}").into()),
        }
    });
    match served {
        Ok(()) => {
            say("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("chaos-consumer {name}: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve<B: Broker>(
    config: &BrokerConfig,
    db: &LedgerDb,
    name: &str,
) -> Result<(), BoxError> {
    let probe = Arc::new(ChaosProbe {
        armed: Mutex::new(None),
        resume: Notify::new(),
    });
    let broker = B::connect(config).await?;
    let pool = db.pool(name, usize::from(config.prefetch))?;
    let (stop, stopped) = oneshot::channel();
    let commands = Arc::clone(&probe);
    std::thread::spawn(move || read_commands(&commands, stop));
    broker
        .consume(name, &pool, &*probe, async {
            let _ = stopped.await;
        })
        .await?;
    broker.close().await
}

/// Reads stdin's commands until `stop`, then until its end, which ends the
/// process.
fn read_commands(probe: &ChaosProbe, stop: oneshot::Sender<()>) {
    let mut stop = Some(stop);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "pause transaction" => probe.arm(Pause::Transaction),
            "pause settle" => probe.arm(Pause::Settle),
            // `notify_one` keeps the wake-up if the pause is not waiting yet.
            "resume" => probe.resume.notify_one(),
            "stop" => {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
            }
            other => eprintln!("chaos-consumer: unknown command {other:?}"),
        }
    }
    std::process::exit(0);
}
