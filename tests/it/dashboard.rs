//! `GET /ui` in a real headless browser (Debian's chromium): a cluster of two ratekeeper
//! processes under traffic, some of it over the limit, and a broken config reload; the
//! page, once its scripts ran, shows the live figures: the limits with a non-zero
//! over-limit count, a chart per limit (drawn at once from the server's history, so the
//! over-limit traffic sent before the page was opened is on it), the hottest counter, both
//! ring members healthy, the reload error, and the explain form's answer. A screenshot is
//! kept under `<target>/test-artifacts/`.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::support::{
    Ratekeeper, TempDir, artifacts_dir, dump_dom, eventually, http_get, http_post, metric,
    screenshot, write_config,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
/// Virtual time for the page's scripts: the first poll, the explain call, and a few polls
/// more (one every 2 s) so the charts have points.
const BUDGET: Duration = Duration::from_secs(7);

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 2}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {name: per_path, unit: hour, requests_per_unit: 100}
";

/// `POST /json` for one descriptor `key=value` in domain `edge`; the HTTP status.
fn ask(http: SocketAddr, key: &str, value: &str) -> u16 {
    let body =
        json!({"domain": "edge", "descriptors": [{"entries": [{"key": key, "value": value}]}]});
    let response = http_post(http, "/json", &[], &body.to_string()).expect("answers");
    response.status
}

/// Whether the node of admin listener `admin` owns `value`'s counter, by `/debug/explain`.
fn owns(admin: SocketAddr, value: &str) -> bool {
    let body = json!({"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]});
    let response = http_post(admin, "/debug/explain", &[], &body.to_string()).expect("answers");
    let explained: Value = serde_json::from_str(&response.body).expect("json");
    explained["descriptors"][0]["local"] == true
}

fn start(config: &Path, peers: &[SocketAddr]) -> Ratekeeper {
    let joined = peers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![
        "--peer-addr",
        "127.0.0.1:0",
        "--peer-timeout",
        "2s",
        "--counter-names",
        "100",
    ];
    if !peers.is_empty() {
        args.extend(["--peers", joined.as_str()]);
    }
    Ratekeeper::start(config, &args)
}

/// Whether the server's history (sampled every 10 s) shows `over` over-limit hits for the
/// limit named `limit` within 25 s.
fn sampled_over(admin: SocketAddr, limit: &str, over: u64) -> bool {
    eventually(Duration::from_secs(25), || {
        let response = http_get(admin, "/ui/data", &[]).expect("answers");
        let data: Value = serde_json::from_str(&response.body).expect("json");
        data["history"]["series"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|series| series["limit"] == limit)
            .flat_map(|series| series["points"].as_array().cloned().unwrap_or_default())
            .any(|point| point[2] == over)
    })
}

/// The value of attribute `name` in the first tag of `html` that has it.
fn attribute<'a>(html: &'a str, name: &str) -> Option<&'a str> {
    let start = html.find(&format!(" {name}=\""))? + name.len() + 3;
    html[start..].split('"').next()
}

/// The figures of `limit`'s chart in `dom`: its peak over-limit rate, its over-limit hits
/// in the charted window, and how many sample intervals it draws.
fn chart(dom: &str, limit: &str) -> Option<(f64, u64, u64)> {
    let tag = dom
        .split("class=\"chart\" ")
        .skip(1)
        .map(|rest| &rest[..rest.find("</div>").unwrap_or(rest.len())])
        .find(|tag| {
            attribute(&format!(" {tag}"), "data-key").is_some_and(|key| key.ends_with(limit))
        })?;
    let tag = format!(" {tag}");
    Some((
        attribute(&tag, "data-peak")?.parse().ok()?,
        attribute(&tag, "data-over-window")?.parse().ok()?,
        attribute(&tag, "data-points")?.parse().ok()?,
    ))
}

/// The numbers in `data-over="N"` attributes of `dom`.
fn over_figures(dom: &str) -> Vec<u64> {
    dom.split("data-over=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect()
}

#[test]
fn the_dashboard_shows_live_figures_in_a_real_browser() {
    let dir = TempDir::new("dashboard");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let first = start(&config, &[]);
    let second = start(&config, &[first.peer_addr()]);
    for node in [&first, &second] {
        let agreed = eventually(WAIT, || {
            metric(node.http_addr(), "ratekeeper_cluster_members") == 2.0
        });
        assert!(agreed, "a node never saw 2 members: {}", node.stderr());
    }
    let (http, admin) = (first.http_addr(), first.admin_addr());
    // Traffic through the first node: every key over its limit of 2 once.
    let values: Vec<String> = (0..12).map(|n| format!("user-{n}")).collect();
    for value in &values {
        let statuses: Vec<u16> = (0..3).map(|_| ask(http, "api_key", value)).collect();
        assert_eq!(statuses, [200, 200, 429], "{value}");
    }
    // The hottest counters are those this node holds.
    let local = values
        .iter()
        .find(|value| owns(admin, value))
        .expect("the first node owns one of 12 keys");
    // A broken reload: the old limits stay, the page shows why.
    fs::write(
        &config,
        "domain: edge\ndescriptors: [{key: api_key, rate_limit: {unit: fortnight}}]\n",
    )
    .expect("write the broken config");
    let failed = eventually(WAIT, || {
        let response = http_get(admin, "/ui/data", &[]).expect("answers");
        let data: Value = serde_json::from_str(&response.body).expect("json");
        !data["reload"]["last_error"].is_null()
    });
    assert!(failed, "the broken reload is reported: {}", first.stderr());
    // The server samples every 10 s: wait for the sample that saw the over-limit hits.
    assert!(
        sampled_over(admin, "per_key", 12),
        "the history has the over-limit hits"
    );

    let page = http_get(admin, "/ui", &[]).expect("answers");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|value| value.starts_with("text/html")),
        "{:?}",
        page.headers
    );
    assert!(
        !page.body.contains("src=\"http") && !page.body.contains("href=\"http"),
        "no external assets"
    );

    let url = format!("http://{admin}/ui?domain=edge&descriptor=api_key={local}");
    let dom = dump_dom(&url, BUDGET);
    let context = || format!("DOM:\n{dom}");
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page loaded its data: {}",
        context()
    );
    assert!(
        dom.contains("per_key") && dom.contains("per_path"),
        "limit names: {}",
        context()
    );
    assert!(
        dom.contains("2/day (fixed_window)"),
        "the rate: {}",
        context()
    );
    let over = over_figures(&dom);
    assert!(over.contains(&12), "12 hits over per_key: {over:?}");
    // Opened after the traffic, the page charts it at once, from the server's history.
    let (peak, over_in_window, intervals) =
        chart(&dom, "|per_key").unwrap_or_else(|| panic!("a per_key chart: {}", context()));
    assert_eq!(over_in_window, 12, "{}", context());
    assert!(peak > 0.0, "an over-limit rate on the chart: {}", context());
    assert!(intervals >= 1, "{}", context());
    let (peak, over_in_window, _) =
        chart(&dom, "|per_path").unwrap_or_else(|| panic!("a per_path chart: {}", context()));
    assert_eq!((peak, over_in_window), (0.0, 0), "per_path was never over");
    for node in [&first, &second] {
        let address = node.peer_addr().to_string();
        assert!(
            dom.contains(&format!("class=\"node up\" data-address=\"{address}\"")),
            "{address} listed healthy: {}",
            context()
        );
    }
    assert!(
        dom.contains(&format!("edge: api_key={local}")),
        "the hottest counter: {}",
        context()
    );
    assert!(
        dom.contains("id=\"reload-error\""),
        "the reload error: {}",
        context()
    );
    assert!(
        dom.contains("fortnight"),
        "the reload error's text: {}",
        context()
    );
    let explained = dom
        .split("class=\"explained\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_else(|| panic!("the explain answer: {}", context()));
    assert!(
        explained.contains(&format!("api_key={local}"))
            && explained.contains("per_key: used 2, remaining 0")
            && explained.contains("would reject, passes again in "),
        "{explained}"
    );

    let png = artifacts_dir().join("dashboard.png");
    screenshot(&url, BUDGET, &png);
    println!("dashboard screenshot: {}", png.display());
}

#[test]
fn the_dashboard_and_the_counters_can_be_turned_off() {
    let dir = TempDir::new("dashboard-off");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let off = Ratekeeper::start(&config, &["--admin-ui=false"]);
    for path in ["/ui", "/ui/data"] {
        let response = http_get(off.admin_addr(), path, &[]).expect("answers");
        assert_eq!(response.status, 404, "{path}");
    }
    let no_counters = Ratekeeper::start(
        &config,
        &["--admin-counters=false", "--counter-names", "10"],
    );
    let response = http_get(no_counters.admin_addr(), "/ui/data", &[]).expect("answers");
    assert_eq!(response.status, 200);
    let data: Value = serde_json::from_str(&response.body).expect("json");
    assert_eq!(data["hot"]["enabled"], false, "{data}");
    assert_eq!(data["counters_enabled"], false, "{data}");
    assert_eq!(data["cluster"]["mode"], "single", "{data}");
    assert_eq!(
        data["limits"]["rows"][1]["path"], "edge > api_key",
        "{data}"
    );
}

/// The page charts at most 200 limits, those over their rate first: a limit far down a big
/// config that is over its rate is charted, and the page says how many were left out.
#[test]
fn a_limit_over_its_rate_is_charted_even_past_the_first_200() {
    const LIMITS_IN_CONFIG: usize = 250;
    let dir = TempDir::new("dashboard-many");
    let descriptors: String = (0..LIMITS_IN_CONFIG)
        .map(|n| {
            format!(
                "  - key: k{n}\n    rate_limit: {{name: l{n}, unit: day, requests_per_unit: 1}}\n"
            )
        })
        .collect();
    let config = write_config(
        dir.path(),
        "edge.yaml",
        &format!("domain: edge\ndescriptors:\n{descriptors}"),
    );
    let node = Ratekeeper::start(&config, &[]);
    let (http, admin) = (node.http_addr(), node.admin_addr());
    let last = LIMITS_IN_CONFIG - 1;
    let statuses: Vec<u16> = (0..2)
        .map(|_| ask(http, &format!("k{last}"), "v"))
        .collect();
    assert_eq!(statuses, [200, 429]);
    assert!(
        sampled_over(admin, &format!("l{last}"), 1),
        "the history has the over-limit hit: {}",
        node.stderr()
    );

    let dom = dump_dom(&format!("http://{admin}/ui"), BUDGET);
    let (_, over_in_window, _) = chart(&dom, &format!("|l{last}"))
        .unwrap_or_else(|| panic!("a chart for l{last}: DOM:\n{dom}"));
    assert_eq!(over_in_window, 1);
    let charts = dom.matches("class=\"chart\" ").count();
    assert_eq!(charts, 200, "charts drawn");
    assert!(
        dom.contains(&format!(
            "{} more limits not charted",
            LIMITS_IN_CONFIG - 200
        )),
        "the page says what it left out: DOM:\n{dom}"
    );
}

#[test]
fn with_an_admin_token_the_page_opened_with_it_in_its_fragment_loads_its_data() {
    let dir = TempDir::new("dashboard-token");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let files = TempDir::new("dashboard-token-file");
    let token = write_config(files.path(), "token", "page-token\n");
    let token = token.to_string_lossy().into_owned();
    let node = Ratekeeper::start(&config, &["--admin-token-file", &token]);
    let admin = node.admin_addr();
    let without = dump_dom(&format!("http://{admin}/ui"), BUDGET);
    assert!(
        !without.contains("data-loaded=\"true\"") && without.contains("needs its token"),
        "without the token the page says what it needs: DOM:\n{without}"
    );
    let with = dump_dom(&format!("http://{admin}/ui#token=page-token"), BUDGET);
    assert!(
        with.contains("data-loaded=\"true\"") && with.contains("per_key"),
        "with the token the page loads its data: DOM:\n{with}"
    );
}
