#!/usr/bin/env bash
# Replication figures for docs/benchmarks.md, all in one run on this machine: three brokers and
# one etcd on loopback (release build); produce throughput and ack latency with RF 1, RF 3
# acks=1 and RF 3 acks=all (min ISR 2); then RF 3 acks=all at half its measured rate for p99;
# then one follower link catching up a backlog (time to join the ISR). Results: $out/*.json.
# Each run starts after the previous topic's followers caught up. STRATA_IO_BACKEND=blocking
# runs the brokers on the blocking IO backend instead of io_uring.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/strata-target}"
cargo build --release -q
strata="$CARGO_TARGET_DIR/release/strata"
root=$(mktemp -d /var/tmp/strata-repl-bench.XXXXXX)
out="${1:-$root/results}"
mkdir -p "$out"
duration="${DURATION:-10}"
pids=()
cleanup() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$root"/node?/ "$root/etcd"; }
trap cleanup EXIT INT TERM
etcd --name bench --data-dir "$root/etcd" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster bench=http://127.0.0.1:23800 >"$root/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/23790) 2>/dev/null && break; sleep 0.1; done
for k in 1 2 3; do
    "$strata" serve --node-id "$k" --data-dir "$root/node$k" --etcd 127.0.0.1:23790 --cluster bench \
        --listen "127.0.0.1:$((17300 + 100 * k))" --admin "127.0.0.1:$((17380 + 100 * k))" \
        --shards 1 >"$root/node$k.log" 2>&1 &
    pids+=($!)
done
boot=127.0.0.1:17400
for _ in $(seq 1 100); do
    n=$("$strata" cluster info --bootstrap $boot --format json 2>/dev/null | grep -o '"id"' | wc -l || true)
    [ "$n" = 3 ] && break
    sleep 0.2
done
settle() { # waits until the previous topic's followers caught up: full ISR, high watermark still
    local topic=$1 last="" now
    for _ in $(seq 1 300); do
        now=$("$strata" topic describe "$topic" --bootstrap $boot --format json 2>/dev/null | python3 -c "
import json,sys
parts=json.load(sys.stdin)['partitions']
full=all(len(p['isr'])==len(p['replicas']) for p in parts)
print(sum(p['high_watermark'] or 0 for p in parts) if full else 'lagging')" || true)
        [ -n "$now" ] && [ "$now" != lagging ] && [ "$now" = "$last" ] && return
        last=$now
        sleep 1
    done
}
previous=""
run() { # name, extra flags...
    local name=$1; shift
    [ -n "$previous" ] && settle "$previous"
    previous=$name
    "$strata" bench produce --bootstrap $boot --topic "$name" --partitions 3 --producers 3 \
        --record-size 1024 --duration "$duration" --warmup 1 --json "$out/$name.json" "$@" >"$out/$name.txt"
    echo "== $name"; cat "$out/$name.txt"
}
run rf1 --replication-factor 1 --acks 1
run rf3-acksall --replication-factor 3 --min-insync 2 --acks all
rate=$(python3 -c "import json;print(int(json.load(open('$out/rf3-acksall.json'))['records_per_s']/2))")
run rf3-acksall-half --replication-factor 3 --min-insync 2 --acks all --rate "$rate"
rate1=$(python3 -c "import json;print(int(json.load(open('$out/rf1.json'))['records_per_s']/2))")
run rf1-half --replication-factor 1 --acks 1 --rate "$rate1"
# Last: acks=1 does not wait for followers, so they may end far behind.
run rf3-acks1 --replication-factor 3 --acks 1

# One follower link: a 1-partition RF 1 topic with a backlog, then a second replica added.
settle "$previous"
"$strata" topic create backlog --partitions 1 --bootstrap $boot >/dev/null
"$strata" bench produce --bootstrap $boot --topic backlog --partitions 1 --producers 1 \
    --record-size 16384 --records "${BACKLOG_RECORDS:-40000}" --acks 1 --json "$out/backlog.json" >/dev/null
leader=$("$strata" topic describe backlog --bootstrap $boot --format json | python3 -c "import json,sys;print(json.load(sys.stdin)['partitions'][0]['leader'])")
other=$(( leader % 3 + 1 ))
bytes=$(du -sb "$root/node$leader/backlog-0" | cut -f1)
start=$(date +%s.%N)
"$strata" topic reassign backlog --replicas "$leader,$other" --bootstrap $boot >/dev/null
while :; do
    isr=$("$strata" topic describe backlog --bootstrap $boot --format json | python3 -c "import json,sys;print(len(json.load(sys.stdin)['partitions'][0]['isr']))")
    [ "$isr" = 2 ] && break
    sleep 0.05
done
end=$(date +%s.%N)
python3 - "$bytes" "$start" "$end" <<'PY' | tee "$out/follower-link.txt"
import sys
size, start, end = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"follower catch-up: {size/1e6:.0f} MB in {end-start:.2f} s = {size/(end-start)/1e6:.0f} MB/s (one partition, one link)")
PY
echo "results in $out"
