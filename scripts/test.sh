#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). Installs what it needs when
# missing, so it works on a fresh Debian machine with Rust.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use (the build needs none), as "command:package": the
# control-plane tests start a real etcd; the dashboard test runs headless Chromium; the
# network-partition and soak tests build namespaces (ip) and cut links (iptables); the Kafka
# listener's tests produce and consume with kcat (librdkafka, a real Kafka client). A command
# already on PATH (Node.js from elsewhere, say) needs no package.
source scripts/lib/debian-packages.sh
required=("etcd:etcd-server" "chromium:chromium" "ip:iproute2" "iptables:iptables" "kcat:kcat" "node:nodejs" "npm:npm")
need_apt=()
for pair in "${required[@]}"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
install_debian_packages "${need_apt[@]}"
# kafka-python: a second Kafka client, independent of librdkafka, for the Kafka listener's tests.
if ! python3 -c 'from kafka import KafkaProducer' >/dev/null 2>&1; then
    echo "installing kafka-python"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
        kafka-python==3.0.12
fi
# confluent-kafka: a current librdkafka (its wheel bundles 2.16), where kcat's Debian build is 2.0.2.
if ! python3 -c 'import confluent_kafka' >/dev/null 2>&1; then
    echo "installing confluent-kafka"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
        confluent-kafka==2.16.0
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

source scripts/lib/build-cache.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast
