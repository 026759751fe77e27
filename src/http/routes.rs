//! The one route table of each listener: [`HTTP`] (the public listener: probes, metrics and
//! the check front ends) and [`ADMIN`] (the operator listener). The routers are built from
//! them (`http::router`, `admin::admin_router`), and so are the HTTP listener's 403 guard
//! for the operator paths ([`guarded_paths`]), which admin routes are served without the
//! token ([`Access`]), both index pages ([`index_page`]) and the routes' table in the docs
//! ([`markdown`]). A route added here is served, guarded, listed and documented at once; an
//! endpoint without a route does not compile (each listener's `Endpoint` is matched
//! exhaustively by its router).

use std::fmt::Write as _;
use std::net::SocketAddr;

/// What the HTTP listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http {
    Index,
    Healthcheck,
    Metrics,
    Rlconfig,
    Json,
    RateFixed,
    RateValued,
    Nginx,
}

/// What the admin listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admin {
    Index,
    Healthcheck,
    Metrics,
    Stats,
    Rlconfig,
    Explain,
    Counters,
    Rlqs,
    Ui,
    UiData,
}

/// Who may call an admin route when `--admin-token-file` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only a request carrying the bearer token.
    Token,
    /// Anyone: a read-only probe the HTTP listener serves too, or a static page that holds
    /// no data (the dashboard's page, which sends the token itself; the index).
    Open,
}

/// One route of a listener.
#[derive(Clone, Copy, Debug)]
pub struct Route<E> {
    /// `GET`, `POST`, `GET, DELETE`, or `any` (every method).
    pub method: &'static str,
    /// The path, in the router's syntax (`/counters/{domain}`).
    pub path: &'static str,
    pub endpoint: E,
    pub access: Access,
    /// One line for the index page and the docs (plain text).
    pub about: &'static str,
}

const fn http(
    method: &'static str,
    path: &'static str,
    endpoint: Http,
    about: &'static str,
) -> Route<Http> {
    Route {
        method,
        path,
        endpoint,
        access: Access::Open,
        about,
    }
}

const fn admin(
    method: &'static str,
    path: &'static str,
    endpoint: Admin,
    access: Access,
    about: &'static str,
) -> Route<Admin> {
    Route {
        method,
        path,
        endpoint,
        access,
        about,
    }
}

/// The HTTP listener (`--http-addr`): what probes, Prometheus, and Envoy's or nginx's
/// checks over HTTP reach.
pub const HTTP: &[Route<Http>] = &[
    http(
        "GET",
        "/",
        Http::Index,
        "this page: the routes of both listeners",
    ),
    http(
        "GET",
        "/healthcheck",
        Http::Healthcheck,
        "200 `OK` while serving; 503 once shutdown has begun, and, with `--healthy-only-with-config`, 503 `no limits loaded yet` until limits with a domain are loaded",
    ),
    http(
        "GET",
        "/metrics",
        Http::Metrics,
        "Prometheus metrics (OpenMetrics text)",
    ),
    http(
        "GET",
        "/rlconfig",
        Http::Rlconfig,
        "the live limits, one line per limit (`edge.api_key_vip: unit=MINUTE requests_per_unit=100, ...`)",
    ),
    http(
        "POST",
        "/json",
        Http::Json,
        "a JSON `RateLimitRequest` (`{\"domain\": \"edge\", \"descriptors\": [{\"entries\": [{\"key\": \"api_key\", \"value\": \"k1\"}]}]}`), answered with the JSON response: 200 when OK, 429 when over the limit, 400 for a bad body or request (naming the field), 503 when overloaded",
    ),
    http(
        "POST",
        "/rate/{domain}/{name}",
        Http::RateFixed,
        "check and consume the limit named `name`, on a descriptor whose values are all configured",
    ),
    http(
        "POST",
        "/rate/{domain}/{name}/{value}",
        Http::RateValued,
        "check and consume the limit named `name`, `value` filling the descriptor's last entry",
    ),
    http(
        "any",
        "/nginx/{domain}",
        Http::Nginx,
        "the check for nginx's `auth_request`, descriptors from `X-Ratelimit-Descriptor` headers: 204 allowed, 403 over the limit, with `RateLimit` headers",
    ),
];

