//! A raw HTTP/1.1 client over `std::net` (one request per connection, `Connection: close`,
//! chunked bodies decoded), plus [`free_port`] and [`metric`] for scraping `/metrics`.
//!
//! Every exchange is bounded by [`HTTP_TIMEOUT`] and returns an error rather than panicking,
//! so callers can poll an endpoint that is not up yet.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How long one HTTP exchange may take.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP response as read off the wire.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lowercased, in arrival order (repeats kept).
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Every value of header `name` (any case).
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
            .collect()
    }

    /// Panics unless this is a 200 HTML page (an index page, the dashboard).
    pub fn assert_html_page(&self) {
        assert_eq!(self.status, 200, "{}", self.body);
        assert!(
            self.header("content-type")
                .is_some_and(|kind| kind.starts_with("text/html")),
            "{:?}",
            self.headers
        );
    }
}

/// `GET path` with `Connection: close`; reads the response to EOF. Errors on connect
/// failures, timeouts ([`HTTP_TIMEOUT`]) and malformed responses.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<HttpResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> io::Result<HttpResponse> {
    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} in {:?}", String::from_utf8_lossy(raw)),
        )
    };
    let end = find(raw, b"\r\n\r\n").ok_or_else(|| invalid("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("non-UTF-8 headers"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid("bad header line"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(name, value)| name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| invalid("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(data, b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// `method path` with `headers` and `body` (`Content-Length` is added when the body is not
/// empty or the method is POST or PUT), `Connection: close`; reads the response to EOF.
/// Errors like [`http_get`].
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> io::Result<HttpResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// `POST path` with `headers` and `body`; see [`http_request`].
pub fn http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> io::Result<HttpResponse> {
    http_request(addr, "POST", path, headers, body)
}

/// A port on 127.0.0.1 that was free a moment ago, for a test that must know an address
/// before its server binds it (or bind it again after a restart). It lies below the kernel's
/// ephemeral range, so no outgoing connection (a load generator opens thousands) takes it
/// meanwhile, and no two calls in this process return the same one; another process may
/// still take it: callers retry on "address in use".
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let below = ephemeral_range_start().clamp(FIRST_FIXED_PORT + 1000, 65535);
    let span = u32::from(below - FIRST_FIXED_PORT);
    // Each test process starts elsewhere in the range, so processes rarely meet.
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..span {
        let offset = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = FIRST_FIXED_PORT + u16::try_from(offset).expect("span fits a port");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {FIRST_FIXED_PORT} and {below}");
}

/// The lowest port [`free_port`] gives.
const FIRST_FIXED_PORT: u16 = 10_000;

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A structured List field (RFC 9651) of String items with Integer parameters, parsed by an
/// independent parser (`sfv`): `(name, [(parameter, value)])` per member. Panics, naming
/// the field, on anything else.
pub fn structured_list(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(field)
        .parse()
        .unwrap_or_else(|error| panic!("{field:?} is not a structured List: {error}"));
    list.iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field:?}: an inner list");
            };
            let sfv::BareItem::String(name) = &item.bare_item else {
                panic!("{field:?}: a member that is not a String");
            };
            let params = item
                .params
                .iter()
                .map(|(key, value)| match value {
                    sfv::BareItem::Integer(value) => (key.as_str().to_owned(), i64::from(*value)),
                    other => panic!("{field:?}: {} is {other:?}, not an Integer", key.as_str()),
                })
                .collect();
            (name.as_str().to_owned(), params)
        })
        .collect()
}

/// The value of the first sample line starting with `prefix` on `/metrics` (0 if absent).
pub fn metric(http: SocketAddr, prefix: &str) -> f64 {
    metric_sample(http, prefix).unwrap_or(0.0)
}

/// The value of the first sample line starting with `prefix` on `/metrics`; `None` when
/// there is none (or `/metrics` did not answer), for checks that the metric is exported.
pub fn metric_sample(http: SocketAddr, prefix: &str) -> Option<f64> {
    let response = http_get(http, "/metrics", &[]).ok()?;
    response
        .body
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// The sum of every sample line starting with `prefix` on `/metrics` (all label sets; 0 if
/// none, or if `/metrics` did not answer).
pub fn metric_sum(http: SocketAddr, prefix: &str) -> f64 {
    http_get(http, "/metrics", &[])
        .map(|response| {
            response
                .body
                .lines()
                .filter(|line| line.starts_with(prefix))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        })
        .unwrap_or(0.0)
}
