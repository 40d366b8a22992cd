#!/usr/bin/env bash
# Two builds of `strata` side by side: the pinned producer and then the pinned consumer, run on
# build A and build B alternately (A B A B ...), a fresh node and data dir per run, and the
# broker's CPU time read from /proc. Prints one row per run and the B/A ratios with their
# spread. Use it to show that a change leaves the hot path where it was.
#
#   scripts/bench-builds.sh A/strata B/strata [ROUNDS]      (ROUNDS default 3)
#
# BENCH_BYTES (default 2000000000) is what each producer run writes; BENCH_DIR (default
# $TMPDIR/strata-bench-builds) holds the data dir, emptied before each run.
#
# The two sides may also be one build run two ways (security on and off, say):
#   A_SCHEME / B_SCHEME         the client listener's scheme (default plaintext): ssl, sasl_ssl
#   A_SERVE_ARGS / B_SERVE_ARGS more `strata serve` flags (TLS files, --authorizer acl, ...)
#   A_CLIENT_ARGS / B_CLIENT_ARGS more client flags (--tls-ca, --user, ...), for bench and setup
#   A_SETUP / B_SETUP           a command run once the node is up (with $STRATA and $BOOTSTRAP
#                               set), e.g. to create users and ACLs
# with the environment (STRATA_PASSWORD, STRATA_BOOTSTRAP_USER) passed to both.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 A/strata B/strata [ROUNDS]" >&2
    exit 2
fi
builds=("$1" "$2")
rounds="${3:-3}"
bytes="${BENCH_BYTES:-2000000000}"
dir="${BENCH_DIR:-${TMPDIR:-/tmp}/strata-bench-builds}"
port="${BENCH_PORT:-7400}"
results="$(mktemp -d)"
node_pid=""

source "$(dirname "$0")/lib/bench-node.sh"
trap 'stop_node; rm -rf "$results"' EXIT


run_once() {
    local label="$1" binary="$2" round="$3"
    local scheme_var="${label}_SCHEME" serve_var="${label}_SERVE_ARGS"
    local client_var="${label}_CLIENT_ARGS" setup_var="${label}_SETUP"
    local scheme="${!scheme_var:-plaintext}"
    local -a serve_args client_args
    read -r -a serve_args <<<"${!serve_var:-}"
    read -r -a client_args <<<"${!client_var:-}"
    local bootstrap="$scheme://127.0.0.1:$port"
    rm -rf "$dir" && mkdir -p "$dir"
    "$binary" serve --shards 2 --data-dir "$dir/data" --listen "$bootstrap" "${serve_args[@]}" \
        >"$dir/node.log" 2>&1 &
    node_pid=$!
    for _ in $(seq 100); do
        "$binary" cluster info --bootstrap "$bootstrap" "${client_args[@]}" >/dev/null 2>&1 && break
        sleep 0.1
    done
    if [ -n "${!setup_var:-}" ]; then
        STRATA="$binary" BOOTSTRAP="$bootstrap" bash -c "${!setup_var}" >/dev/null
    fi
    local before after
    before="$(cpu_seconds "$node_pid")"
    "$binary" bench --bootstrap "$bootstrap" "${client_args[@]}" --preset pinned-producer --producers 2 \
        --total-bytes "$bytes" --json "$results/$label-$round-produce.json" >/dev/null
    after="$(cpu_seconds "$node_pid")"
    echo "$before $after" >"$results/$label-$round-produce.cpu"
    before="$after"
    "$binary" bench --bootstrap "$bootstrap" "${client_args[@]}" --preset pinned-consumer --consumers 2 \
        --total-bytes "$bytes" --json "$results/$label-$round-consume.json" >/dev/null
    after="$(cpu_seconds "$node_pid")"
    echo "$before $after" >"$results/$label-$round-consume.cpu"
    stop_node
}

for round in $(seq "$rounds"); do
    run_once A "${builds[0]}" "$round"
    run_once B "${builds[1]}" "$round"
done

python3 - "$results" "$rounds" <<'EOF'
import json, statistics, sys
results, rounds = sys.argv[1], int(sys.argv[2])
def row(label, round, workload):
    report = json.load(open(f"{results}/{label}-{round}-{workload}.json"))
    before, after = map(float, open(f"{results}/{label}-{round}-{workload}.cpu").read().split())
    gb = report["bytes"] / 1e9
    p99 = (report.get("batch_latency_us") or {}).get("p99")
    return report["mb_per_s"], (after - before) / gb, p99
print(f"{'run':<14}{'MB/s':>10}{'broker CPU s/GB':>18}{'batch p99 ms':>14}")
for workload in ("produce", "consume"):
    ratios = {"MB/s": [], "CPU s/GB": []}
    for round in range(1, rounds + 1):
        a, b = row("A", round, workload), row("B", round, workload)
        for label, (mb, cpu, p99) in (("A", a), ("B", b)):
            p99_ms = f"{p99 / 1000:.1f}" if p99 else "-"
            print(f"{workload} {label}{round:<6}{mb:>10.0f}{cpu:>18.2f}{p99_ms:>14}")
        ratios["MB/s"].append(b[0] / a[0])
        ratios["CPU s/GB"].append(b[1] / a[1] if a[1] else float("nan"))
    for name, values in ratios.items():
        print(f"{workload} B/A {name}: median {statistics.median(values):.3f}, "
              f"range {min(values):.3f}-{max(values):.3f}")
EOF
