//! [`Upstream`]: a tiny HTTP/1.1 server standing in for the service behind a proxy. It
//! answers every request `200 upstream ok` and counts them, so a test can tell whether a
//! request got through.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// A tiny HTTP/1.1 server on `127.0.0.1:0` answering every request `200 upstream ok`
/// (keep-alive supported). Counts the requests it served. Stops accepting on drop.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

pub const UPSTREAM_BODY: &str = "upstream ok";

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream on 127.0.0.1:0");
        let addr = listener.local_addr().expect("the upstream's address");
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counter, stopping) = (Arc::clone(&requests), Arc::clone(&stop));
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Acquire) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let counter = Arc::clone(&counter);
                thread::spawn(move || serve_upstream(stream, &counter));
            }
        });
        Upstream {
            addr,
            requests,
            stop,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Acquire)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Answers requests on one connection until the peer closes it or asks to.
fn serve_upstream(stream: TcpStream, requests: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut content_length = 0usize;
        let mut close = false;
        let mut line = String::new();
        // Request line; EOF or an error ends the connection.
        if !matches!(reader.read_line(&mut line), Ok(1..)) {
            return;
        }
        loop {
            line.clear();
            if !matches!(reader.read_line(&mut line), Ok(1..)) {
                return;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let (name, value) = (name.trim(), value.trim());
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.eq_ignore_ascii_case("close");
                }
            }
        }
        let mut body = vec![0u8; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        requests.fetch_add(1, Ordering::AcqRel);
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{}\r\n{UPSTREAM_BODY}",
            UPSTREAM_BODY.len(),
            if close { "connection: close\r\n" } else { "" },
        );
        if writer.write_all(response.as_bytes()).is_err() || close {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    }
}
