//! `deploy/grafana/ratekeeper-dashboard.json` against the real binary: every PromQL
//! expression of the dashboard (and of its template variables) names only metrics a running
//! ratekeeper exports, scraped from `/metrics` of a node in cluster mode (so the cluster and
//! peer families are there too), and the dashboard covers what an operator watches.
//!
//! Each expression is parsed by a PromQL parser (`promql-parser`, a port of Prometheus's
//! own), after Grafana's interval variables are replaced by a duration, so a syntax error
//! fails the test too; the metric names are the vector selectors of the syntax tree.

use std::collections::BTreeSet;

use crate::support::{Ratekeeper, TempDir, http_get, http_post, read_repo_file, write_config};
use promql_parser::parser::{self, Expr};
use serde_json::Value;

const DASHBOARD: &str = "deploy/grafana/ratekeeper-dashboard.json";

/// Grafana's interval variables, which only Grafana can expand.
const INTERVALS: [&str; 4] = ["$__rate_interval", "$__interval", "$__range", "${__range}"];

/// The metric names `expr` selects; the error is the parser's.
fn metric_names(expr: &str) -> Result<Vec<String>, String> {
    let mut promql = expr.to_owned();
    for variable in INTERVALS {
        promql = promql.replace(variable, "5m");
    }
    let tree = parser::parse(&promql).map_err(|error| format!("{expr:?}: {error}"))?;
    let mut names = Vec::new();
    selectors(&tree, &mut names);
    Ok(names)
}

fn selectors(expr: &Expr, out: &mut Vec<String>) {
    let mut vector = |selector: &parser::VectorSelector| {
        let by_matcher = selector
            .matchers
            .matchers
            .iter()
            .filter(|matcher| matcher.name == "__name__")
            .map(|matcher| matcher.value.clone());
        out.extend(selector.name.clone().into_iter().chain(by_matcher));
    };
    match expr {
        Expr::VectorSelector(selector) => vector(selector),
        Expr::MatrixSelector(matrix) => vector(&matrix.vs),
        Expr::Aggregate(aggregate) => {
            selectors(&aggregate.expr, out);
            if let Some(param) = &aggregate.param {
                selectors(param, out);
            }
        }
        Expr::Unary(unary) => selectors(&unary.expr, out),
        Expr::Binary(binary) => {
            selectors(&binary.lhs, out);
            selectors(&binary.rhs, out);
        }
        Expr::Paren(paren) => selectors(&paren.expr, out),
        Expr::Subquery(subquery) => selectors(&subquery.expr, out),
        Expr::Call(call) => {
            for arg in &call.args.args {
                selectors(arg, out);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// The names a scrape offers to PromQL: samples as they are, and every family by its type
/// (counters as `_total`, histograms as `_bucket`, `_sum`, `_count`), so a family without
/// samples yet (a peer metric with no peer) still counts.
fn exported(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Every PromQL expression of the dashboard: panel targets (rows' nested panels too) and
/// the metrics of `label_values(metric, label)` template queries.
fn expressions(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(expr.to_owned());
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let query = match &variable["query"] {
            Value::String(query) => Some(query.as_str()),
            Value::Object(query) => query.get("query").and_then(Value::as_str),
            _ => None,
        };
        if let Some(inner) = query.and_then(|query| query.strip_prefix("label_values(")) {
            // `label_values(metric{...}, label)`: the selector is the expression.
            let selector = inner
                .rsplit_once(',')
                .map_or(inner, |(selector, _)| selector);
            out.push(selector.to_owned());
        }
    }
    out
}

/// The problems of `expressions`: names `exported` lacks (with their expression), and
/// expressions that do not parse.
fn problems(expressions: &[String], exported: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for expr in expressions {
        match metric_names(expr) {
            Ok(names) if names.is_empty() => out.push(format!("{expr:?} selects no metric")),
            Ok(names) => out.extend(
                names
                    .into_iter()
                    .filter(|name| !exported.contains(name))
                    .map(|name| format!("{name} is not exported (in {expr:?})")),
            ),
            Err(error) => out.push(error),
        }
    }
    out
}

#[test]
fn metric_names_come_from_the_syntax_tree() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, shard) (rate(a_bucket{x="sum(b)", y=~"$v"}[$__rate_interval]))) / on(instance) group_left(version) c offset 5m and d or time() - 1e3 > sum(e) without (f) + {__name__="g"}"#,
    );
    assert_eq!(
        names.as_deref(),
        Ok(&["a_bucket", "c", "d", "e", "g"].map(String::from)[..])
    );
    assert!(
        metric_names("sum(rate(x[5m])").is_err(),
        "a syntax error is caught"
    );
}

#[test]
fn every_dashboard_expression_names_a_metric_ratekeeper_exports() {
    let text = read_repo_file(DASHBOARD);
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());

    let dir = TempDir::new("grafana");
    write_config(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    );
    // Cluster mode on one node: the cluster and peer families are registered.
    let server = Ratekeeper::start(dir.path(), &["--peer-addr", "127.0.0.1:0"]);
    let body =
        r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": "k"}]}]}"#;
    assert_eq!(
        http_post(server.http_addr(), "/json", &[], body)
            .expect("answers")
            .status,
        200
    );
    let scrape = http_get(server.http_addr(), "/metrics", &[])
        .expect("scrapes")
        .body;
    let exported = exported(&scrape);
    assert!(
        exported.contains("ratekeeper_peer_forwarded_total"),
        "{scrape}"
    );

    let expressions = expressions(&dashboard);
    assert!(expressions.len() >= 20, "{expressions:?}");
    let found = problems(&expressions, &exported);
    assert!(found.is_empty(), "{found:#?}\nexported: {exported:#?}");
    // The check itself can fail: a made-up name is caught.
    let bogus = ["sum(rate(ratekeeper_made_up_total[5m]))".to_owned()];
    assert_eq!(
        problems(&bogus, &exported),
        [
            r#"ratekeeper_made_up_total is not exported (in "sum(rate(ratekeeper_made_up_total[5m]))")"#
        ]
    );

    // What an operator watches is on it.
    let used: BTreeSet<String> = expressions
        .iter()
        .filter_map(|expr| metric_names(expr).ok())
        .flatten()
        .collect();
    for needed in [
        "ratekeeper_requests_total",
        "ratekeeper_request_duration_seconds_bucket",
        "ratekeeper_limit_over_limit_total",
        "ratekeeper_limit_near_limit_total",
        "ratekeeper_shard_contended_total",
        "ratekeeper_shard_live_keys",
        "ratekeeper_peer_forwarded_total",
        "ratekeeper_cluster_fallbacks_total",
        "ratekeeper_config_loads_total",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}");
    }
}

#[test]
fn panels_have_unique_ids_and_use_the_datasource_variable() {
    let text = read_repo_file(DASHBOARD);
    let dashboard: Value = serde_json::from_str(&text).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let id = panel["id"].as_u64().expect("an id");
        assert!(ids.insert(id), "duplicate panel id {id}");
        assert!(
            panel["gridPos"]["w"].as_u64().is_some_and(|w| w <= 24),
            "{panel}"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
            assert!(panel["description"].is_string(), "{}", panel["title"]);
        }
    }
}
