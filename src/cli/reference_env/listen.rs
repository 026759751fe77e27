//! The listeners: `HOST`/`PORT`, `GRPC_HOST`/`GRPC_PORT`, `GRPC_UDS`, `DEBUG_HOST`/
//! `DEBUG_PORT` (the admin listener, kept on loopback unless it has a token) and the gRPC
//! listener's TLS.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::Reader;

/// Where `PORT` / `GRPC_PORT` listen without `HOST` / `GRPC_HOST`: every interface, the
/// reference's host; and ratekeeper's ports when only a host is set.
const EVERY_INTERFACE_HTTP: &str = "0.0.0.0:8080";
const EVERY_INTERFACE_GRPC: &str = "0.0.0.0:8081";

impl Reader<'_> {
    pub(super) fn listeners(&mut self) {
        // The service ports: a port without its host listens on every interface, as the
        // reference does (a Deployment that sets only `PORT` expects it reachable).
        if let Some(addr) = self.address("HOST", "PORT", EVERY_INTERFACE_HTTP) {
            self.set(
                "http_addr",
                "--http-addr",
                Some(addr.to_string()),
                &["HOST", "PORT"],
            );
        }
        if let Some(addr) = self.address("GRPC_HOST", "GRPC_PORT", EVERY_INTERFACE_GRPC) {
            let from = ["GRPC_HOST", "GRPC_PORT"];
            self.set("grpc_addr", "--grpc-addr", Some(addr.to_string()), &from);
        }
        self.debug_listener();
        self.copy("GRPC_UDS", "grpc_uds", "--grpc-uds");
        match self.get("PROTO") {
            None => {}
            Some(proto) if proto.eq_ignore_ascii_case("tcp") => self.applied("PROTO"),
            Some(proto) => self.refuse(
                "PROTO",
                format!("{proto:?}: ratekeeper listens on TCP (or a Unix socket, GRPC_UDS) only"),
            ),
        }
        self.unused(
            &["GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"],
            "ratekeeper does not close gRPC connections by age; Envoy's connection stays up",
        );
    }

    /// `DEBUG_HOST:DEBUG_PORT` is the admin listener (which serves the debug port's
    /// `/rlconfig` and `/stats`); off loopback only with ratekeeper's admin token.
    pub(super) fn debug_listener(&mut self) {
        let Some(addr) = self.address(
            "DEBUG_HOST",
            "DEBUG_PORT",
            crate::server::DEFAULT_ADMIN_ADDR,
        ) else {
            return;
        };
        let from = ["DEBUG_HOST", "DEBUG_PORT"];
        if !self.given("admin_addr")
            && !addr.ip().to_canonical().is_loopback()
            && !self.given("admin_token_file")
        {
            self.refuse(
                "DEBUG_HOST",
                format!(
                    "{} would open ratekeeper's admin listener (the debug port, which also \
                     lists and resets counters) beyond loopback: give it a token \
                     (--admin-token-file or RATEKEEPER_ADMIN_TOKEN_FILE), or unset DEBUG_HOST \
                     to serve DEBUG_PORT on 127.0.0.1",
                    addr.ip()
                ),
            );
            return;
        }
        self.set("admin_addr", "--admin-addr", Some(addr.to_string()), &from);
    }

    /// `HOST` and `PORT` variables over `default`: what is unset keeps the default's part.
    /// `None` when neither is set or one is invalid (an error).
    pub(super) fn address(
        &mut self,
        host_variable: &'static str,
        port_variable: &'static str,
        default: &str,
    ) -> Option<SocketAddr> {
        let (host, port) = (self.get(host_variable), self.get(port_variable));
        if host.is_none() && port.is_none() {
            return None;
        }
        // The defaults are the literals of cli.rs's and server.rs's flags, valid addresses.
        let default: SocketAddr = default
            .parse()
            .unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        let ip = match host {
            None => default.ip(),
            Some(host) => match listen_ip(host) {
                Some(ip) => ip,
                None => {
                    self.refuse(
                        host_variable,
                        format!(
                            "{host:?} is not an IP address: ratekeeper binds addresses, not \
                             names (0.0.0.0 or :: for every interface)"
                        ),
                    );
                    return None;
                }
            },
        };
        let port = match port {
            None => default.port(),
            Some(port) => match port.parse::<u16>() {
                Ok(port) => port,
                Err(_) => {
                    self.refuse(
                        port_variable,
                        format!("{port:?} is not a port (0 to 65535)"),
                    );
                    return None;
                }
            },
        };
        Some(SocketAddr::new(ip, port))
    }

    pub(super) fn grpc_tls(&mut self) {
        const FILES: [&str; 5] = [
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_CACERT",
            "GRPC_CLIENT_TLS_SAN",
            "GRPC_SERVER_TLS_CA_CERT",
        ];
        if !self.is_true("GRPC_SERVER_USE_TLS") {
            self.unused(&FILES, "GRPC_SERVER_USE_TLS is not true, TLS stays off");
            return;
        }
        let (cert, key) = (self.get(FILES[0]), self.get(FILES[1]));
        let (Some(cert), Some(key)) = (cert, key) else {
            if self.given("grpc_tls_cert") {
                self.out
                    .overridden
                    .push(("GRPC_SERVER_USE_TLS", "--grpc-tls-cert"));
            } else {
                self.refuse(
                    "GRPC_SERVER_USE_TLS",
                    "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (the certificate chain \
                     and key files)",
                );
            }
            return;
        };
        let cert_from = ["GRPC_SERVER_USE_TLS", FILES[0]];
        self.set(
            "grpc_tls_cert",
            "--grpc-tls-cert",
            Some(cert.to_owned()),
            &cert_from,
        );
        self.set(
            "grpc_tls_key",
            "--grpc-tls-key",
            Some(key.to_owned()),
            &[FILES[1]],
        );
        if self.grpc_client_ca(FILES[2], FILES[4]) {
            self.copy(FILES[3], "grpc_tls_client_san", "--grpc-tls-client-san");
        } else {
            self.unused(
                &[FILES[3]],
                "without GRPC_CLIENT_TLS_CACERT no client certificate is asked for",
            );
        }
    }

    /// The CA client certificates must chain to (mutual TLS): the reference's `ours`
    /// (`GRPC_CLIENT_TLS_CACERT`), or Envoy Gateway's `gateway` (`GRPC_SERVER_TLS_CA_CERT`,
    /// set with the client certificate its Envoy presents); the same file when both are set,
    /// else refused (which CA guards the listener must not be a guess). Answers whether one
    /// is set.
    fn grpc_client_ca(&mut self, ours: &'static str, gateway: &'static str) -> bool {
        let (ca, from) = match (self.get(ours), self.get(gateway)) {
            (Some(a), Some(b)) if a != b => {
                self.refuse(
                    gateway,
                    format!(
                        "names another client CA than {ours}: set one of them, or the same file"
                    ),
                );
                return false;
            }
            (Some(ca), Some(_)) => (ca.to_owned(), vec![ours, gateway]),
            (Some(ca), None) => (ca.to_owned(), vec![ours]),
            (None, Some(ca)) => (ca.to_owned(), vec![gateway]),
            (None, None) => return false,
        };
        self.set(
            "grpc_tls_client_ca",
            "--grpc-tls-client-ca",
            Some(ca),
            &from,
        );
        true
    }
}

/// An address to bind: an IP literal (bracketed or not), `localhost`, or empty-host
/// forms Go accepts.
fn listen_ip(host: &str) -> Option<IpAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    host.parse().ok()
}