/// The admin listener (`--admin-addr`, loopback by default; the reference service's
/// `DEBUG_PORT`).
pub const ADMIN: &[Route<Admin>] = &[
    admin(
        "GET",
        "/",
        Admin::Index,
        Access::Open,
        "this page: the routes of this listener",
    ),
    admin(
        "GET",
        "/ui",
        Admin::Ui,
        Access::Open,
        "the dashboard: one self-contained page, the same for everyone and holding no data (what it fetches needs the token: open it as `/ui#token=TOKEN`); off with `--admin-ui=false`",
    ),
    admin(
        "GET",
        "/ui/data",
        Admin::UiData,
        Access::Token,
        "the dashboard's JSON: limits with hits and over-limit totals and their history (every 10 s for the last 10 minutes), hottest counters, ring members and their health, RLQS buckets, the last reload and its errors",
    ),
    admin(
        "POST",
        "/debug/explain",
        Admin::Explain,
        Access::Token,
        "the `/json` body, answered 200 with what each descriptor would meet, consuming nothing; 400 naming the field, 503 when the store or the key's owner cannot answer",
    ),
    admin(
        "GET",
        "/debug/rlqs",
        Admin::Rlqs,
        Access::Token,
        "`?domain=NAME`: the RLQS buckets of this node (at most 1000, `total` counts all), each with its limit (`rule`) and its reporters: stream id, `demand` and `share` per unit of the limit",
    ),
    admin(
        "GET, DELETE",
        "/counters/{domain}",
        Admin::Counters,
        Access::Token,
        "`GET ?after=&limit=&cluster=`: with `--counter-names`, the domain's live counters on this node (`cluster=1`: on every node, members that do not answer reported in `missing`) and their state, paged; `DELETE ?descriptor=k=v,k=v`: resets that descriptor's counters wherever they live; 400 naming a bad parameter, 404 for an unknown domain, 503 when the store or an owner cannot answer; both 404 with `--admin-counters=false`",
    ),
    admin(
        "GET",
        "/rlconfig",
        Admin::Rlconfig,
        Access::Open,
        "as on the HTTP listener (the reference's debug port answers it)",
    ),
    admin(
        "GET",
        "/stats",
        Admin::Stats,
        Access::Open,
        "the Prometheus text, as `/metrics` (the reference's debug port's name)",
    ),
    admin(
        "GET",
        "/metrics",
        Admin::Metrics,
        Access::Open,
        "as on the HTTP listener",
    ),
    admin(
        "GET",
        "/healthcheck",
        Admin::Healthcheck,
        Access::Open,
        "as on the HTTP listener",
    ),
];

/// The paths the HTTP listener answers 403 naming the admin listener: for each admin route
/// whose path the HTTP listener does not serve, its first segment alone and everything
/// under it (`/debug`, `/debug/{*rest}`), so a caller who took a wrong turn learns where
/// the operator endpoints went instead of meeting a bare 404.
pub fn guarded_paths() -> Vec<String> {
    let mut paths = Vec::new();
    for route in ADMIN {
        if HTTP.iter().any(|served| served.path == route.path) {
            continue;
        }
        let first = route
            .path
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default();
        for path in [format!("/{first}"), format!("/{first}/{{*rest}}")] {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    paths
}

/// `GET /` of a listener: its routes, and for the HTTP listener those of the admin listener
/// at `admin_addr` too.
pub fn index_page(admin_addr: SocketAddr, listener: IndexOf) -> String {
    let mut page = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>ratekeeper</title></head>\n<body>\n<h1>ratekeeper</h1>\n\
         <p>An Envoy rate limit service: gRPC <code>ShouldRateLimit</code> on its gRPC listener.</p>\n",
    );
    if listener == IndexOf::Http {
        page.push_str("<p>This HTTP listener serves:</p>\n");
        list(&mut page, HTTP);
    }
    let _ = writeln!(
        page,
        "<p>The admin listener (<code>--admin-addr</code>, {admin_addr}; the reference service's \
         <code>DEBUG_PORT</code>) serves, those marked token behind <code>--admin-token-file</code> \
         when one is set:</p>"
    );
    list(&mut page, ADMIN);
    page.push_str("</body></html>\n");
    page
}

/// Which listener an index page is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOf {
    Http,
    Admin,
}

