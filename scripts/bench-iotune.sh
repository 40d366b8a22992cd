#!/usr/bin/env bash
# iotune's settings vs the defaults, for docs/performance.md, on the host it runs on:
# `strata iotune` measures a data dir, then each measurement starts a fresh single node
# (release build, 2 shards) either with that io-properties file or without one, and runs
# `strata bench produce` on a flush=always topic (where group commits matter): at max rate, and
# open loop at a fixed rate for latency. Pairs alternate (defaults, tuned) to share the
# machine's noise.
# Results go to $1 (default: a temp dir). ROUNDS (default 3), DURATION (default 6 s).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
cargo build --release -q -p strata-cli
strata="$CARGO_TARGET_DIR/release/strata"
root=$(mktemp -d /var/tmp/strata-iotune-bench.XXXXXX)
out="${1:-$root/results}"
mkdir -p "$out"
duration="${DURATION:-6}"
rounds="${ROUNDS:-3}"
rate="${RATE:-100000}"
boot=127.0.0.1:17500
pid=""

"$strata" iotune --data-dir "$root/probe" --duration "${IOTUNE_DURATION:-20s}" | tee "$out/iotune.txt"
cp "$root/probe/io-properties.toml" "$out/io-properties.toml"

start_node() { # with-properties: yes|no
    rm -rf "$root/node"
    mkdir -p "$root/node"
    [ "$1" = yes ] && cp "$out/io-properties.toml" "$root/node/io-properties.toml"
    "$strata" serve --data-dir "$root/node" --listen $boot --admin 127.0.0.1:17580 --shards 2 \
        >"$root/node.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/17500) 2>/dev/null && return; sleep 0.1; done
    echo "the node did not start" >&2
    exit 1
}
stop_node() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    pid=""
    rm -rf "$root/node"
    sync
    sleep 1
}
trap 'stop_node' EXIT INT TERM

for round in $(seq 1 "$rounds"); do
    for mode in defaults tuned; do
        for load in max rate; do
            start_node "$([ $mode = tuned ] && echo yes || echo no)"
            "$strata" topic create t --partitions 4 --config flush=always --bootstrap $boot >/dev/null
            extra=()
            [ $load = rate ] && extra=(--rate "$rate")
            "$strata" bench produce --bootstrap $boot --topic t --producers 4 --record-size 1024 \
                --acks 1 --duration "$duration" --warmup 1 --json "$out/$mode-$load-$round.json" \
                "${extra[@]}" >"$out/$mode-$load-$round.txt"
            stop_node
            python3 -c "import json,sys; r=json.load(open('$out/$mode-$load-$round.json')); a=r['ack_latency_us']; print(f'$mode $load round $round: {r[\"records_per_s\"]:.0f} rec/s {r[\"mb_per_s\"]:.1f} MB/s p50 {a[\"p50\"]} us p99 {a[\"p99\"]} us p999 {a[\"p999\"]} us')"
        done
    done
done
