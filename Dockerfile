# syntax=docker/dockerfile:1
#
# ratekeeper's container image:
#
#   docker build -t ratekeeper:latest .
#   docker run --rm ratekeeper:latest validate /etc/ratekeeper/limits
#   docker run --rm -p 8080:8080 -p 8081:8081 \
#     -e RATEKEEPER_GRPC_ADDR=0.0.0.0:8081 -e RATEKEEPER_HTTP_ADDR=0.0.0.0:8080 ratekeeper:latest
#
# The listeners keep the binary's loopback defaults (127.0.0.1:8081 for gRPC, :8080 for
# HTTP): as a sidecar, Envoy in the same pod reaches loopback and nothing else should reach
# the gRPC port. Bind 0.0.0.0 explicitly where the port must be reachable from outside the
# container (probes and metrics in deploy/kubernetes/deployment.yaml; a plain `docker run`).
# The admin listener (/counters, /debug/explain, /ui) stays on 127.0.0.1:6070 and is not
# exposed; binding it elsewhere needs RATEKEEPER_ADMIN_TOKEN_FILE (see docs/admin.md).

# --- build ----------------------------------------------------------------------------------
# Debian 12 (bookworm), like the runtime image below: the binary links the system glibc, so
# the builder's glibc must not be newer than the runtime's.
FROM rust:1-bookworm AS build
WORKDIR /src
# The whole package (see .dockerignore): sources, build.rs and proto/ for the generated peer
# protocol (compiled by protox, no protoc needed), benches/ because Cargo.toml names its
# bench targets and a path dev-dependency there.
COPY . .
# --locked: exactly the versions in Cargo.lock, failing instead of resolving anew.
# The cache mounts keep the registry and target dir between builds (BuildKit); the binary is
# copied out of the cached target dir in the same step. Debug info is stripped (the release
# profile keeps it for profiling); symbols stay, so backtraces keep function names.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ratekeeper \
    && install -D -m 0755 target/release/ratekeeper /out/ratekeeper \
    && strip --strip-debug /out/ratekeeper \
    && mkdir -p /out/bin \
    && ln -s /usr/local/bin/ratekeeper /out/bin/ratelimit

# --- runtime --------------------------------------------------------------------------------
# glibc, libgcc_s and CA certificates, no shell, no package manager; `nonroot` is uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ratekeeper /usr/local/bin/ratekeeper
# The reference's entry point, which Envoy Gateway's Deployment runs as its command:
# `ratekeeper serve` reading the reference's environment with its listener defaults
# (docs/migrating.md). A directory copy keeps the link a link.
COPY --from=build /out/bin/ /bin/
# The example limits, so the image serves something as is, at --config's default
# (config/, relative to the working directory); mount a ConfigMap (or any directory) over
# /etc/ratekeeper/config to replace them, or pass --config. No RATEKEEPER_* variable is set,
# so the reference service's RUNTIME_ROOT applies when this image replaces its.
WORKDIR /etc/ratekeeper
COPY config/ /etc/ratekeeper/config/
# Numeric, so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
USER 65532:65532
# 8080 HTTP (/healthcheck, /metrics, /rlconfig, POST /json), 8081 gRPC (Envoy's RLS),
# 8091 peers (counters shared between replicas).
EXPOSE 8080 8081 8091
# SIGTERM (Docker's and Kubernetes' stop signal) drains: /healthcheck turns 503, requests in
# flight are answered, counters are handed over, then exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/ratekeeper"]
CMD ["serve"]
