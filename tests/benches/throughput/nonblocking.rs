//! The async configurations: diesel-async connections, each delivering
//! on a tokio task of its own.

use std::time::{Duration, Instant};

use diesel_async::RunQueryDsl;
use inbox_runtime::{
    ClaimStatement, HandlerName, Outcome, run_idempotent_async, run_idempotent_batch_async,
    run_idempotent_batch_bulk_async,
};

use crate::connections::AsyncBenchConnection;
use crate::proxy::Proxy;
use crate::servers::{Server, counted_deliveries, session_sql};
use crate::{
    Config, HANDLER, REDELIVERED, RoundTrips, Sample, Variant, fresh_ids, key, print_table, rounds,
    title,
};
use diesel::QueryResult;

/// One delivering diesel-async connection.
pub struct AsyncWorker<C> {
    conn: C,
    account: i64,
    handler: HandlerName,
    redeliver: Vec<u64>,
    next_redelivery: usize,
}

impl<C: AsyncBenchConnection> AsyncWorker<C> {
    async fn new(mut conn: C, account: i64) -> Self {
        let handler = HandlerName::new(HANDLER).expect("a valid handler name");
        let first = fresh_ids(REDELIVERED);
        let redeliver: Vec<u64> = (first..first + REDELIVERED as u64).collect();
        for &id in &redeliver {
            run_idempotent_async(&mut conn, key(&handler, id), async |conn: &mut C| {
                conn.effect(account).await.map(drop)
            })
            .await
            .expect("claim an id to redeliver");
        }
        AsyncWorker {
            conn,
            account,
            handler,
            redeliver,
            next_redelivery: 0,
        }
    }

    async fn deliver(&mut self, variant: Variant) {
        let variant = match (variant, C::GUARD) {
            (Variant::ClaimGuarded | Variant::Guard(_), None) => Variant::ClaimCached,
            (variant, _) => variant,
        };
        let account = self.account;
        let handler = &self.handler;
        match variant {
            Variant::NoDedup => {
                self.conn
                    .transaction(async |conn| conn.effect(account).await)
                    .await
                    .expect("no-dedup");
            }
            Variant::ClaimCached => {
                let key = key(handler, fresh_ids(1));
                let key = &key;
                self.conn
                    .transaction(async |conn| {
                        if ClaimStatement::new(key).execute(conn).await? == 1 {
                            conn.effect(account).await?;
                        }
                        QueryResult::Ok(())
                    })
                    .await
                    .expect("claim-cached");
            }
            Variant::ClaimGuarded => {
                let Some([begin, commit, rollback]) = C::GUARD else {
                    unreachable!("claim-guarded is claim-cached without a guard")
                };
                let key = key(handler, fresh_ids(1));
                let conn = &mut self.conn;
                conn.batch_execute(begin)
                    .await
                    .expect("claim-guarded: begin");
                let done: QueryResult<()> = async {
                    if ClaimStatement::new(&key).execute(conn).await? == 1 {
                        conn.effect(account).await?;
                    }
                    Ok(())
                }
                .await;
                match done {
                    Ok(()) => conn
                        .batch_execute(commit)
                        .await
                        .expect("claim-guarded: commit"),
                    Err(error) => {
                        let _ = conn.batch_execute(rollback).await;
                        panic!("claim-guarded: {error}");
                    }
                }
            }
            Variant::Guard(shape) => {
                let id = fresh_ids(1).to_string();
                let (begin, commit) = shape.texts(handler.as_str(), &id);
                let conn = &mut self.conn;
                conn.batch_execute(&begin).await.expect("guard: begin");
                conn.effect(account).await.expect("guard: effect");
                conn.batch_execute(&commit).await.expect("guard: commit");
            }
            Variant::ClaimUncached => {
                let id = fresh_ids(1).to_string();
                let (handler, id) = (handler.as_str(), id.as_str());
                self.conn
                    .transaction(async |conn| {
                        if conn.claim_uncached(handler, id).await? == 1 {
                            conn.effect(account).await?;
                        }
                        QueryResult::Ok(())
                    })
                    .await
                    .expect("claim-uncached");
            }
            Variant::Handler => {
                let outcome = self.conn.handle(fresh_ids(1), account).await;
                assert_eq!(outcome.expect("handler"), Outcome::Processed(()));
            }
            Variant::Duplicate => {
                let id = self.redeliver[self.next_redelivery % self.redeliver.len()];
                self.next_redelivery += 1;
                let outcome = self.conn.handle(id, account).await;
                assert_eq!(outcome.expect("duplicate"), Outcome::Duplicate);
            }
            Variant::Batch(size) => {
                let first = fresh_ids(size);
                let ids: Vec<u64> = (first..first + size as u64).collect();
                let report = run_idempotent_batch_async(
                    &mut self.conn,
                    handler,
                    &ids,
                    |id| id,
                    async move |conn: &mut C, _id: &u64| conn.effect(account).await,
                )
                .await;
                if let Some(Err(error)) = report.results().iter().find(|result| result.is_err()) {
                    panic!("a batch delivery failed: {error}");
                }
            }
            Variant::Bulk(size) => {
                let first = fresh_ids(size);
                let ids: Vec<u64> = (first..first + size as u64).collect();
                let report = run_idempotent_batch_bulk_async(
                    &mut self.conn,
                    handler,
                    &ids,
                    |id| id,
                    async move |conn: &mut C, new: &[&u64]| {
                        conn.effect_by(account, new.len() as i64).await.map(drop)
                    },
                )
                .await;
                if let Some(Err(error)) = report.results().iter().find(|result| result.is_err()) {
                    panic!("a bulk batch delivery failed: {error}");
                }
            }
            Variant::Outbox | Variant::OutboxKeyed => {
                let message = crate::outbox::bench_message(variant, account);
                let outcome = self.conn.announce(fresh_ids(1), account, &message).await;
                assert_eq!(outcome.expect("outbox"), Outcome::Processed(()));
            }
            payload => unreachable!("{}: filtered out in `run`", payload.name()),
        }
    }

