//! Linux network namespaces for partition tests: [`Netns`] gives each of `n` nodes its own
//! network stack, joined to the others by a peer network and to the test by a client link,
//! so a test can cut a node off its peers while it still talks to every node.
//!
//! - Peer network: each node's `peer0` (`10.77.0.<i+1>/24`) is a veth whose other end is a
//!   port of a bridge in a separate "switch" namespace. Nodes reach each other only there.
//! - Client link: a veth pair from the test's own (root) namespace to each node, alone on its
//!   /30 (`10.78.<slot>.<4i+1>` here, `.<4i+2>` in the node), for the test's gRPC and HTTP.
//!
//! [`Netns::cut`] takes the node's port on the switch down: packets between the node and its
//! peers are dropped without an answer, both ways (a partition, not a refused connection),
//! while its client link stays up. [`Netns::heal`] brings the port back up.
//!
//! Names: [`Netns::resolve_to_all`] makes a name resolve, in every node's namespace, to all
//! the nodes' peer addresses (as a Kubernetes headless Service's name does), through the
//! files `ip netns exec` mounts over `/etc` (`/etc/netns/<namespace>/hosts`, `host.conf`).
//!
//! Invariants: names are unique per run (namespaces `rk-<pid>-<n>-<role>`; the client links'
//! root-side names `rk<slot>n<i>` claim a slot no other run holds, and the slot picks their
//! subnet), so parallel runs do not clash. Everything is torn down on drop, also on panic:
//! processes still running in the namespaces (the test's own) are killed, the sockets they
//! left are aborted (`ss -K`), the client links are deleted, then the namespaces (with the
//! bridge and the peer links) and their `/etc/netns/<namespace>` files. A run killed
//! outright leaves its namespaces behind; later runs skip their slot.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ratekeeper::Ratekeeper;
use super::temp::{TempDir, write_config};
use super::tools::{find_program, found_or_apt_installed};

/// The ports every node listens on inside its own namespace.
pub const NODE_GRPC_PORT: u16 = 8081;
pub const NODE_HTTP_PORT: u16 = 8080;
pub const NODE_ADMIN_PORT: u16 = 6070;
/// The admin token of every node (its listener is on the client link, so it needs one).
const NODE_ADMIN_TOKEN: &str = "netns-admin-token";
pub const NODE_PEER_PORT: u16 = 8091;

/// The bridge in the switch namespace.
const BRIDGE: &str = "br0";
/// Slots for the client links' subnets (`10.78.<slot>.0/24`).
const SLOTS: u16 = 256;
/// Where `ip netns exec NS` finds the files it mounts over those of `/etc` for what it runs
/// (`/etc/netns/NS/hosts` over `/etc/hosts`, and so on).
const ETC_NETNS: &str = "/etc/netns";

/// The namespaces and links of one test; removed on drop.
#[derive(Debug)]
pub struct Netns {
    ip: String,
    switch: String,
    /// One namespace per node, in node order.
    nodes: Vec<String>,
    /// Every namespace created so far (deleted on drop).
    created: Vec<String>,
    slot: Option<u8>,
    /// The `/etc/netns/<namespace>` directories written (removed on drop), and whether this
    /// run created `/etc/netns` itself (then removed on drop if empty).
    etc: Vec<PathBuf>,
    etc_root_created: bool,
}

