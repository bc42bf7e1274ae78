//! A TCP proxy in front of a database server that a test can "restart":
//! every open connection is cut and new ones are refused until it comes
//! back. This simulates a database restart for one test only, so tests keep
//! running in parallel against the shared servers.

#![allow(dead_code)]

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<thread::JoinHandle<()>>,
}

struct Shared {
    upstream: String,
    up: AtomicBool,
    closing: AtomicBool,
    /// Both ends of every proxied connection, to cut them.
    streams: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn cut_all(&self) {
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
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
                let Ok(server) = TcpStream::connect(&accept_shared.upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let Err(error) = splice(&accept_shared, client, server) {
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

    /// `url` with its `host:port` replaced by this proxy's, and the original
    /// `host:port` (for [`Proxy::start`]).
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
fn splice(shared: &Shared, client: TcpStream, server: TcpStream) -> io::Result<()> {
    {
        let mut streams = shared.streams.lock().unwrap();
        streams.push(client.try_clone()?);
        streams.push(server.try_clone()?);
    }
    let (mut client_read, mut server_write) = (client.try_clone()?, server.try_clone()?);
    thread::spawn(move || {
        let _ = io::copy(&mut client_read, &mut server_write);
        let _ = server_write.shutdown(Shutdown::Both);
        let _ = client_read.shutdown(Shutdown::Both);
    });
    let (mut server_read, mut client_write) = (server, client);
    thread::spawn(move || {
        let _ = io::copy(&mut server_read, &mut client_write);
        let _ = client_write.shutdown(Shutdown::Both);
        let _ = server_read.shutdown(Shutdown::Both);
    });
    Ok(())
}

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
