#!/usr/bin/env bash
# librdkafka's own regression suite against one Strata node: a Kafka client's authors' view of
# what a broker must do.
#
#   scripts/rdkafka-suite.sh                 every broker-facing test (0001-0999), a table
#   scripts/rdkafka-suite.sh 0001 0017 0081  those tests only
#   scripts/rdkafka-suite.sh --gate          the tests in scripts/rdkafka-gate.txt; exits
#                                            non-zero if one of them does not pass (CI runs it);
#                                            those tagged kip848 run twice, the second time with
#                                            group.protocol=consumer (NNNN:consumer in the table)
#   scripts/rdkafka-suite.sh 0030:consumer   a test with group.protocol=consumer
#
# Builds librdkafka and its test runner from ../shared/peers/librdkafka-*-src.tar.gz (BSD-2)
# into /var/tmp/strata-rdkafka (once), installs the Debian packages that build needs when
# missing, starts a fresh release-built node with a Kafka listener, runs each test number in a
# process of its own (after a failure the runner skips a number's remaining variants), and
# restarts the node if a test took it down. Logs: $STRATA_RDKAFKA_LOGS (default a temporary
# directory, printed). Not quick mode: -Q skips sub-tests and still reports PASSED.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

gate=false
tests=()
for arg in "$@"; do
    case "$arg" in
        --gate) gate=true ;;
        [0-9][0-9][0-9][0-9] | [0-9][0-9][0-9][0-9]:consumer) tests+=("$arg") ;;
        *) echo "usage: $0 [--gate | NNNN ...]" >&2; exit 2 ;;
    esac
done

tarball="$(ls "$repo"/../shared/peers/librdkafka-*-src.tar.gz 2>/dev/null | head -1 || true)"
[ -n "$tarball" ] || { echo "no librdkafka source in ../shared/peers" >&2; exit 1; }
version="$(basename "$tarball" | sed 's/^librdkafka-\(.*\)-src.tar.gz$/\1/')"
root="${STRATA_RDKAFKA_DIR:-/var/tmp/strata-rdkafka}/$version"
src="$root/librdkafka"

# --- build (once per tarball and recipe) ----------------------------------------------------
# RapidJSON lets the runner check the statistics JSON some tests read (0098, 0101, 0110).
source scripts/lib/debian-packages.sh
packages=(build-essential libssl-dev libsasl2-dev libzstd-dev liblz4-dev zlib1g-dev rapidjson-dev)
recipe="configure --disable-gssapi; ${packages[*]}"
if [ ! -x "$src/tests/test-runner" ] || [ "$(cat "$root/recipe" 2>/dev/null)" != "$recipe" ]; then
    install_debian_packages "${packages[@]}"
    echo "== building librdkafka $version and its test runner in $root"
    rm -rf "$root"
    mkdir -p "$root"
    tar -xzf "$tarball" -C "$root"
    (
        cd "$src"
        ./configure --disable-gssapi >"$root/configure.log" 2>&1
        make -j"$(nproc)" libs >"$root/make.log" 2>&1
        make -C tests -j"$(nproc)" test-runner >>"$root/make.log" 2>&1
    ) || { echo "librdkafka build failed; see $root/*.log" >&2; exit 1; }
    echo "$recipe" >"$root/recipe"
fi

# --- the tests to run -----------------------------------------------------------------------
gate_file="$repo/scripts/rdkafka-gate.txt"
if $gate; then
    mapfile -t tests < <(
        sed 's/#.*//' "$gate_file" | awk 'NF {print $1}'
        sed 's/#.*//' "$gate_file" | awk '$3 == "kip848" {print $1 ":consumer"}'
    )
elif [ "${#tests[@]}" -eq 0 ]; then
    # Every numbered test below 1000 but those against librdkafka's mock cluster, which never
    # reach the broker (0000 is the runner's own unit tests, local only).
    mapfile -t tests < <(cd "$src/tests" && ls [0-9][0-9][0-9][0-9]-*.c [0-9][0-9][0-9][0-9]-*.cpp 2>/dev/null \
        | grep -v mock | cut -c1-4 | sort -u | awk '$1 > "0000" && $1 < "1000"')
fi

# --- the node -------------------------------------------------------------------------------
source scripts/lib/build-cache.sh
cargo build --release --locked --bin strata -q
strata="$CARGO_TARGET_DIR/release/strata"

logs="${STRATA_RDKAFKA_LOGS:-$(mktemp -d -t strata-rdkafka.XXXXXX)}"
mkdir -p "$logs"
work="$(mktemp -d -t strata-rdkafka-node.XXXXXX)"
base_port="${STRATA_RDKAFKA_PORT:-19300}"
kafka_port=$((base_port + 92))
node=""

