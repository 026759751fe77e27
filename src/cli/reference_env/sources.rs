//! Logs and where the limits come from: `LOG_*`, `CONFIG_TYPE`, the `RUNTIME_*` path of the
//! files, the `CONFIG_GRPC_XDS_*` / `XDS_CLIENT_*` subscription.

use std::path::PathBuf;

use super::{RUNTIME_ROOT, Reader, go_text};

impl Reader<'_> {
    pub(super) fn logs(&mut self) {
        if let Some(level) = self.get("LOG_LEVEL") {
            // logrus's levels; debug and trace for ratekeeper's own logs, so its libraries'
            // debug output does not drown them.
            let filter = match level.to_ascii_lowercase().as_str() {
                "trace" => Some("ratekeeper=trace,info"),
                "debug" => Some("ratekeeper=debug,info"),
                "info" => Some("info"),
                "warn" | "warning" => Some("warn"),
                "error" | "fatal" | "panic" => Some("error"),
                _ => None,
            };
            match filter {
                Some(filter) => self.set("log", "--log", Some(filter.to_owned()), &["LOG_LEVEL"]),
                None => self.refuse(
                    "LOG_LEVEL",
                    format!("{level:?} is not a level (trace, debug, info, warn, error)"),
                ),
            }
        }
        if let Some(format) = self.get("LOG_FORMAT") {
            match format.to_ascii_lowercase().as_str() {
                "text" => self.set(
                    "log_format",
                    "--log-format",
                    Some("text".into()),
                    &["LOG_FORMAT"],
                ),
                "json" => self.set(
                    "log_format",
                    "--log-format",
                    Some("json".into()),
                    &["LOG_FORMAT"],
                ),
                _ => self.refuse("LOG_FORMAT", format!("{format:?} is neither text nor json")),
            }
        }
    }

    /// `CONFIG_TYPE`; whether the limits come from xDS (or may: ratekeeper's own
    /// `--config-source` is given, so the xDS variables apply).
    pub(super) fn config_source(&mut self) -> bool {
        let Some(kind) = self.get("CONFIG_TYPE") else {
            return self.given("config_source");
        };
        let xds = match kind.to_ascii_uppercase().as_str() {
            "FILE" => false,
            "GRPC_XDS_SOTW" => true,
            _ => {
                self.refuse(
                    "CONFIG_TYPE",
                    format!("{kind:?}: ratekeeper reads limits from FILE or GRPC_XDS_SOTW"),
                );
                return false;
            }
        };
        let source = if xds { "xds" } else { "file" };
        self.set(
            "config_source",
            "--config-source",
            Some(source.into()),
            &["CONFIG_TYPE"],
        );
        xds || self.given("config_source")
    }

    /// The limits files: `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, every file
    /// under it (goruntime's view of it, whether it watches the root or the directory).
    pub(super) fn files(&mut self, xds: bool) {
        const PATH: [&str; 3] = [
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ];
        if self.get("CONFIG_TYPE").is_some() && xds {
            self.unused(
                &PATH,
                "the limits come from xDS (CONFIG_TYPE=GRPC_XDS_SOTW)",
            );
        } else if PATH.iter().any(|variable| self.get(variable).is_some()) {
            let mut path = PathBuf::from(self.get(PATH[0]).unwrap_or(RUNTIME_ROOT));
            for part in [
                self.get(PATH[1]).unwrap_or(""),
                self.get(PATH[2]).unwrap_or("config"),
            ] {
                // filepath.Join's way: a part's slashes do not make it absolute.
                let part = part.trim_matches('/');
                if !part.is_empty() {
                    path.push(part);
                }
            }
            let path = path.to_string_lossy().into_owned();
            self.set("config", "--config", Some(path), &PATH);
        }
        match self.bool("RUNTIME_IGNOREDOTFILES") {
            Some(true) => self.applied("RUNTIME_IGNOREDOTFILES"),
            Some(false) => self.warn(
                "RUNTIME_IGNOREDOTFILES",
                "ignored: ratekeeper always skips names starting with '.' (a ConfigMap mount's \
                 ..data directory would load every file twice)",
            ),
            None => {}
        }
        // Either way ratekeeper watches the directory, symlink swaps included.
        if self.bool("RUNTIME_WATCH_ROOT").is_some() {
            self.applied("RUNTIME_WATCH_ROOT");
        }
        self.switch(
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            "start_without_config",
            "--start-without-config",
        );
        self.switch(
            "MERGE_DOMAIN_CONFIG",
            "merge_domain_config",
            "--merge-domain-config",
        );
    }

    /// The `CONFIG_GRPC_XDS_*` / `XDS_CLIENT_*` subscription, when the limits come from xDS.
    pub(super) fn xds(&mut self, xds: bool) {
        let all = Self::named(&["CONFIG_GRPC_XDS_", "XDS_CLIENT_"]);
        if !xds {
            self.unused(
                &all,
                "the limits come from files (CONFIG_TYPE is not GRPC_XDS_SOTW)",
            );
            return;
        }
        if self.get("CONFIG_GRPC_XDS_SERVER_URL").is_none() && !self.given("xds_server") {
            self.refuse(
                "CONFIG_TYPE",
                "GRPC_XDS_SOTW needs CONFIG_GRPC_XDS_SERVER_URL (ratekeeper has no \
                 localhost:18000 default)",
            );
        }
        self.copy("CONFIG_GRPC_XDS_SERVER_URL", "xds_server", "--xds-server");
        self.copy("CONFIG_GRPC_XDS_NODE_ID", "xds_node_id", "--xds-node-id");
        self.copy(
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "xds_node_metadata",
            "--xds-node-metadata",
        );
        self.copy(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "xds_header",
            "--xds-header",
        );
        self.xds_backoff();
        self.unused(
            &["XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"],
            "ratekeeper accepts xDS responses up to 16 MiB",
        );
        self.xds_tls();
    }

    /// The delays between attempts to reach the management server.
    fn xds_backoff(&mut self) {
        let initial = [
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        ];
        for (at, variable) in initial.into_iter().enumerate() {
            let Some(delay) = self.duration(variable) else {
                continue;
            };
            if at == 0 || self.get(initial[0]).is_none() {
                self.set(
                    "xds_backoff_initial",
                    "--xds-backoff-initial",
                    Some(go_text(delay)),
                    &[variable],
                );
            } else {
                self.warn(
                    variable,
                    format!("ignored: {} sets the first retry delay", initial[0]),
                );
            }
        }
        self.copy_duration(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            "xds_backoff_max",
            "--xds-backoff-max",
        );
        self.unused(
            &[
                "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                "XDS_CLIENT_BACKOFF_JITTER",
            ],
            "ratekeeper always jitters each delay into its upper half",
        );
    }

    /// TLS to the management server (Envoy Gateway's: its CA, and the client certificate
    /// its control plane asks for). As in the reference, the certificate goes with its key
    /// (one alone is ignored), and the SAN, when set, is the name the server's certificate
    /// must be valid for.
    fn xds_tls(&mut self) {
        const FILES: [&str; 4] = [
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        ];
        if !self.is_true("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
            self.unused(&FILES, "CONFIG_GRPC_XDS_SERVER_USE_TLS is not true");
            return;
        }
        self.switch("CONFIG_GRPC_XDS_SERVER_USE_TLS", "xds_tls", "--xds-tls");
        match (self.get(FILES[0]), self.get(FILES[1])) {
            (Some(cert), Some(key)) => {
                self.set(
                    "xds_tls_cert",
                    "--xds-tls-cert",
                    Some(cert.to_owned()),
                    &[FILES[0]],
                );
                self.set(
                    "xds_tls_key",
                    "--xds-tls-key",
                    Some(key.to_owned()),
                    &[FILES[1]],
                );
            }
            (None, None) => {}
            (Some(_), None) => self.warn(
                FILES[0],
                "ignored: without CONFIG_GRPC_XDS_CLIENT_TLS_KEY no client certificate is \
                 presented (as in the reference)",
            ),
            (None, Some(_)) => self.warn(
                FILES[1],
                "ignored: without CONFIG_GRPC_XDS_CLIENT_TLS_CERT no client certificate is \
                 presented (as in the reference)",
            ),
        }
        self.copy(FILES[2], "xds_tls_ca", "--xds-tls-ca");
        self.copy(FILES[3], "xds_tls_san", "--xds-tls-san");
    }
}