fn list<E>(page: &mut String, routes: &[Route<E>]) {
    page.push_str("<ul>\n");
    for route in routes {
        let path = escape(route.path);
        // A route a browser can open as it is gets a link.
        let shown = if route.method == "GET" && !route.path.contains('{') {
            format!("<a href=\"{path}\">{path}</a>")
        } else {
            format!("<code>{path}</code>")
        };
        let _ = writeln!(
            page,
            "<li><code>{}</code> {shown}{}: {}</li>",
            route.method,
            if route.access == Access::Token {
                " (token)"
            } else {
                ""
            },
            escape(route.about)
        );
    }
    page.push_str("</ul>\n");
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Where the generated route table lives, from the repository root.
pub const DOCS_FILE: &str = "docs/routes.md";

/// Both tables as Markdown: the file [`DOCS_FILE`].
pub fn markdown() -> String {
    let mut out = String::from(
        "# HTTP routes\n\n<!-- Generated from src/http/routes.rs: do not edit. Regenerate with \
         `RATEKEEPER_REGENERATE=1 cargo test --lib routes`. -->\n\n\
         ratekeeper has two HTTP listeners. The HTTP listener serves what probes, Prometheus and \
         the check front ends need; the operator endpoints are served only on the admin listener, \
         and on the HTTP listener their paths answer 403 naming it. `GET /` on either lists its \
         routes.\n\n\
         ## The HTTP listener (`--http-addr`)\n\n| method | path | what it answers |\n| --- | --- | --- |\n",
    );
    for route in HTTP {
        let _ = writeln!(
            out,
            "| {} | `{}` | {} |",
            route.method, route.path, route.about
        );
    }
    out.push_str(
        "\n## The admin listener (`--admin-addr`)\n\nWith `--admin-token-file`, the routes marked token need \
         `Authorization: Bearer TOKEN`; the others are open.\n\n\
         | method | path | access | what it answers |\n| --- | --- | --- | --- |\n",
    );
    for route in ADMIN {
        let access = match route.access {
            Access::Token => "token",
            Access::Open => "open",
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | {access} | {} |",
            route.method, route.path, route.about
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes users and scripts rely on, written out here and not read from the tables:
    /// a route dropped from a table (so no longer served, guarded, listed or documented)
    /// fails this test.
    #[test]
    fn each_listener_serves_the_routes_users_rely_on() {
        let http: Vec<(&str, &str)> = HTTP.iter().map(|r| (r.method, r.path)).collect();
        assert_eq!(
            http,
            [
                ("GET", "/"),
                ("GET", "/healthcheck"),
                ("GET", "/metrics"),
                ("GET", "/rlconfig"),
                ("POST", "/json"),
                ("POST", "/rate/{domain}/{name}"),
                ("POST", "/rate/{domain}/{name}/{value}"),
                ("any", "/nginx/{domain}"),
            ]
        );
        let admin: Vec<(&str, &str, Access)> =
            ADMIN.iter().map(|r| (r.method, r.path, r.access)).collect();
        assert_eq!(
            admin,
            [
                ("GET", "/", Access::Open),
                ("GET", "/ui", Access::Open),
                ("GET", "/ui/data", Access::Token),
                ("POST", "/debug/explain", Access::Token),
                ("GET", "/debug/rlqs", Access::Token),
                ("GET, DELETE", "/counters/{domain}", Access::Token),
                ("GET", "/rlconfig", Access::Open),
                ("GET", "/stats", Access::Open),
                ("GET", "/metrics", Access::Open),
                ("GET", "/healthcheck", Access::Open),
            ]
        );
    }

    /// Every operator path, and everything under its first segment, answers 403 on the
    /// HTTP listener; nothing the HTTP listener serves is guarded.
    #[test]
    fn the_http_listener_guards_every_operator_path_and_nothing_it_serves() {
        let guarded = guarded_paths();
        assert_eq!(
            guarded,
            [
                "/ui",
                "/ui/{*rest}",
                "/debug",
                "/debug/{*rest}",
                "/counters",
                "/counters/{*rest}",
                "/stats",
                "/stats/{*rest}",
            ]
        );
        for route in HTTP {
            assert!(
                !guarded.iter().any(|path| path == route.path),
                "{}",
                route.path
            );
        }
    }

    #[test]
    fn the_index_pages_list_their_listeners_routes() {
        let admin_addr = SocketAddr::from(([127, 0, 0, 1], 6070));
        let http = index_page(admin_addr, IndexOf::Http);
        let admin = index_page(admin_addr, IndexOf::Admin);
        for route in ADMIN {
            assert!(
                http.contains(route.path),
                "{} on the HTTP index",
                route.path
            );
            assert!(
                admin.contains(route.path),
                "{} on the admin index",
                route.path
            );
        }
        for route in HTTP {
            assert!(
                http.contains(route.path),
                "{} on the HTTP index",
                route.path
            );
            let also_admin = ADMIN.iter().any(|served| served.path == route.path);
            let listed = admin.contains(&format!(">{}<", route.path));
            assert_eq!(listed, also_admin, "{} on the admin index", route.path);
        }
        assert!(http.contains("127.0.0.1:6070") && admin.contains("--admin-addr"));
        assert!(admin.contains("<a href=\"/debug/rlqs\">/debug/rlqs</a> (token)"));
    }

    /// `docs/routes.md` is the tables' Markdown; `RATEKEEPER_REGENERATE=1` writes it.
    #[test]
    fn the_docs_route_table_is_generated_from_the_tables() {
        crate::generated::check(DOCS_FILE, &markdown(), "routes");
    }
}