impl Netns {
    /// `nodes` namespaces wired as the module describes; `ip` is Debian's `iproute2`,
    /// installed when missing. Panics when namespaces cannot be created here (not root, no
    /// CAP_NET_ADMIN), saying so: the partition tests are never skipped. Any later failure
    /// panics with the failing command and its stderr.
    pub fn new(nodes: usize) -> Netns {
        assert!(
            (1..=32).contains(&nodes),
            "1 to 32 nodes fit the address plan"
        );
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let ip = found_or_apt_installed(
            || find_program(&["ip"], &["/usr/sbin", "/sbin"]),
            "iproute2",
            "or put `ip` on PATH",
        );
        let ip = ip.to_string_lossy().into_owned();
        let run = format!(
            "rk-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let switch = format!("{run}-sw");
        if let Err(error) = run_ip(&ip, &["netns", "add", &switch]) {
            panic!(
                "cannot create network namespaces, which the partition tests need: {error} \
                 (run the tests as root, or with CAP_NET_ADMIN and CAP_SYS_ADMIN)"
            );
        }
        let mut netns = Netns {
            ip,
            switch: switch.clone(),
            nodes: (0..nodes).map(|node| format!("{run}-{node}")).collect(),
            created: vec![switch],
            slot: None,
            etc: Vec::new(),
            etc_root_created: false,
        };
        netns.wire();
        netns
    }

    /// Creates the node namespaces, the peer network and the client links.
    fn wire(&mut self) {
        let switch = self.switch.clone();
        self.ip(&["-n", &switch, "link", "set", "lo", "up"]);
        self.ip(&["-n", &switch, "link", "add", BRIDGE, "type", "bridge"]);
        self.ip(&["-n", &switch, "link", "set", BRIDGE, "up"]);
        for node in 0..self.nodes.len() {
            let namespace = self.nodes[node].clone();
            self.ip(&["netns", "add", &namespace]);
            self.created.push(namespace.clone());
            self.ip(&["-n", &namespace, "link", "set", "lo", "up"]);
            let port = port(node);
            self.ip(&[
                "link", "add", "name", "peer0", "netns", &namespace, "type", "veth", "peer",
                "name", &port, "netns", &switch,
            ]);
            self.ip(&["-n", &switch, "link", "set", &port, "master", BRIDGE]);
            self.ip(&["-n", &switch, "link", "set", &port, "up"]);
            let peer = format!("{}/24", self.peer_ip(node));
            self.ip(&["-n", &namespace, "addr", "add", &peer, "dev", "peer0"]);
            self.ip(&["-n", &namespace, "link", "set", "peer0", "up"]);
            let outside = self.client_link(node);
            let slot = self.slot();
            let here = format!("{}/30", client_ip(slot, node, 1));
            self.ip(&["addr", "add", &here, "dev", &outside]);
            self.ip(&["link", "set", &outside, "up"]);
            let there = format!("{}/30", client_ip(slot, node, 2));
            self.ip(&["-n", &namespace, "addr", "add", &there, "dev", "client0"]);
            self.ip(&["-n", &namespace, "link", "set", "client0", "up"]);
        }
    }

    /// Creates node `node`'s client link (`client0` in its namespace); returns the name of
    /// its root-side end. The first one claims a slot: the first name no one holds.
    fn client_link(&mut self, node: usize) -> String {
        let namespace = self.nodes[node].clone();
        let create = |slot: u8| {
            let outside = format!("rk{slot}n{node}");
            let args = [
                "link", "add", "name", &outside, "type", "veth", "peer", "name", "client0",
                "netns", &namespace,
            ];
            run_ip(&self.ip, &args).map(|_| outside)
        };
        if let Some(slot) = self.slot {
            return create(slot).unwrap_or_else(|error| panic!("{error}"));
        }
        // Start at a pid-dependent slot, so parallel runs rarely try the same ones.
        let start = std::process::id() as u16 % SLOTS;
        for offset in 0..SLOTS {
            let slot = u8::try_from((start + offset) % SLOTS).unwrap_or_default();
            match create(slot) {
                Ok(outside) => {
                    self.slot = Some(slot);
                    return outside;
                }
                Err(error) if error.contains("File exists") => continue,
                Err(error) => panic!("{error}"),
            }
        }
        panic!("all {SLOTS} client link slots are taken (leftovers of killed runs? see `ip link`)");
    }

    fn slot(&self) -> u8 {
        match self.slot {
            Some(slot) => slot,
            None => panic!("no client link slot claimed yet"),
        }
    }

    /// Runs `ip args`; panics with the command and its stderr when it fails.
    fn ip(&self, args: &[&str]) -> String {
        run_ip(&self.ip, args).unwrap_or_else(|error| panic!("{error}"))
    }

    /// The namespace of node `node`.
    pub fn namespace(&self, node: usize) -> &str {
        &self.nodes[node]
    }

    /// The command prefix that runs a program in node `node`'s namespace.
    pub fn exec_prefix(&self, node: usize) -> [&str; 4] {
        [&self.ip, "netns", "exec", &self.nodes[node]]
    }

    /// Node `node`'s address on the peer network (where its peers reach it).
    pub fn peer_ip(&self, node: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, u8::try_from(node + 1).unwrap_or(u8::MAX))
    }

