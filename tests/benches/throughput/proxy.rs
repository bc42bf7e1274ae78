//! A loopback TCP proxy that counts round trips: the bench's server
//! connections for the round-trip pass go through it. With a delay, it also
//! stands for a network: every chunk of bytes, either way, is forwarded that
//! long after it arrived (the throughput rounds of
//! `INBOX_BENCH_NETWORK_DELAY_US`).
//!
//! Per proxied connection, one thread per direction (two with a delay: one
//! reads, one forwards each chunk when its time comes, so chunks in flight
//! together are delayed together, not one after another). A *flight* is
//! what the client writes before the server answers: a read from the client
//! socket that follows data the server sent (or that is the connection's
//! first) starts a new flight. Statements the client pipelines without
//! waiting (a MariaDB `COM_STMT_CLOSE`, which has no reply, written before
//! the next command; tokio-postgres' pipelined messages) count as the one
//! flight they travel in, which is what a round trip costs: one wait for
//! the network and the server.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

pub struct Proxy {
    port: u16,
    flights: Arc<AtomicU64>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free port of 127.0.0.1,
    /// forwarding every chunk `delay` after it arrived, either way (zero:
    /// at once; otherwise a round trip costs at least twice `delay` more).
    /// Its threads end with the connections they serve; the acceptor lives
    /// as long as the process.
    pub fn delaying(upstream: &str, delay: Duration) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let flights = Arc::new(AtomicU64::new(0));
        let upstream = upstream.to_owned();
        let counter = Arc::clone(&flights);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let _ = splice(client, server, Arc::clone(&counter), delay);
            }
        });
        Ok(Proxy { port, flights })
    }

    /// Client→server flights so far, over every connection.
    pub fn flights(&self) -> u64 {
        self.flights.load(Ordering::SeqCst)
    }

    /// A proxy in front of the server `url` names, and `url` pointed at
    /// it (`scheme://[user[:password]@]host[:port]/…`, `default_port` when
    /// it names none).
    pub fn in_front_of(url: &str, default_port: u16) -> std::io::Result<(Proxy, String)> {
        Proxy::delaying_in_front_of(url, default_port, Duration::ZERO)
    }

    /// [`in_front_of`](Self::in_front_of), with [`delaying`](Self::delaying)'s delay.
    pub fn delaying_in_front_of(
        url: &str,
        default_port: u16,
        delay: Duration,
    ) -> std::io::Result<(Proxy, String)> {
        let (template, upstream) = inbox_tests::proxy::Proxy::split_url(url, default_port);
        let proxy = Proxy::delaying(&upstream, delay)?;
        let proxied = template.replace("{proxy}", &format!("127.0.0.1:{}", proxy.port));
        Ok((proxy, proxied))
    }
}

/// Copies both ways between `client` and `server`, each chunk `delay`
/// after it arrived, counting the client's flights into `flights`.
fn splice(
    client: TcpStream,
    server: TcpStream,
    flights: Arc<AtomicU64>,
    delay: Duration,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    // Whether the server has spoken since the client's last write: the
    // client's next read starts a new flight. The connection's first write
    // is a flight too.
    let server_spoke = Arc::new(AtomicBool::new(true));
    let spoke = Arc::clone(&server_spoke);
    let (client_in, server_out) = (client.try_clone()?, server.try_clone()?);
    forward(client_in, server_out, delay, move || {
        if spoke.swap(false, Ordering::SeqCst) {
            flights.fetch_add(1, Ordering::SeqCst);
        }
    });
    // Marked before the client can see the data: its answer must find the
    // mark set.
    forward(server, client, delay, move || {
        server_spoke.store(true, Ordering::SeqCst)
    });
    Ok(())
}

/// Copies from `from` to `to` until either end closes, calling `arrived`
/// for each chunk read, and writing it `delay` after it arrived.
fn forward(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    arrived: impl Fn() + Send + 'static,
) {
    if delay.is_zero() {
        thread::spawn(move || {
            read_chunks(&mut from, &arrived, |bytes| to.write_all(bytes).is_ok());
            let _ = to.shutdown(Shutdown::Write);
        });
        return;
    }
    let (sender, chunks) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        read_chunks(&mut from, &arrived, |bytes| {
            sender
                .send((Instant::now() + delay, bytes.to_vec()))
                .is_ok()
        })
    });
    thread::spawn(move || {
        for (due, bytes) in chunks {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Reads `from` until it closes or `chunk` refuses a chunk, calling
/// `arrived` before handing each chunk on.
fn read_chunks(from: &mut TcpStream, arrived: &impl Fn(), mut chunk: impl FnMut(&[u8]) -> bool) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        arrived();
        if !chunk(&buf[..n]) {
            break;
        }
    }
}
