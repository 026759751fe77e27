//! `ratekeeper explain`: sends a `/json`-shaped body to a running ratekeeper's
//! `POST /debug/explain` and prints the answer for a person.
//!
//! Descriptors are given as `key=value,key=value` (the `X-Ratelimit-Descriptor` syntax:
//! entries percent-decoded, so `%2C` is a comma). The client is a minimal HTTP/1.1 one (one
//! request, `Connection: close`, bounded in time and size), so the command needs nothing
//! beyond the binary. Every failure is an `Err` with a message for the terminal: a bad flag
//! (naming it), an unreachable address, or ratekeeper's own error answer.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::http::descriptor;

/// How long the whole exchange may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (64 descriptors with a few limits each fit easily).
const MAX_ANSWER_BYTES: u64 = 4 << 20;

/// What to explain, and where to ask.
#[derive(Clone, Debug)]
pub struct ExplainRequest {
    /// `http://host:port` (or `host:port`) of the admin listener.
    pub addr: String,
    pub domain: String,
    /// One `key=value,key=value` per descriptor.
    pub descriptors: Vec<String>,
    /// Hits per descriptor (the request's `hits_addend`).
    pub hits: Option<u32>,
    /// The admin listener's bearer token, read from this file (`--admin-token-file`).
    pub token_file: Option<std::path::PathBuf>,
}

/// The command: [`run`] on a runtime of its own; prints the explanation, or the error on
/// stderr with a failing exit code.
pub fn command(request: &ExplainRequest) -> ExitCode {
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the tokio runtime: {error}"))
        .and_then(|runtime| runtime.block_on(run(request)));
    match answer {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("ratekeeper explain: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Asks and renders; the error is a message for the terminal.
pub async fn run(request: &ExplainRequest) -> Result<String, String> {
    let body = body(request)?;
    let authority = authority(&request.addr)?;
    let authorization = match &request.token_file {
        Some(path) => Some(
            crate::admin::auth::read_token(path)
                .map_err(|error| error.to_string())?
                .header_value(),
        ),
        None => None,
    };
    let body = body.to_string();
    let exchange = post(&authority, &body, authorization.as_deref());
    let (status, answer) = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{authority} did not answer within {}s", TIMEOUT.as_secs()))??;
    let parsed: Value = serde_json::from_str(&answer).map_err(|_| {
        format!("{authority} answered {status} with something other than JSON: {answer:?}")
    })?;
    if status != 200 {
        let message = parsed["error"].as_str().unwrap_or(answer.as_str());
        return Err(format!("ratekeeper answered {status}: {message}"));
    }
    Ok(render(&parsed))
}

/// The `/json` body for `request`; the error names the flag at fault.
pub fn body(request: &ExplainRequest) -> Result<Value, String> {
    if request.domain.is_empty() {
        return Err("--domain: must not be empty".to_owned());
    }
    let mut descriptors = Vec::with_capacity(request.descriptors.len());
    for (index, text) in request.descriptors.iter().enumerate() {
        let entries = descriptor::parse(text.as_bytes(), "descriptor").map_err(|problem| {
            format!("--descriptor {text:?} (number {}): {problem}", index + 1)
        })?;
        let entries: Vec<Value> = entries
            .into_iter()
            .map(|(key, value)| json!({"key": key, "value": value}))
            .collect();
        descriptors.push(json!({ "entries": entries }));
    }
    let mut body = json!({"domain": request.domain, "descriptors": descriptors});
    if let Some(hits) = request.hits {
        body["hits_addend"] = json!(hits);
    }
    Ok(body)
}

/// `host:port` out of `http://host:port[/]` or `host:port`.
fn authority(addr: &str) -> Result<String, String> {
    let rest = match addr.split_once("://") {
        Some(("http", rest)) => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "--addr {addr:?}: only http:// is supported, not {scheme}://"
            ));
        }
        None => addr,
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
        return Err(format!(
            "--addr {addr:?}: expected http://HOST:PORT, like http://127.0.0.1:6070"
        ));
    }
    Ok(authority.to_owned())
}

