//! What the limiter answers and reports: the near-limit ratio, the over-limit behaviour,
//! response headers, the global modes, tracing (the stats are `stats`).

use super::{OTEL_ENDPOINTS, Reader};

impl Reader<'_> {
    pub(super) fn limiter(&mut self) {
        if let Some(ratio) = self.get("NEAR_LIMIT_RATIO") {
            match ratio.parse::<f64>() {
                Ok(value) if (0.0..=1.0).contains(&value) => {
                    self.set(
                        "near_limit_ratio",
                        "--near-limit-ratio",
                        Some(ratio.to_owned()),
                        &["NEAR_LIMIT_RATIO"],
                    );
                }
                _ => self.refuse(
                    "NEAR_LIMIT_RATIO",
                    format!("{ratio:?} is not a ratio from 0 to 1"),
                ),
            }
        }
        // The reference counts rejected hits unless this is true; set but empty is its
        // default, false. Unset keeps ratekeeper's default (a rejected request consumes
        // nothing), as every reference default does.
        let stop = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT";
        let (id, long) = ("count_rejected_hits", "--count-rejected-hits");
        let empty = self.env.get(stop).is_some_and(|value| value.is_empty());
        match self.bool(stop) {
            Some(false) => self.set(id, long, None, &[stop]),
            None if empty => {
                self.set(id, long, None, &[]);
                if !self.given(id) {
                    self.applied(stop);
                }
            }
            // ratekeeper's own behaviour.
            Some(true) if self.given(id) => self.out.overridden.push((stop, long)),
            Some(true) => self.applied(stop),
            None => {}
        }
        self.unused(
            &["EXPIRATION_JITTER_MAX_SECONDS"],
            "ratekeeper's keys expire when their window ends (plus --store-ttl-margin)",
        );
        self.unused(
            &["LOCAL_CACHE_SIZE_IN_BYTES"],
            "ratekeeper's over-limit cache is sized in keys (--store-blocked-keys, on by default)",
        );
        if self.is_true("LIMIT_RESPONSE_HEADERS_ENABLED") {
            let from = ["LIMIT_RESPONSE_HEADERS_ENABLED"];
            self.set(
                "response_headers",
                "--response-headers",
                Some("true".into()),
                &from,
            );
        }
        self.copy("LIMIT_LIMIT_HEADER", "header_limit", "--header-limit");
        self.copy(
            "LIMIT_REMAINING_HEADER",
            "header_remaining",
            "--header-remaining",
        );
        self.copy("LIMIT_RESET_HEADER", "header_reset", "--header-reset");
        self.switch(
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
            "healthy_only_with_config",
            "--healthy-only-with-config",
        );
        self.switch("SHADOW_MODE", "shadow_mode", "--shadow-mode");
        self.switch("QUOTA_MODE", "quota_mode", "--quota-mode");
        self.switch(
            "RESPONSE_DYNAMIC_METADATA",
            "response_dynamic_metadata",
            "--response-dynamic-metadata",
        );
    }

    /// `TRACING_ENABLED`: OTLP over HTTP (the reference's default) or gRPC to
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `_TRACES_ENDPOINT`, used as given), with the
    /// reference's sampling rate and resource attributes.
    pub(super) fn tracing(&mut self) {
        if !self.is_true("TRACING_ENABLED") {
            let mut details = Self::named(&["TRACING_"]);
            details.retain(|name| *name != "TRACING_ENABLED");
            self.unused(&details, "TRACING_ENABLED is not true");
            return;
        }
        self.tracing_protocol();
        self.tracing_endpoints();
        self.copy(
            "TRACING_SERVICE_NAME",
            "otlp_service_name",
            "--otlp-service-name",
        );
        self.copy(
            "TRACING_SERVICE_NAMESPACE",
            "otlp_service_namespace",
            "--otlp-service-namespace",
        );
        self.copy(
            "TRACING_SERVICE_INSTANCE_ID",
            "otlp_service_instance_id",
            "--otlp-service-instance-id",
        );
        if let Some(rate) = self.get("TRACING_SAMPLING_RATE") {
            let from = ["TRACING_SAMPLING_RATE"];
            match rate.parse::<f64>() {
                Ok(value) if (0.0..=1.0).contains(&value) => {
                    let (id, long) = ("otlp_sampling_rate", "--otlp-sampling-rate");
                    self.set(id, long, Some(rate.to_owned()), &from);
                }
                _ => self.refuse(
                    "TRACING_SAMPLING_RATE",
                    format!("{rate:?} is not a rate from 0 (no call traced) to 1 (every call)"),
                ),
            }
        }
    }

    /// `TRACING_EXPORTER_PROTOCOL` (`http` when unset, as in the reference) as
    /// `--otlp-protocol`.
    fn tracing_protocol(&mut self) {
        let variable = "TRACING_EXPORTER_PROTOCOL";
        let protocol = match self.get(variable).map(str::to_ascii_lowercase).as_deref() {
            None | Some("http") => "http",
            Some("grpc") => "grpc",
            Some(other) => {
                self.refuse(variable, format!("{other:?} is neither http nor grpc"));
                return;
            }
        };
        let from = ["TRACING_ENABLED", variable];
        self.set(
            "otlp_protocol",
            "--otlp-protocol",
            Some(protocol.to_owned()),
            &from,
        );
    }

    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as `--otlp-traces-endpoint` (used as given),
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` as `--otlp-endpoint` (OTLP/HTTP adds `/v1/traces`).
    fn tracing_endpoints(&mut self) {
        let [traces, base] = OTEL_ENDPOINTS;
        let ids = [
            (traces, "otlp_traces_endpoint", "--otlp-traces-endpoint"),
            (base, "otlp_endpoint", "--otlp-endpoint"),
        ];
        let mut any = false;
        for (variable, id, long) in ids {
            if let Some(endpoint) = self.get(variable) {
                any = true;
                self.set(id, long, Some(endpoint.to_owned()), &["TRACING_ENABLED"]);
            }
        }
        let ours = self.given("otlp_endpoint") || self.given("otlp_traces_endpoint");
        match (any, ours) {
            (true, _) => {}
            (false, true) => self
                .out
                .overridden
                .push(("TRACING_ENABLED", "--otlp-endpoint")),
            (false, false) => self.refuse(
                "TRACING_ENABLED",
                "needs OTEL_EXPORTER_OTLP_ENDPOINT (the collector: http://HOST:4318 for \
                 OTLP/HTTP, http://HOST:4317 with TRACING_EXPORTER_PROTOCOL=grpc)",
            ),
        }
    }
}