    /// Node `node`'s address on its client link (where the test reaches it).
    pub fn client_ip(&self, node: usize) -> IpAddr {
        IpAddr::V4(client_ip(self.slot(), node, 2))
    }

    /// Node `node`'s peer address (`--peer-addr` = `--advertise`), as every node writes it
    /// on its ring.
    pub fn peer(&self, node: usize) -> String {
        format!("{}:{NODE_PEER_PORT}", self.peer_ip(node))
    }

    /// Starts `ratekeeper serve` in node `node`'s namespace (called `name` in the output)
    /// on fixed ports ([`NODE_GRPC_PORT`], [`NODE_HTTP_PORT`] on every address, peers on
    /// [`Netns::peer`]), with `extra_args` (how it finds its peers); the test reaches it over
    /// its client link.
    pub fn start_node(
        &self,
        node: usize,
        name: &str,
        config: &Path,
        extra_args: &[&str],
    ) -> Ratekeeper {
        let grpc = format!("0.0.0.0:{NODE_GRPC_PORT}");
        let http = format!("0.0.0.0:{NODE_HTTP_PORT}");
        let admin = format!("0.0.0.0:{NODE_ADMIN_PORT}");
        let files = TempDir::new("netns-admin");
        let token = write_config(files.path(), "token", NODE_ADMIN_TOKEN);
        let token = token.to_string_lossy();
        let me = self.peer(node);
        let mut args = vec![
            "--grpc-addr",
            &grpc,
            "--http-addr",
            &http,
            "--admin-addr",
            &admin,
            "--admin-token-file",
            &token,
            "--peer-addr",
            &me,
            "--advertise",
            &me,
            // The peer network is this test's own namespaces: no certificates needed.
            "--peer-insecure",
        ];
        args.extend_from_slice(extra_args);
        let started =
            Ratekeeper::start_in(&self.exec_prefix(node), self.client_ip(node), config, &args)
                .with_admin_token(NODE_ADMIN_TOKEN)
                .keeping(files);
        assert_eq!(
            started.peer_addr().to_string(),
            me,
            "{name} serves peers where the others look"
        );
        eprintln!(
            "{name} in {}: grpc {} http {} peer {me}",
            self.namespace(node),
            started.grpc_addr(),
            started.http_addr()
        );
        started
    }

    /// Cuts node `node` off the peer network (its port on the switch goes down).
    pub fn cut(&self, node: usize) {
        self.ip(&["-n", &self.switch, "link", "set", &port(node), "down"]);
    }

    /// Puts node `node` back on the peer network.
    pub fn heal(&self, node: usize) {
        self.ip(&["-n", &self.switch, "link", "set", &port(node), "up"]);
    }

    /// Makes `name` resolve, for every program run in a node's namespace, to every node's
    /// peer address: writes `/etc/netns/<namespace>/hosts` (one line per node, plus
    /// `localhost`), which `ip netns exec` mounts over `/etc/hosts`, and `host.conf` with
    /// `multi on`, so glibc answers all the lines for the name and not only the first.
    /// Programs started before the call do not see the files. Panics when they cannot be
    /// written.
    pub fn resolve_to_all(&mut self, name: &str) {
        let lines: String = (0..self.nodes.len())
            .map(|node| format!("{} {name}\n", self.peer_ip(node)))
            .collect();
        self.add_hosts(|_| lines.clone());
    }

