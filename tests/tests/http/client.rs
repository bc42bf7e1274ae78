//! A minimal HTTP/1.1 client over a `TcpStream`: one request per
//! connection (`Connection: close`), the response read to its end. Raw
//! bytes in, raw bytes out, so the tests can send header values no client
//! library would (a repeated `Idempotency-Key`, bytes that are not ASCII).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A response as received.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// From the request's first byte to the response's last.
    pub elapsed: Duration,
}

impl Response {
    /// The one value of header `name` (lowercase), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut values = self.headers.iter().filter(|(n, _)| n == name);
        let value = values.next().map(|(_, v)| v.as_str());
        assert!(values.next().is_none(), "header {name} repeated: {self:?}");
        value
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {self:?}"))
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem type of an error response (`application/problem+json`).
    pub fn problem(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let json = self.json();
        assert_eq!(json["status"], u64::from(self.status), "{self:?}");
        json["type"].as_str().expect("a problem type").to_owned()
    }
}

/// `POST path` with `headers` (raw values) and `body`.
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Response {
    let started = Instant::now();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name.as_bytes());
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);

    let mut stream = TcpStream::connect(addr).expect("connect to the service");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a read timeout");
    stream.write_all(&request).expect("send the request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read the response");
    let mut response = parse(&raw);
    response.elapsed = started.elapsed();
    response
}

fn parse(raw: &[u8]) -> Response {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {:?}", String::from_utf8_lossy(raw)));
    let head = std::str::from_utf8(&raw[..end]).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').expect("a header line");
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(rest.len(), |(_, v)| v.parse().expect("a content length"));
        rest[..length].to_vec()
    };
    Response {
        status,
        headers,
        body: String::from_utf8(body).expect("a UTF-8 body"),
        elapsed: Duration::ZERO,
    }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size");
        let size = std::str::from_utf8(&rest[..line_end]).expect("a chunk size");
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