/// `POST /debug/explain` with `body` (and the `Authorization` header, when given); the
/// status and the body of the answer.
async fn post(
    authority: &str,
    body: &str,
    authorization: Option<&str>,
) -> Result<(u16, String), String> {
    let unreachable =
        |error: std::io::Error| format!("cannot reach ratekeeper at {authority}: {error}");
    let mut stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(unreachable)?;
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST /debug/explain HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{authorization}Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(unreachable)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut raw)
        .await
        .map_err(unreachable)?;
    parse_answer(&raw).ok_or_else(|| {
        format!(
            "{authority} did not answer HTTP: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(200)])
        )
    })
}

/// The status and body of a raw HTTP/1.1 answer (chunked bodies decoded).
fn parse_answer(raw: &[u8]) -> Option<(u16, String)> {
    let end = raw.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let mut body = &raw[end + 4..];
    if !chunked {
        return Some((status, String::from_utf8_lossy(body).into_owned()));
    }
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|window| window == b"\r\n")?;
        let size = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        body = body.get(line_end + 2..)?;
        if size == 0 {
            return Some((status, String::from_utf8_lossy(&out).into_owned()));
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

/// The answer of `/debug/explain`, for a person.
pub fn render(answer: &Value) -> String {
    let mut out = format!("domain {}\n", answer["domain"]);
    for (index, descriptor) in array(&answer["descriptors"]).iter().enumerate() {
        render_descriptor(&mut out, index + 1, descriptor);
    }
    out
}

/// One descriptor of the answer (`number` from 1): its entries, why its limits apply, where
/// its counters live, each limit, and the verdict.
fn render_descriptor(out: &mut String, number: usize, descriptor: &Value) {
    let entries: Vec<String> = array(&descriptor["entries"])
        .iter()
        .map(|entry| format!("{}={}", text(&entry["key"]), text(&entry["value"])))
        .collect();
    let hits = descriptor["hits"].as_u64().unwrap_or(0);
    *out += &format!(
        "descriptor {number}: {} ({})\n",
        entries.join(","),
        hit_count(hits)
    );
    let limits = array(&descriptor["limits"]);
    if limits.is_empty() {
        *out += &format!("  no limit: {}\n", text(&descriptor["reason"]));
        return;
    }
    *out += &format!("  {}\n", text(&descriptor["reason"]));
    for replaced in array(&descriptor["replaced"]) {
        *out += &format!(
            "  dropped {} (replaced by {} at {})\n",
            text(&replaced["limit"]),
            replaced["by"].as_str().unwrap_or("an unnamed limit"),
            text(&replaced["at"])
        );
    }
    let place = counters_place(descriptor);
    if !place.is_empty() {
        *out += &format!("  counters: {}\n", place.join(", "));
    }
    for limit in limits {
        render_limit(out, limit, hits);
    }
    *out += &format!("  {}\n", verdict(descriptor));
}

/// Where the descriptor's counters live: the shard on this node, the owner node.
fn counters_place(descriptor: &Value) -> Vec<String> {
    let mut place = Vec::new();
    if let (Some(shard), Some(shards)) =
        (descriptor["shard"].as_u64(), descriptor["shards"].as_u64())
    {
        place.push(format!("shard {shard} of {shards} on this node"));
    }
    if let Some(owner) = descriptor["owner"].as_str() {
        let whose = if descriptor["local"] == true {
            "this node"
        } else {
            "another node"
        };
        place.push(format!("owner {owner} ({whose})"));
    }
    place
}

/// One limit of a descriptor asking for `hits`: its rule, its counter, its keys' budget and
/// whether it would reject.
fn render_limit(out: &mut String, limit: &Value, hits: u64) {
    let name = limit["name"].as_str().unwrap_or("(unnamed)");
    let window = match limit["unit_multiplier"].as_u64() {
        Some(multiplier) => format!("{multiplier} {}s", text(&limit["unit"])),
        None => text(&limit["unit"]),
    };
    *out += &format!(
        "  limit {name}: {} per {window}, {}",
        limit["requests_per_unit"],
        text(&limit["algorithm"])
    );
    if limit["algorithm"] == "token_bucket" || limit["algorithm"] == "gcra" {
        *out += &format!(", burst {}", limit["burst"]);
    }
    if let Some(wait) = limit["max_wait_ms"].as_u64() {
        *out += &format!(", waits up to {wait}ms");
    }
    *out += &format!(
        "\n    used {}, remaining {}, fully reset in {}\n",
        limit["used"],
        limit["remaining"],
        seconds(limit["reset_after_ms"].as_u64().unwrap_or(0))
    );
    let keys = &limit["keys"];
    if let (Some(live), Some(budget)) = (keys["live"].as_u64(), keys["budget"].as_u64()) {
        *out += &format!("    keys of this rule here: {live} of its budget of {budget}");
        match keys["refused"].as_u64() {
            Some(refused) if refused > 0 => {
                *out += &format!(", {refused} requests refused at the budget\n")
            }
            _ => *out += "\n",
        }
    }
    if limit["would_reject"] == true {
        let hits = hit_count(hits);
        *out += &match limit["retry_after_ms"].as_u64() {
            Some(wait) => format!(
                "    rejects {hits} now; admitted again in {}\n",
                seconds(wait)
            ),
            None => format!("    rejects {hits} now, and always will\n"),
        };
    }
}

/// Whether the descriptor's request would pass now.
fn verdict(descriptor: &Value) -> String {
    if descriptor["shadow"] == true {
        "shadow mode: counted, never rejected".to_owned()
    } else if descriptor["would_reject"] == true {
        match descriptor["retry_after_ms"].as_u64() {
            Some(wait) => format!(
                "over: this request would be rejected now; retry in {}",
                seconds(wait)
            ),
            None => "over: this request would be rejected now, and will never pass (more \
                     hits than a limit allows)"
                .to_owned(),
        }
    } else {
        "within the limit: this request would pass now".to_owned()
    }
}

/// The items of a JSON array (none when `value` is not one).
fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[][..], Vec::as_slice)
}

