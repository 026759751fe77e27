//! Who a peer is: the identity rule of mutual TLS between nodes (`--peer-tls-*`).
//!
//! A node is known by its advertised peer address (`host:port`). With mutual TLS, a
//! connection's certificate speaks for the nodes whose address `host` it is valid for (an IP
//! SAN equal to an IP host, a DNS SAN matching a DNS host, one-label wildcards included, as
//! a TLS client checks a server): both ways, a client checks the server it dials for the
//! dialled host, and a message that changes state on behalf of a node (join, leave, handoff,
//! reset, refund) is accepted only over a connection whose client certificate is valid for
//! that node's host. So one node's certificate cannot make another leave.
//!
//! With `--peer-tls-name NAME` (one certificate shared by every node, when their addresses
//! are not known when it is issued: pod IPs) both sides check the certificate for `NAME`
//! instead, and every holder of the shared certificate speaks for every node.
//!
//! Without mutual TLS nothing is checked here (loopback, or `--peer-insecure`).
//!
//! Pure: no IO, no clock.

use rustls_pki_types::{CertificateDer, ServerName};
use tonic::Status;

/// The host of a peer address: `10.0.0.7:8091` -> `10.0.0.7`, `[::1]:8091` -> `::1`,
/// `rk-0.peers:8091` -> `rk-0.peers`. `None` without a port.
pub fn host_of(address: &str) -> Option<&str> {
    let (host, port) = address.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let host = match host.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']')?,
        None => host,
    };
    (!host.is_empty()).then_some(host)
}

/// The name a certificate must be valid for to speak for `address`: `shared` (the
/// `--peer-tls-name`) when given, else the address's host.
pub fn name_for(address: &str, shared: Option<&str>) -> Result<ServerName<'static>, String> {
    let host = match shared {
        Some(name) => name,
        None => host_of(address).ok_or_else(|| format!("{address:?} is not host:port"))?,
    };
    ServerName::try_from(host.to_owned())
        .map_err(|error| format!("{host:?} is not a DNS name or IP address: {error}"))
}

/// Accepts a message that changes state on behalf of the node at `concerns` when `cert`
/// (the connection's client certificate, already verified against the CA in the handshake)
/// is valid for that node (see the module doc). UNAUTHENTICATED without a certificate,
/// PERMISSION_DENIED when it is another node's.
pub fn authorize(
    cert: Option<&CertificateDer<'_>>,
    concerns: &str,
    shared: Option<&str>,
) -> Result<(), Status> {
    let cert = cert.ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    if shared.is_some() {
        // Checked in the handshake: the certificate is valid for the shared name.
        return Ok(());
    }
    let name = name_for(concerns, None).map_err(Status::invalid_argument)?;
    let cert = webpki::EndEntityCert::try_from(cert)
        .map_err(|_| Status::unauthenticated("a client certificate that cannot be parsed"))?;
    cert.verify_is_valid_for_subject_name(&name).map_err(|_| {
        Status::permission_denied(format!(
            "the client certificate does not speak for {concerns}: it is not valid for {}",
            name.to_str()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address() {
        let check = |address: &str, expected: Option<&str>| {
            assert_eq!(host_of(address), expected, "{address}");
        };
        check("10.0.0.7:8091", Some("10.0.0.7"));
        check("[::1]:8091", Some("::1"));
        check(
            "rk-0.peers.ns.svc.cluster.local:8091",
            Some("rk-0.peers.ns.svc.cluster.local"),
        );
        check("10.0.0.7", None);
        check(":8091", None);
        check("host:port", None);
        check("[::1:8091", None);
    }

    fn leaf(names: &[&str]) -> CertificateDer<'static> {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(names)
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        cert.der().clone()
    }

    #[test]
    fn a_certificate_speaks_only_for_the_nodes_whose_host_it_is_valid_for() {
        let b = leaf(&["127.0.0.2"]);
        let wildcard = leaf(&["*.peers.ns.svc.cluster.local"]);
        assert!(authorize(Some(&b), "127.0.0.2:7000", None).is_ok());
        let other = authorize(Some(&b), "127.0.0.3:7000", None).expect_err("another node");
        assert_eq!(other.code(), tonic::Code::PermissionDenied);
        assert!(
            other.message().contains("127.0.0.3:7000"),
            "{}",
            other.message()
        );
        let none = authorize(None, "127.0.0.2:7000", None).expect_err("no certificate");
        assert_eq!(none.code(), tonic::Code::Unauthenticated);
        assert!(
            authorize(
                Some(&wildcard),
                "rk-1.peers.ns.svc.cluster.local:8091",
                None
            )
            .is_ok()
        );
        let outside = authorize(
            Some(&wildcard),
            "rk-1.other.ns.svc.cluster.local:8091",
            None,
        );
        assert_eq!(
            outside.expect_err("outside").code(),
            tonic::Code::PermissionDenied
        );
        // A shared name: the handshake checked it, any holder speaks for every node.
        assert!(authorize(Some(&b), "10.1.2.3:8091", Some("ratekeeper-peers")).is_ok());
        let bad = authorize(Some(&b), "no-port", None).expect_err("no port");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    }
}