    /// Makes `name` resolve, in each node's namespace, to [`Netns::host_ip`]: the test's own
    /// address on that node's link (for a server the test runs, such as a control plane).
    pub fn resolve_to_host(&mut self, name: &str) {
        let ips: Vec<IpAddr> = (0..self.nodes.len())
            .map(|node| self.host_ip(node))
            .collect();
        self.add_hosts(|node| format!("{} {name}\n", ips[node]));
    }

    /// The test's own address on node `node`'s client link (reachable from that node only).
    pub fn host_ip(&self, node: usize) -> IpAddr {
        IpAddr::V4(client_ip(self.slot(), node, 1))
    }

    /// Adds `lines(node)` to each node's hosts file (made with `localhost` first).
    fn add_hosts(&mut self, lines: impl Fn(usize) -> String) {
        let root = Path::new(ETC_NETNS);
        if !root.exists() {
            // Nothing else of ours is there yet: remove it again when done (if empty).
            self.etc_root_created = true;
        }
        for (node, namespace) in self.nodes.iter().enumerate() {
            let dir = root.join(namespace);
            if !self.etc.contains(&dir) {
                self.etc.push(dir.clone());
            }
            let hosts = dir.join("hosts");
            let before = fs::read_to_string(&hosts)
                .unwrap_or_else(|_| "127.0.0.1 localhost\n::1 localhost\n".to_owned());
            let written = fs::create_dir_all(&dir)
                .and_then(|()| fs::write(&hosts, before + &lines(node)))
                .and_then(|()| fs::write(dir.join("host.conf"), "multi on\n"));
            if let Err(error) = written {
                panic!("cannot write {}: {error}", dir.display());
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for namespace in self.created.iter().rev() {
            // Only the test's own processes run in these namespaces (they are this run's).
            if let Ok(pids) = run_ip(&self.ip, &["netns", "pids", namespace]) {
                for pid in pids.split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", pid]).output();
                }
            }
        }
        // Sockets the dead processes left (e.g. retransmitting into a cut) would keep their
        // namespace, and its links, alive for minutes after the name is gone: abort them.
        let ss = find_program(&["ss"], &["/usr/sbin", "/sbin", "/usr/bin", "/bin"]);
        for namespace in &self.nodes {
            if let Some(ss) = &ss {
                let ss = ss.to_string_lossy();
                let _ = run_ip(
                    &self.ip,
                    &["netns", "exec", namespace, &ss, "-K", "-t", "-a"],
                );
            }
        }
        if let Some(slot) = self.slot {
            for node in 0..self.nodes.len() {
                // Also removes the node's end; fails for a link never made.
                let _ = run_ip(&self.ip, &["link", "del", &format!("rk{slot}n{node}")]);
            }
        }
        for namespace in self.created.iter().rev() {
            if let Err(error) = run_ip(&self.ip, &["netns", "del", namespace]) {
                eprintln!("cannot remove network namespace {namespace}: {error}");
            }
        }
        for dir in &self.etc {
            if let Err(error) = fs::remove_dir_all(dir)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                eprintln!("cannot remove {}: {error}", dir.display());
            }
        }
        if self.etc_root_created {
            // Fails, as it should, while another run still has files there.
            let _ = fs::remove_dir(ETC_NETNS);
        }
    }
}

/// Node `node`'s port on the switch.
fn port(node: usize) -> String {
    format!("n{node}")
}

/// Host `host` (1: the test's end, 2: the node's) of node `node`'s client link.
fn client_ip(slot: u8, node: usize, host: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        78,
        slot,
        u8::try_from(4 * node + host).unwrap_or(u8::MAX),
    )
}

/// Runs `ip args`: its stdout, or the command and what went wrong.
fn run_ip(ip: &str, args: &[&str]) -> Result<String, String> {
    let shown = format!("`ip {}`", args.join(" "));
    let output = Command::new(ip)
        .args(args)
        .output()
        .map_err(|error| format!("{shown}: cannot run {ip}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{shown} {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
