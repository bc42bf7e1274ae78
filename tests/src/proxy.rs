//! A TCP proxy in front of one server (a database or a broker) that a test
//! can fault for itself alone, while the other tests keep using the shared
//! server directly:
//!
//! - [`Proxy::down`]: every open connection is cut and new ones are refused
//!   until [`Proxy::up`], as when the server restarts;
//! - [`Proxy::stall`]: the open connections stay open but carry nothing
//!   more either way, while new connections work, as when a peer hangs or
//!   a connection's path dies without a reset.
//!
//! It also counts round trips, as [`Proxy::flights`]: what a client sends
//! before the server next answers (its pipelined messages included) is one
//! flight. And [`Proxy::corrupt_next`] changes bytes of one message on its
//! way to the server, as a fault the server then refuses.
//!
//! ```no_run
//! use inbox_tests::proxy::Proxy;
//!
//! let (template, upstream) = Proxy::split_url("amqp://guest:guest@127.0.0.1:5672/%2f", 5672);
//! let proxy = Proxy::start(&upstream);
//! let url = proxy.url(&template);
//! // ... connect through `url`, then:
//! proxy.stall();
//! # let _ = url;
//! ```

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// A proxy on a free local port; see the [module](self).
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<thread::JoinHandle<()>>,
}

struct Shared {
    upstream: String,
    up: AtomicBool,
    closing: AtomicBool,
    /// How many connections were accepted so far.
    accepted: AtomicU64,
    /// Connections numbered below this carry nothing more.
    stalled_below: AtomicU64,
    /// Client→server flights so far, over every connection.
    flights: AtomicU64,
    /// Bytes to replace, once, in what a client sends next.
    corruption: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    /// Both ends of every proxied connection, to cut them.
    streams: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn cut_all(&self) {
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Makes the corruption [`Proxy::corrupt_next`] asked for in `chunk`,
    /// if it holds the bytes to replace.
    fn corrupt(&self, chunk: &mut [u8]) {
        let mut corruption = self.corruption.lock().unwrap();
        let Some((from, to)) = corruption.as_ref() else {
            return;
        };
        if let Some(at) = chunk.windows(from.len()).position(|window| window == from) {
            chunk[at..at + to.len()].copy_from_slice(to);
            *corruption = None;
        }
    }

    /// Whether connection `number` is stalled (and the proxy still runs).
    fn stalls(&self, number: u64) -> bool {
        number < self.stalled_below.load(Ordering::SeqCst)
            && !self.closing.load(Ordering::SeqCst)
            && self.up.load(Ordering::SeqCst)
    }
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free local port.
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream: upstream.to_owned(),
            up: AtomicBool::new(true),
            closing: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            stalled_below: AtomicU64::new(0),
            flights: AtomicU64::new(0),
            corruption: Mutex::new(None),
            streams: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let acceptor = thread::spawn(move || {
            for client in listener.incoming() {
                if accept_shared.closing.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                // "Down": accept and drop at once, like a server going away.
                if !accept_shared.up.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let number = accept_shared.accepted.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&accept_shared.upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let Err(error) = splice(&accept_shared, number, client, server) {
                    eprintln!("proxy: {error}");
                }
            }
        });
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// `url` with its `host:port` replaced by a placeholder for the proxy's,
    /// and the original `host:port` (for [`Proxy::start`]).
    pub fn split_url(url: &str, default_port: u16) -> (String, String) {
        let scheme_end = url.find("://").expect("a URL with a scheme") + 3;
        let rest = &url[scheme_end..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        let host_start = authority.rfind('@').map_or(0, |at| at + 1);
        let host = &authority[host_start..];
        let upstream = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:{default_port}")
        };
        let prefix = &url[..scheme_end + host_start];
        let suffix = &rest[authority_end..];
        (format!("{prefix}{{proxy}}{suffix}"), upstream)
    }

    /// The URL template from [`Proxy::split_url`] pointed at this proxy.
    pub fn url(&self, template: &str) -> String {
        template.replace("{proxy}", &format!("127.0.0.1:{}", self.port))
    }

    /// Cuts every connection and refuses new ones until [`Proxy::up`].
    pub fn down(&self) {
        self.shared.up.store(false, Ordering::SeqCst);
        self.shared.cut_all();
    }

    /// Accepts connections again.
    pub fn up(&self) {
        self.shared.up.store(true, Ordering::SeqCst);
    }

    /// How many connections the proxy has taken while up.
    pub fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Round trips so far, over every connection: client→server flights,
    /// each begun by the first read from the client after the server sent
    /// something (or the connection's first). Messages a client pipelines
    /// (written before the answer to the first came back) are one flight.
    pub fn flights(&self) -> u64 {
        self.shared.flights.load(Ordering::SeqCst)
    }

    /// Replaces the first `from` in the next chunk a client sends that
    /// contains it with `to`, of the same length (so the protocol's framing
    /// stays intact), once: the server receives the message corrupted.
    pub fn corrupt_next(&self, from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len(), "a corruption keeps the length");
        *self.shared.corruption.lock().unwrap() = Some((from.to_vec(), to.to_vec()));
    }

