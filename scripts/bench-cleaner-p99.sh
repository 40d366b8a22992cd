#!/usr/bin/env bash
# Produce latency on a shard while a compacted partition of the same shard is cleaned, against
# the same run without cleaning, alternated in each round (A: no clean, B: cleaning), a fresh
# node and data dir per run, one shard. Prints each run's p50/p99/p99.9 and the broker's CPU,
# and the B/A ratios of the p99 with their spread.
#
#   scripts/bench-cleaner-p99.sh path/to/strata [ROUNDS]      (ROUNDS default 3)
#
# Before each run, TABLE_RECORDS (default 1000000) records of 1 KiB over 50,000 keys go to the
# compacted topic `table` with min.compaction.lag.ms of an hour (nothing cleanable). Run B then
# sets the lag to 0, so the shard's cleaner works through them while the load runs; run A does
# not. The load: RATE (default 40000) records/s of 1 KiB, open loop, for DURATION (default 20s)
# to the topic `load`. CLEANER_IO (default 150MB) is --cleaner-io-bytes-per-sec, which spreads
# the clean over the run.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 path/to/strata [ROUNDS]" >&2
    exit 2
fi
strata="$1"
rounds="${2:-3}"
dir="${BENCH_DIR:-${TMPDIR:-/tmp}/strata-bench-cleaner}"
port="${BENCH_PORT:-7500}"
admin_port=$((port + 80))
bootstrap="127.0.0.1:$port"
results="$(mktemp -d)"
node_pid=""

source "$(dirname "$0")/lib/bench-node.sh"
trap 'stop_node; rm -rf "$results"' EXIT


metric() {
    curl -s "http://127.0.0.1:$admin_port/metrics" |
        awk -v name="$1" '$1 ~ "^"name"[{ ]" || $1 == name { sum += $2 } END { print sum + 0 }'
}

run_once() {
    local label="$1" round="$2"
    rm -rf "$dir" && mkdir -p "$dir"
    "$strata" serve --shards 1 --data-dir "$dir/data" --listen "$bootstrap" \
        --admin "127.0.0.1:$admin_port" --cleaner-backoff-ms 500 \
        --cleaner-io-bytes-per-sec "${CLEANER_IO:-150MB}" >"$dir/node.log" 2>&1 &
    node_pid=$!
    for _ in $(seq 100); do
        "$strata" cluster info --bootstrap "$bootstrap" >/dev/null 2>&1 && break
        sleep 0.1
    done
    "$strata" bench produce --bootstrap "$bootstrap" --topic table --partitions 1 \
        --topic-config cleanup.policy=compact --topic-config min.compaction.lag.ms=3600000 \
        --topic-config segment.bytes=67108864 --key-distribution uniform --keys 50000 \
        --record-size 1024 --records "${TABLE_RECORDS:-1000000}" >/dev/null
    "$strata" bench produce --bootstrap "$bootstrap" --topic load --partitions 1 \
        --record-size 1024 --records 1000 >/dev/null
    if [ "$label" = B ]; then
        "$strata" topic alter table --bootstrap "$bootstrap" --config min.compaction.lag.ms=0 >/dev/null
    fi
    local before after busy_before busy_after
    before="$(cpu_seconds "$node_pid")"
    busy_before="$(metric strata_log_cleaner_busy_seconds_total)"
    "$strata" bench produce --bootstrap "$bootstrap" --topic load --record-size 1024 \
        --rate "${RATE:-40000}" --duration "${DURATION:-20s}" \
        --json "$results/$label-$round.json" >/dev/null
    after="$(cpu_seconds "$node_pid")"
    # The cleaner's counters move when a clean ends: wait for B's (it began during the load).
    if [ "$label" = B ]; then
        for _ in $(seq 240); do
            [ "$(metric strata_log_cleaner_cleans_total)" != 0 ] && break
            sleep 0.5
        done
    fi
    busy_after="$(metric strata_log_cleaner_busy_seconds_total)"
    echo "$before $after $busy_before $busy_after $(metric strata_log_cleaner_read_bytes_total)" \
        >"$results/$label-$round.cpu"
    stop_node
}

for round in $(seq "$rounds"); do
    run_once A "$round"
    run_once B "$round"
done

python3 - "$results" "$rounds" <<'PY'
import json, statistics, sys
results, rounds = sys.argv[1], int(sys.argv[2])
def row(label, round):
    report = json.load(open(f"{results}/{label}-{round}.json"))
    before, after, busy0, busy1, read = map(float, open(f"{results}/{label}-{round}.cpu").read().split())
    latency = report.get("ack_latency_us") or {}
    return latency, after - before, busy1 - busy0, read
print(f"{'run':<8}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'broker CPU s':>14}{'cleaning s':>12}{'cleaner read MB':>17}")
ratios = []
for round in range(1, rounds + 1):
    p99 = {}
    for label in ("A", "B"):
        latency, cpu, busy, read = row(label, round)
        p99[label] = latency.get("p99")
        cell = lambda key: f"{latency[key] / 1000:.2f}" if latency.get(key) else "-"
        print(f"{label}{round:<7}{cell('p50'):>9}{cell('p99'):>9}{cell('p999'):>10}{cpu:>14.1f}{busy:>12.1f}{read / 1e6:>17.0f}")
    if p99["A"] and p99["B"]:
        ratios.append(p99["B"] / p99["A"])
if ratios:
    print(f"p99 B/A (cleaning / not): median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
PY