    async fn run(&mut self, variant: Variant, length: Duration) -> Sample {
        let mut sample = Sample::starting();
        let deadline = sample.start + length;
        loop {
            let before = Instant::now();
            self.deliver(variant).await;
            let after = Instant::now();
            sample.record(before, after, variant.size());
            if after >= deadline {
                return sample;
            }
        }
    }
}

/// One slice of `variant` on every worker at once, each a task of its
/// own.
async fn slice<C: AsyncBenchConnection>(
    workers: &mut Vec<AsyncWorker<C>>,
    variant: Variant,
    length: Duration,
) -> Sample {
    let tasks: Vec<_> = workers
        .drain(..)
        .map(|mut worker| {
            tokio::spawn(async move {
                let sample = worker.run(variant, length).await;
                (worker, sample)
            })
        })
        .collect();
    let mut samples = Vec::new();
    for task in tasks {
        let (worker, sample) = task.await.expect("a worker task");
        workers.push(worker);
        samples.push(sample);
    }
    Sample::merge(samples)
}

async fn connect<C: AsyncBenchConnection>(url: &str, session_sql: Option<&str>) -> C {
    let mut conn = C::establish(url).await.expect("connect (async)");
    if let Some(sql) = session_sql {
        conn.batch_execute(sql)
            .await
            .expect("configure the session");
    }
    conn
}

/// The async configurations, their connections to `url` (the server's, or
/// the network proxy's).
pub fn run<B: Server>(name: &str, config: &Config, url: &str, proxy: Option<&(Proxy, String)>) {
    let runtime = inbox_tests::runtime::multi_thread(
        std::thread::available_parallelism().map_or(2, |n| n.get()),
    );
    // The payload and outbox variants run on blocking connections only.
    let variants: &Vec<Variant> = &config
        .variants
        .iter()
        .copied()
        .filter(|variant| !variant.blocking_only())
        .collect();
    let session = session_sql::<B>(config);
    let url = B::async_tcp_url(url);
    let trips = proxy.map(|(proxy, proxied)| {
        runtime.block_on(async {
            let conn: B::Async = connect(&B::async_tcp_url(proxied), session).await;
            let mut worker = AsyncWorker::new(conn, 0).await;
            let mut trips = RoundTrips::new();
            for &variant in variants {
                worker.deliver(variant).await;
                worker.deliver(variant).await;
                let deliveries = counted_deliveries(variant);
                let before = proxy.flights();
                for _ in 0..deliveries {
                    worker.deliver(variant).await;
                }
                let flights = (proxy.flights() - before) as f64;
                trips.insert(
                    variant,
                    (
                        flights / deliveries as f64,
                        flights / (deliveries * variant.size()) as f64,
                    ),
                );
            }
            trips
        })
    });
    for &connections in &config.connections {
        let mut workers: Vec<AsyncWorker<B::Async>> = runtime.block_on(async {
            let mut workers = Vec::new();
            for account in 0..connections {
                let conn = connect(&url, session).await;
                workers.push(AsyncWorker::new(conn, account as i64).await);
            }
            workers
        });
        let mut measured = rounds(config, variants, |variant, length| {
            runtime.block_on(slice(&mut workers, variant, length))
        });
        print_table(
            &title(name, "async", connections),
            &mut measured,
            if connections == 1 {
                trips.as_ref()
            } else {
                None
            },
        );
    }
}
