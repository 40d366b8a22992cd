#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). Installs what it needs when
# missing, so it works on a fresh Debian machine with Rust.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build outside the clone so repeated runs (and fresh clones in CI) build incrementally.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/strata-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# Debian packages the build and tests use, as "command:package": etcd-client's build needs
# protoc; the control-plane tests start a real etcd; the dashboard test runs headless Chromium;
# the network-partition and soak tests build namespaces (ip) and cut links (iptables); the Kafka
# listener's tests produce and consume with kcat (librdkafka, a real Kafka client).
required=("protoc:protobuf-compiler" "etcd:etcd-server" "chromium:chromium" "ip:iproute2" "iptables:iptables" "kcat:kcat" "node:nodejs" "npm:npm")
need_apt=()
for pair in "${required[@]}"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "installing: ${need_apt[*]}"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# kafka-python: a second Kafka client, independent of librdkafka, for the Kafka listener's tests.
if ! python3 -c 'from kafka import KafkaProducer' >/dev/null 2>&1; then
    echo "installing kafka-python"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
        kafka-python==3.0.12
fi
# kafkajs: a third Kafka client (JavaScript, on the machine's Node.js), kept outside the clone.
export STRATA_KAFKAJS_DIR="${STRATA_KAFKAJS_DIR:-/var/tmp/strata-kafkajs}"
if [ ! -f "$STRATA_KAFKAJS_DIR/node_modules/kafkajs/package.json" ]; then
    echo "installing kafkajs"
    mkdir -p "$STRATA_KAFKAJS_DIR"
    npm install --prefix "$STRATA_KAFKAJS_DIR" --no-audit --no-fund --silent kafkajs@2.2.4
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# Cargo names a workspace crate's artifacts by its path *within* the workspace, and judges them
# fresh by the source files they were built from, so a cache last built from another checkout
# (another clone, a worktree) would look up to date while holding that checkout's code. Rebuild
# the workspace's own crates (dependencies stay cached) whenever the checkout changes.
mkdir -p "$CARGO_TARGET_DIR"
source_marker="$CARGO_TARGET_DIR/.strata-checkout"
if [ "$(cat "$source_marker" 2>/dev/null)" != "$PWD" ]; then
    echo "== the cache was built from another checkout: rebuilding the workspace crates"
    cargo clean --quiet -p strata-wire -p strata-node -p strata-coordinator -p strata-client \
        -p strata-bench -p strata-tuning -p strata-kafka
    echo "$PWD" > "$source_marker"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast
