//! The failure detector: every `ping_interval` this node pings every member it knows of (its
//! seeds, what `--peer-dns` resolves to, and nodes that joined, minus those that left), each
//! ping with that interval as its deadline. A member that misses `down_after` pings in a row
//! is taken off this node's ring (its keys get new owners here, and the counters kept for
//! them meanwhile are handed over as on any ring change); one that answers `up_after` pings
//! in a row is put back. Each node decides for itself; since every node pings every member,
//! all of them notice within `ping_interval x (down_after + 1)`.
//!
//! Any answer counts as alive, even an error status (a node that predates `Ping` answers
//! UNIMPLEMENTED): only a call that fails to reach the peer or times out is a miss.
//!
//! Anti-entropy rides on the pings: nodes said to have left are pinged too, and each answer
//! (the peer's ring) goes through `Membership::heard`: a node missing from the peer's ring
//! joins it again at once, and a node said to have left that answers with itself on its ring
//! is back on this one. So a live node dropped by mistake is back on every ring within about
//! one `ping_interval` of being reachable (a false failure detection: `up_after` of them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tonic::transport::Channel;

use super::Runtime;
use super::convert::OLDEST;
use super::proto::v1 as wire;
use super::proto::v1::peer_client::PeerClient;
use crate::transport::tls::Tls;

/// One member as the detector sees it.
struct Probe {
    client: PeerClient<Channel>,
    /// Pings in a row that failed / were answered.
    misses: u32,
    answers: u32,
}

impl Probe {
    /// A client for `address`. Its connection carries HTTP/2 keepalive pings, so one that
    /// went silent (a cut network: no reset, just retransmits) is dropped and the next
    /// ping connects afresh instead of waiting out TCP's backoff.
    fn new(
        address: &str,
        deadline: Duration,
        options: &super::ClusterOptions,
        tls: Option<&Tls>,
    ) -> Option<Probe> {
        let endpoint = super::dial::endpoint(address)
            .ok()?
            .connect_timeout(deadline)
            .http2_keep_alive_interval(options.keepalive)
            .keep_alive_timeout(options.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        Some(Probe {
            client: PeerClient::new(super::dial::channel(address, endpoint, tls).ok()?),
            misses: 0,
            answers: 0,
        })
    }
}

/// A ping's outcome: whether it shows the peer alive, and the peer's ring when it answered.
fn alive(
    outcome: Result<Result<tonic::Response<wire::Members>, tonic::Status>, ()>,
) -> (bool, Option<Vec<String>>) {
    match outcome {
        Ok(Ok(members)) => (true, Some(members.into_inner().addresses)),
        // The peer's gRPC server answered, with a status of its own. A status tonic made
        // from a transport error (it keeps the error as its source) is no answer, whatever
        // its code: a TLS peer refusing this node's certificate surfaces as `Unknown`
        // ("received fatal alert: UnknownCA") once the handshake looked done.
        Ok(Err(status)) => (
            std::error::Error::source(&status).is_none()
                && !matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ),
            None,
        ),
        Err(()) => (false, None),
    }
}

impl Runtime {
    /// Pings the members forever (see the module doc).
    pub(super) async fn detect_loop(self: Arc<Self>) {
        let interval = self.options.ping_interval.max(Duration::from_millis(10));
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probes: HashMap<String, Probe> = HashMap::new();
        loop {
            tick.tick().await;
            let probed = {
                let mut membership = self.lock();
                let candidates = membership.candidates(&self.me);
                membership
                    .down
                    .retain(|address| candidates.contains(address));
                membership.probed(&self.me)
            };
            probes.retain(|address, _| probed.contains(address));
            let mut pings = JoinSet::new();
            for address in probed {
                let probe = match probes.entry(address.clone()) {
                    std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                    std::collections::hash_map::Entry::Vacant(entry) => {
                        match Probe::new(&address, interval, &self.options, self.tls.as_ref()) {
                            Some(probe) => entry.insert(probe),
                            None => continue,
                        }
                    }
                };
                let mut client = probe.client.clone();
                let mut request = tonic::Request::new(wire::Member {
                    version: OLDEST,
                    address: self.me.to_string(),
                });
                request.set_timeout(interval);
                let me = Arc::clone(&self.me);
                let runtime = Arc::clone(&self);
                pings.spawn(async move {
                    let outcome = tokio::time::timeout(interval, client.ping(request))
                        .await
                        .map_err(|_| ());
                    let (answered, theirs) = alive(outcome);
                    let heard = theirs.map(|theirs| runtime.lock().heard(&me, &address, &theirs));
                    if heard.is_some_and(|heard| heard.rejoin) {
                        // Anti-entropy: the peer dropped this node; announce it again.
                        let mut request = tonic::Request::new(wire::Member {
                            version: OLDEST,
                            address: me.to_string(),
                        });
                        request.set_timeout(interval);
                        let joined = tokio::time::timeout(interval, client.join(request)).await;
                        tracing::info!(peer = %address, ok = matches!(joined, Ok(Ok(_))), "a peer did not have this node on its ring: joined it again");
                    }
                    if heard.is_some_and(|heard| heard.back) {
                        tracing::info!(peer = %address, "a peer said to have left answers as a member: back on the ring");
                    }
                    (address, answered, heard.is_some_and(|heard| heard.back))
                });
            }
            let mut changed = false;
            while let Some(Ok((address, answered, back))) = pings.join_next().await {
                changed |= back;
                let Some(probe) = probes.get_mut(&address) else {
                    continue;
                };
                if answered {
                    probe.misses = 0;
                    probe.answers = probe.answers.saturating_add(1);
                } else {
                    probe.answers = 0;
                    probe.misses = probe.misses.saturating_add(1);
                }
                changed |= self.judge(&address, probe);
            }
            if changed {
                self.refresh();
            }
        }
    }

    /// Applies the hysteresis to one member after a ping; true if it went down or up.
    fn judge(&self, address: &str, probe: &Probe) -> bool {
        let mut membership = self.lock();
        let down = membership.down.contains(address);
        if !down && probe.misses >= self.options.down_after.max(1) {
            membership.down.insert(address.to_owned());
            tracing::warn!(peer = %address, misses = probe.misses, "peer down: taken off the ring");
            return true;
        }
        if down && probe.answers >= self.options.up_after.max(1) {
            membership.down.remove(address);
            tracing::info!(peer = %address, "peer up: back on the ring");
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::alive;

    #[test]
    fn a_peer_status_is_an_answer_and_a_transport_failure_is_not() {
        let refused = tonic::Status::permission_denied("not you");
        assert!(alive(Ok(Err(refused))).0, "the peer's server answered");
        let closed = tonic::Status::unavailable("connection refused");
        assert!(!alive(Ok(Err(closed))).0);
        // What a TLS 1.3 peer refusing our certificate looks like: the handshake seemed
        // done, then the alert arrives while the request is sent.
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: UnknownCA",
        );
        let refused_tls = tonic::Status::from_error(Box::new(alert));
        assert_eq!(refused_tls.code(), tonic::Code::Unknown);
        assert!(
            !alive(Ok(Err(refused_tls))).0,
            "a transport error is no answer"
        );
        assert!(!alive(Err(())).0, "no answer within the interval");
    }
}