/// `1 hit`, `2 hits`.
fn hit_count(hits: u64) -> String {
    let plural = if hits == 1 { "" } else { "s" };
    format!("{hits} hit{plural}")
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `0.250s`, `42.000s`, `3m20s`, `12h00m52s`.
fn seconds(millis: u64) -> String {
    let secs = millis / 1000;
    match secs {
        0..60 => format!("{secs}.{:03}s", millis % 1000),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m{:02}s", secs / 3600, secs % 3600 / 60, secs % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_parse_like_the_nginx_header_and_bad_ones_name_the_flag() {
        assert_eq!(
            descriptor::parse(b"api_key=k1, path=/a%2Cb", "descriptor").expect("valid"),
            [
                ("api_key".to_owned(), "k1".to_owned()),
                ("path".to_owned(), "/a,b".to_owned())
            ]
        );
        let request = |descriptor: &str| ExplainRequest {
            addr: "http://127.0.0.1:8080".to_owned(),
            domain: "edge".to_owned(),
            descriptors: vec!["a=1".to_owned(), descriptor.to_owned()],
            hits: Some(0),
            token_file: None,
        };
        let error = body(&request("novalue")).expect_err("no =");
        assert_eq!(
            error,
            r#"--descriptor "novalue" (number 2): descriptor.entries[0]: no `=` in "novalue" (expected key=value)"#
        );
        let error = body(&request("=x")).expect_err("empty key");
        assert!(error.contains("key: must not be empty"), "{error}");
        let ok = body(&request("b=2")).expect("valid");
        assert_eq!(
            ok,
            json!({"domain": "edge", "hits_addend": 0, "descriptors": [
                {"entries": [{"key": "a", "value": "1"}]},
                {"entries": [{"key": "b", "value": "2"}]}
            ]})
        );
    }

    #[test]
    fn addresses_are_http_host_and_port() {
        assert_eq!(
            authority("http://127.0.0.1:8080/").as_deref(),
            Ok("127.0.0.1:8080")
        );
        assert_eq!(authority("localhost:9").as_deref(), Ok("localhost:9"));
        assert!(authority("https://x:1").is_err_and(|error| error.contains("only http://")));
        assert!(authority("http://x").is_err());
        assert!(authority("http://x:1/path").is_err());
    }

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(seconds(250), "0.250s");
        assert_eq!(seconds(200_000), "3m20s");
        assert_eq!(seconds(43_252_845), "12h00m52s");
    }

    #[test]
    fn answers_parse_with_and_without_chunking() {
        let plain = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_answer(plain), Some((400, "{}".to_owned())));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked), Some((200, "{}".to_owned())));
        assert_eq!(parse_answer(b"garbage"), None);
    }
}
