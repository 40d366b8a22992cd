#!/usr/bin/env bash
# Strata at scale on one node (two shards), each scenario on a fresh data dir:
#
#   idle      a topic of 1 partition, then one of PARTITIONS (10,000) partitions (topic
#             settings IDLE_TOPIC_CONFIG, default direct.writes=never), each watched at rest for
#             IDLE_SECONDS (60): the broker's CPU, its resident memory per partition, its open
#             files (`strata bench idle`)
#   spread    produce with uniform keys across SPREAD (1,000) of those partitions against
#             across 8, alternately, ROUNDS rounds (`strata bench produce --spread`)
#   producers PRODUCERS (100) producers on connections of their own against 2, alternately
#             (`--own-connections`)
#   group     CONSUMERS (500) consumers of one group, one connection each, joining at once
#             on a topic of as many partitions while producers write GROUP_RATE records/s
#             (default 10 a partition): the time until every one has its first record (`strata bench e2e
#             --group`, the report's consumers_ready_s)
#   restart   a node holding RESTART_PARTITIONS (1,000) partitions and RESTART_BYTES (50 GB)
#             stopped cleanly, then killed with SIGKILL during a produce, each time started
#             again with `strata bench ready` probing: the time until it serves, and until
#             every partition answers from its leader. The page cache is dropped before each
#             start where this process may (root), so the start reads from the disk. Mind the
#             disk: the data dir takes RESTART_BYTES and more.
#
#   scripts/bench-scale.sh [SCENARIO ...]    (default: all five, in that order)
#
# Every figure goes to $OUT (default a temporary dir, printed at the end) as the bench's JSON;
# a summary line per run is printed. STRATA_BIN=path uses that binary instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
source scripts/lib/bench-node.sh
strata=$(strata_release_binary)
scenarios="${*:-idle spread producers group restart}"
rounds="${ROUNDS:-3}"
partitions="${PARTITIONS:-10000}"
idle_seconds="${IDLE_SECONDS:-60}"
spread="${SPREAD:-1000}"
spread_records="${SPREAD_RECORDS:-2000000}"
producers="${PRODUCERS:-100}"
producer_records="${PRODUCER_RECORDS:-2000000}"
consumers="${CONSUMERS:-500}"
restart_partitions="${RESTART_PARTITIONS:-1000}"
restart_bytes="${RESTART_BYTES:-50000000000}"
work="$(mktemp -d /var/tmp/strata-bench-scale.XXXXXX)"
out="${OUT:-$work/results}"
mkdir -p "$out"
node_pid=""
trap 'stop_node; rm -rf "$work/data"' EXIT
bootstrap=127.0.0.1:17900
admin=127.0.0.1:17980

node_start() {
    "$strata" serve --shards 2 --data-dir "$work/data" --listen "$bootstrap" --admin "$admin" \
        >>"$work/node.log" 2>&1 &
    node_pid=$!
}

fresh_node() {
    stop_node
    rm -rf "$work/data" && mkdir -p "$work/data"
    sync
    node_start
    wait_for_port 17900
}

bench() { # label, then the bench's arguments
    local label="$1"; shift
    "$strata" bench --bootstrap "$bootstrap" --json "$out/$label.json" "$@" | tee "$out/$label.txt"
}

# Writes what the kernel holds dirty and drops the page cache, where this process may.
cold_cache() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then
        echo 3 >/proc/sys/vm/drop_caches
        echo "(page cache dropped)"
    else
        echo "(page cache kept: not root)"
    fi
}

for scenario in $scenarios; do
    case "$scenario" in
    idle)
        fresh_node
        bench idle-1 idle --topic one --partitions 1 --warmup 10s \
            --duration "${idle_seconds}s" --broker-admin "$admin"
        # Through the page cache (IDLE_TOPIC_CONFIG): with direct writes on, each partition
        # holds its log open twice (buffered and O_DIRECT), and 10,000 partitions need a
        # descriptor limit above 20,000.
        bench "idle-$partitions" idle --topic many --partitions "$partitions" --warmup 10s \
            --duration "${idle_seconds}s" --broker-admin "$admin" \
            --topic-config "${IDLE_TOPIC_CONFIG:-direct.writes=never}"
        ;;
    spread)
        # On the idle scenario's topic when it ran, else on a fresh one of as many partitions.
        if ! kill -0 "${node_pid:-0}" 2>/dev/null; then fresh_node; fi
        for round in $(seq "$rounds"); do
            for across in 8 "$spread"; do
                bench "spread-$across-$round" produce --topic many --partitions "$partitions" \
                    --spread "$across" --key-distribution uniform --keys 100000 \
                    --records "$spread_records" --broker-admin "$admin"
            done
        done
        ;;
    producers)
        for round in $(seq "$rounds"); do
            for count in 2 "$producers"; do
                fresh_node
                bench "producers-$count-$round" produce --topic load --partitions "$producers" \
                    --producers "$count" --own-connections --records "$producer_records" \
                    --broker-admin "$admin"
            done
        done
        ;;
    group)
        fresh_node
        for round in $(seq "$rounds"); do
            bench "group-$consumers-$round" e2e --topic members --partitions "$consumers" \
                --key-distribution uniform --keys 100000 --rate "${GROUP_RATE:-$((consumers * 10))}" \
                --duration 30s --group "join-$round" --consumers "$consumers" \
                --own-connections --broker-admin "$admin"
        done
        ;;
    restart)
        fresh_node
        record_size=65536
        # Without blocks reserved ahead of appends (RESTART_TOPIC_CONFIG): reserved, each
        # partition's active segment takes up to a step (32 MiB) more disk than its data, up
        # to 32 GB more over 1,000 partitions.
        bench restart-fill produce --topic stored --partitions "$restart_partitions" \
            --topic-config "${RESTART_TOPIC_CONFIG:-preallocate.step.bytes=0}" \
            --record-size "$record_size" --batch-size 1MiB \
            --records "$((restart_bytes / record_size))" --broker-admin "$admin"
        du -sh "$work/data" | tee "$out/restart-size.txt"
        stop_node
        cold_cache
        node_start
        bench restart-clean ready --topic stored --duration 600s
        # A produce cut short by SIGKILL: its unsynced tail is what recovery validates.
        "$strata" bench produce --bootstrap "$bootstrap" --topic stored --record-size 1024 \
            --duration 30s >/dev/null 2>&1 &
        load_pid=$!
        sleep 10
        kill -9 "$node_pid"
        wait "$node_pid" 2>/dev/null || true
        wait "$load_pid" 2>/dev/null || true
        node_pid=""
        cold_cache
        node_start
        bench restart-kill9 ready --topic stored --duration 600s
        ;;
    *) echo "unknown scenario $scenario (idle, spread, producers, group, restart)" >&2; exit 2 ;;
    esac
done
stop_node
echo "== reports in $out"