start_node() {
    "$strata" serve --data-dir "$work/data" --listen "127.0.0.1:$base_port" \
        --replication "127.0.0.1:$((base_port + 1))" --admin "127.0.0.1:$((base_port + 80))" \
        --kafka-listen "127.0.0.1:$kafka_port" --kafka-auto-create-topics \
        --num-partitions 4 >>"$logs/node.log" 2>&1 &
    node=$!
    for _ in $(seq 1 300); do
        if ! kill -0 "$node" 2>/dev/null; then
            echo "the node did not start; $logs/node.log:" >&2
            tail -20 "$logs/node.log" >&2
            exit 1
        fi
        (exec 3<>"/dev/tcp/127.0.0.1/$kafka_port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "the node's Kafka listener did not open" >&2
    exit 1
}
stop_node() {
    [ -n "$node" ] && kill -TERM "$node" 2>/dev/null && wait "$node" 2>/dev/null || true
}
trap 'stop_node; rm -rf "$work"' EXIT
start_node

cat >"$work/test.conf" <<EOF
bootstrap.servers=127.0.0.1:$kafka_port
EOF

# --- run ------------------------------------------------------------------------------------
echo "== ${#tests[@]} tests against Strata on 127.0.0.1:$kafka_port (logs in $logs)"
printf '%-6s %-8s %6s  %s\n' test result secs "first failure"
passed=0 failed=0 skipped=0 restarts=0
failed_gate=()
# 0113 (cooperative rebalancing) alone runs about 10 minutes.
per_test_timeout="${STRATA_RDKAFKA_TEST_TIMEOUT:-1200}"
for entry in "${tests[@]}"; do
    # NNNN:consumer: the test's consumers use KIP-848's group protocol.
    test="${entry%%:*}"
    protocol=""
    [ "$entry" != "$test" ] && protocol=consumer
    log="$logs/${entry/:/-}.log"
    # The share consumer's tests (0170-0190) run only against a broker of 4.2 or later; the
    # rest keep the 3.9 profile the gate was taken with.
    kafka_version=3.9.0
    if [ "$test" \> 0169 ] && [ "$test" \< 0191 ]; then kafka_version=4.2.0; fi
    started=$(date +%s)
    # The runner aborts (SIGABRT) on a failure: its status is written down inside the
    # subshell, so the abort is reported into the test's log rather than this table.
    (
        cd "$src/tests"
        if [ -n "$protocol" ]; then export TEST_CONSUMER_GROUP_PROTOCOL="$protocol"; fi
        TESTS="$test" RDKAFKA_TEST_CONF="$work/test.conf" TEST_KAFKA_VERSION="$kafka_version" \
            LD_LIBRARY_PATH="../src:../src-cpp" \
            timeout --kill-after=10 "$per_test_timeout" ./test-runner -p1 -L
        echo $? >"$logs/${entry/:/-}.status"
    ) >"$log" 2>&1 || true
    status="$(cat "$logs/${entry/:/-}.status" 2>/dev/null || echo 1)"
    secs=$(($(date +%s) - started))
    # The runner's summary has a row per test variant it ran: `| 0017_compression | PASSED |`.
    plain="$logs/${entry/:/-}.plain"
    sed 's/\x1b\[[0-9;]*m//g' "$log" >"$plain"
    rows="$(grep -E "^\|[[:space:]]*${test}_" "$plain" || true)"
    if [ "$status" -eq 0 ] && [ -n "$rows" ] \
        && ! grep -qv "Filtered due to negative test flags" <<<"$rows"; then
        # Every variant is a local test (no broker needed, or librdkafka's mock cluster): not
        # this suite's.
        result=LOCAL
    elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        result=HUNG
    elif grep -q "| *FAILED *|" <<<"$rows"; then
        result=FAILED
    elif grep -q "| *PASSED *|" <<<"$rows"; then
        result=PASSED
    elif grep -q "| *SKIPPED *|" <<<"$rows" || { [ -z "$rows" ] && [ "$status" -eq 0 ]; }; then
        result=SKIPPED
    else
        result=FAILED
    fi
    reason=""
    if [ "$result" = FAILED ] || [ "$result" = HUNG ]; then
        reason="$(grep -m1 -E "TEST FAILURE|Test failure|FAIL:|assert" "$plain" | cut -c1-160 || true)"
    elif [ "$result" = SKIPPED ]; then
        reason="$(grep -m1 -iE "skipping|skipped" "$plain" | cut -c1-160 || true)"
    fi
    case "$result" in
        LOCAL) continue ;;
        PASSED) passed=$((passed + 1)) ;;
        SKIPPED) skipped=$((skipped + 1)) ;;
        *) failed=$((failed + 1)) ;;
    esac
    [ "$result" = PASSED ] || failed_gate+=("$entry:$result")
    printf '%-6s %-8s %6s  %s\n' "$entry" "$result" "$secs" "$reason"
    if ! kill -0 "$node" 2>/dev/null; then
        echo "       the node died during $test; restarting it (see $logs/node.log)"
        restarts=$((restarts + 1))
        failed_gate+=("node-died-$entry")
        start_node
    fi
done
echo "node restarts: $restarts"
echo "rdkafka: $passed passed, $failed failed, $skipped skipped"
if $gate && [ "${#failed_gate[@]}" -gt 0 ]; then
    echo "gate: these tests passed before and do not now: ${failed_gate[*]} (logs in $logs)" >&2
    exit 1
fi
