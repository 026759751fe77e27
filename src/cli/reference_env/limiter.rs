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

    /// `TRACING_ENABLED`: OTLP over gRPC to `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`.
    pub(super) fn tracing(&mut self) {
        if !self.is_true("TRACING_ENABLED") {
            let mut details = Self::named(&["TRACING_"]);
            details.retain(|name| *name != "TRACING_ENABLED");
            self.unused(&details, "TRACING_ENABLED is not true");
            return;
        }
        let fix = "ratekeeper exports spans over OTLP/gRPC only: set \
                   TRACING_EXPORTER_PROTOCOL=grpc and point OTEL_EXPORTER_OTLP_ENDPOINT at the \
                   collector's gRPC port";
        match self.get("TRACING_EXPORTER_PROTOCOL") {
            Some(protocol) if protocol.eq_ignore_ascii_case("grpc") => {}
            Some(protocol) => {
                self.refuse("TRACING_EXPORTER_PROTOCOL", format!("{protocol:?}: {fix}"));
                return;
            }
            None => {
                let text = format!("true exports over OTLP/HTTP unless told otherwise; {fix}");
                self.refuse("TRACING_ENABLED", text);
                return;
            }
        }
        self.applied("TRACING_EXPORTER_PROTOCOL");
        let endpoint = OTEL_ENDPOINTS
            .iter()
            .find_map(|variable| self.get(variable));
        match endpoint {
            Some(endpoint) => {
                self.set(
                    "otlp_endpoint",
                    "--otlp-endpoint",
                    Some(endpoint.to_owned()),
                    &["TRACING_ENABLED"],
                );
            }
            None if self.given("otlp_endpoint") => {
                self.out
                    .overridden
                    .push(("TRACING_ENABLED", "--otlp-endpoint"));
            }
            None => self.refuse(
                "TRACING_ENABLED",
                "needs OTEL_EXPORTER_OTLP_ENDPOINT (the collector, http://HOST:4317)",
            ),
        }
        self.copy(
            "TRACING_SERVICE_NAME",
            "otlp_service_name",
            "--otlp-service-name",
        );
        self.unused(
            &["TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID"],
            "spans carry service.name only (--otlp-service-name)",
        );
        self.unused(
            &["TRACING_SAMPLING_RATE"],
            "every ShouldRateLimit call is traced",
        );
    }
}