    /// Whether a corruption asked for by [`corrupt_next`](Self::corrupt_next)
    /// is still to be made.
    pub fn corruption_pending(&self) -> bool {
        self.shared.corruption.lock().unwrap().is_some()
    }

    /// Stalls every connection taken so far: nothing more goes through it
    /// either way (what it read is never delivered), and it stays open
    /// until [`Proxy::down`] or the proxy's end. New connections work.
    pub fn stall(&self) {
        let accepted = self.shared.accepted.load(Ordering::SeqCst);
        self.shared.stalled_below.store(accepted, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.cut_all();
        // Wake the acceptor so it sees `closing`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Copies bytes both ways on two threads; either side closing closes both.
fn splice(
    shared: &Arc<Shared>,
    number: u64,
    client: TcpStream,
    server: TcpStream,
) -> io::Result<()> {
    {
        let mut streams = shared.streams.lock().unwrap();
        streams.push(client.try_clone()?);
        streams.push(server.try_clone()?);
    }
    // Whether the server sent something since the client's last read: the
    // client's next read starts a new flight.
    let answered = Arc::new(AtomicBool::new(true));
    let directions = [
        (client.try_clone()?, server.try_clone()?, Direction::Asks),
        (server, client, Direction::Answers),
    ];
    for (from, to, direction) in directions {
        let shared = Arc::clone(shared);
        let answered = Arc::clone(&answered);
        thread::spawn(move || {
            let read = |shared: &Shared, chunk: &mut [u8]| match direction {
                Direction::Asks => {
                    if answered.swap(false, Ordering::SeqCst) {
                        shared.flights.fetch_add(1, Ordering::SeqCst);
                    }
                    shared.corrupt(chunk);
                }
                Direction::Answers => answered.store(true, Ordering::SeqCst),
            };
            pump(&shared, number, from, to, read)
        });
    }
    Ok(())
}

/// Which way a pump copies.
#[derive(Clone, Copy)]
enum Direction {
    /// Client to server.
    Asks,
    /// Server to client.
    Answers,
}

/// Copies `from` to `to` until either closes, passing each chunk read to
/// `read` before it goes on; once connection `number` is stalled, holds
/// what it read until the connection is cut, never delivering it. Then
/// closes both.
fn pump(
    shared: &Shared,
    number: u64,
    mut from: TcpStream,
    mut to: TcpStream,
    read: impl Fn(&Shared, &mut [u8]),
) {
    let mut buffer = [0; 16 * 1024];
    while let Ok(bytes @ 1..) = from.read(&mut buffer) {
        read(shared, &mut buffer[..bytes]);
        if shared.stalls(number) {
            while shared.stalls(number) {
                thread::sleep(Duration::from_millis(10));
            }
            break;
        }
        if shared.closing.load(Ordering::SeqCst) || to.write_all(&buffer[..bytes]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::Proxy;

    #[test]
    fn split_url_keeps_everything_but_the_address() {
        let (template, upstream) =
            Proxy::split_url("postgres://postgres@127.0.0.1:5432/test?options=-c", 5432);
        assert_eq!(template, "postgres://postgres@{proxy}/test?options=-c");
        assert_eq!(upstream, "127.0.0.1:5432");
        let (template, upstream) = Proxy::split_url("mysql://root@localhost/db", 3306);
        assert_eq!(template, "mysql://root@{proxy}/db");
        assert_eq!(upstream, "localhost:3306");
    }
}
