#!/usr/bin/env bash
# Replication figures for docs/performance.md, on the host it runs on. Every measurement
# starts a fresh cluster (etcd + three brokers on loopback, release build, one shard each) and
# deletes it after, so no run inherits the previous one's page-cache writeback:
#   rf1, rf3-acks1, rf3-acksall at max rate; rf3-acksall-half and rf1-half at half of the
#   max-rate figure (open loop, for latency); follower: one follower link catching up a
#   backlog (time for a new replica to join the ISR); recovery: a producer's latency on a
#   leader while another partition's new replica catches up there.
# STRATA_IO_BACKEND=blocking runs the brokers on the blocking IO backend instead of io_uring.
# TOPIC_CONFIG="flush=never ..." creates each measured topic with those settings first.
# BENCH_ARGS="--linger-ms 0 ..." adds flags to every measured `strata bench produce`.
# SERVE_ARGS adds flags to every `strata serve`; default --overprovisioned (three brokers share
# this host's cores with the bench: pinned, their one shard each landed on the same CPU 0).
# SERVE_ARGS="" runs them without --overprovisioned: each pins its shard, all three to CPU 0.
# HALF_RATE=N runs the *-half measurements at N records/s instead of half the max measured
# (to compare two settings at the same load). ONLY="rf1 follower ..." runs just those measurements; STRATA_BIN=path uses that binary instead
# of building (to compare two builds side by side).
# BENCH_ROOT=/dev/shm puts the brokers' data on tmpfs (default /var/tmp): the follower link without
# the disk. BACKLOG_RECORDS sets the follower backlog (default 30000 records of 16 KiB).
# Results (JSON and text) go to $1 (default: a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
strata=$(strata_release_binary)
only=" ${ONLY:-rf1 rf3-acks1 rf3-acksall rf3-acksall-half rf1-half follower recovery} "
wanted() { [[ "$only" == *" $1 "* ]]; }
root=$(mktemp -d "${BENCH_ROOT:-/var/tmp}/strata-repl-bench.XXXXXX")
out="${1:-$root/results}"
mkdir -p "$out"
duration="${DURATION:-8}"
boot=127.0.0.1:17400
pids=()

start_cluster() {
    pids=()
    etcd --name bench --data-dir "$root/etcd" \
        --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
        --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
        --initial-cluster bench=http://127.0.0.1:23800 >"$root/etcd.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/23790) 2>/dev/null && break; sleep 0.1; done
    for k in 1 2 3; do
        "$strata" serve --node-id "$k" --data-dir "$root/node$k" --etcd 127.0.0.1:23790 --cluster bench \
            --listen "127.0.0.1:$((17300 + 100 * k))" --admin "127.0.0.1:$((17380 + 100 * k))" \
            --shards 1 ${SERVE_ARGS---overprovisioned} >"$root/node$k.log" 2>&1 &
        pids+=($!)
    done
    for _ in $(seq 1 100); do
        n=$("$strata" cluster info --bootstrap $boot --format json 2>/dev/null | grep -o '"alive":true' | wc -l || true)
        [ "$n" = 3 ] && return
        sleep 0.2
    done
    echo "the cluster did not start" >&2
    exit 1
}
stop_cluster() {
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    pids=()
    rm -rf "$root"/node? "$root/etcd"
    sync
    sleep 2
}
trap 'stop_cluster' EXIT INT TERM

run() { # name, bench flags...
    local name=$1; shift
    wanted "$name" || return 0
    start_cluster
    if [ -n "${TOPIC_CONFIG:-}" ]; then
        local create=() args=("$@") i
        for ((i = 0; i < ${#args[@]}; i++)); do
            case "${args[i]}" in
            --replication-factor | --min-insync) create+=("${args[i]}" "${args[i + 1]}") ;;
            esac
        done
        for setting in $TOPIC_CONFIG; do create+=(--config "$setting"); done
        "$strata" topic create "$name" --partitions 3 --bootstrap $boot "${create[@]}" >/dev/null
    fi
    "$strata" bench produce --bootstrap $boot --topic "$name" --partitions 3 --producers 3 \
        --record-size 1024 --duration "$duration" --warmup 1 --json "$out/$name.json" "$@" ${BENCH_ARGS:-} >"$out/$name.txt"
    replication_latency >>"$out/$name.txt"
    stop_cluster
    echo "== $name"; cat "$out/$name.txt"
}
# The leaders' replication latency (append to a follower holding it), over the three brokers:
# bucket upper bounds from /metrics, so each quantile is "at most".
replication_latency() {
    /usr/bin/python3 - <<'PY'
import urllib.request
buckets = {}
for k in (1, 2, 3):
    text = urllib.request.urlopen(f"http://127.0.0.1:{17380 + 100 * k}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith("strata_replication_latency_seconds_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = buckets.get(le, 0) + float(line.rsplit(" ", 1)[1])
ordered = sorted(((float(le), n) for le, n in buckets.items()), key=lambda b: b[0])
total = ordered[-1][1] if ordered else 0
if total:
    at = lambda q: next(le for le, n in ordered if n >= q * total)
    print(f"replication latency (leaders): {int(total)} samples, p50 <= {at(0.5) * 1e3:g} ms, p99 <= {at(0.99) * 1e3:g} ms, p99.9 <= {at(0.999) * 1e3:g} ms")
PY
}
half() { [ -n "${HALF_RATE:-}" ] && { echo "$HALF_RATE"; return; }; [ -f "$out/$1.json" ] || { echo 0; return; }; /usr/bin/python3 -c "import json;print(int(json.load(open('$out/$1.json'))['records_per_s']/2))"; }

run rf1 --replication-factor 1 --acks 1
run rf3-acks1 --replication-factor 3 --acks 1
run rf3-acksall --replication-factor 3 --min-insync 2 --acks all
run rf3-acksall-half --replication-factor 3 --min-insync 2 --acks all --rate "$(half rf3-acksall)"
run rf1-half --replication-factor 1 --acks 1 --rate "$(half rf1)"

# A producer's latency on a leader while a new replica of another partition there catches up
# a ~2 GB backlog (SERVE_ARGS="--replica-recovery-bytes-per-sec N" limits the catch-up).
if wanted recovery; then
    start_cluster
    "$strata" topic create backlog --partitions 1 --bootstrap $boot >/dev/null
    "$strata" bench produce --bootstrap $boot --topic backlog --partitions 1 --producers 1 \
        --record-size 16384 --records "${RECOVERY_RECORDS:-120000}" --acks 1 >/dev/null
    leader=$("$strata" topic describe backlog --bootstrap $boot --format json | /usr/bin/python3 -c "import json,sys;print(json.load(sys.stdin)['partitions'][0]['leader'])")
    "$strata" topic create live --partitions 1 --bootstrap $boot >/dev/null
    "$strata" topic reassign live --replicas "$leader" --bootstrap $boot >/dev/null
    sync
    (
        sleep 3
        start=$(date +%s.%N)
        "$strata" topic reassign backlog --replicas "$leader,$((leader % 3 + 1))" --bootstrap $boot >/dev/null
        # Polled once a second: the CLI's own start-up is load on these two cores.
        until [[ "$("$strata" topic describe backlog --bootstrap $boot --format json | tr -d ' \n')" =~ \"isr\":\[[0-9]+,[0-9]+\] ]]; do sleep 1; done
        echo "catch-up took $(/usr/bin/python3 -c "import time;print(f'{time.time()-$start:.1f}')") s (up to 1 s late)" >"$out/recovery-catch-up.txt"
    ) &
    watcher=$!
    "$strata" bench produce --bootstrap $boot --topic live --partitions 1 --producers 1 \
        --record-size 1024 --duration 12 --warmup 1 --acks 1 --rate "${RECOVERY_RATE:-100000}" \
        --linger-ms 0 --json "$out/recovery.json" >"$out/recovery.txt"
    wait $watcher
    stop_cluster
    echo "== recovery"; cat "$out/recovery-catch-up.txt" "$out/recovery.txt"
    /usr/bin/python3 -c "import json;print('per-second p99 (ms):',[round(t['ack_p99_us']/1000,1) if t['ack_p99_us'] else None for t in json.load(open('$out/recovery.json'))['timeline']])"
fi

# One follower link: a 1-partition RF 1 topic with a backlog, then a second replica added.
if ! wanted follower; then echo "results in $out"; exit 0; fi
start_cluster
backlog_config=()
for setting in ${TOPIC_CONFIG:-}; do backlog_config+=(--config "$setting"); done
"$strata" topic create backlog --partitions 1 --bootstrap $boot "${backlog_config[@]}" >/dev/null
"$strata" bench produce --bootstrap $boot --topic backlog --partitions 1 --producers 1 \
    --record-size 16384 --records "${BACKLOG_RECORDS:-30000}" --acks 1 --json "$out/backlog.json" >/dev/null
leader=$("$strata" topic describe backlog --bootstrap $boot --format json | /usr/bin/python3 -c "import json,sys;print(json.load(sys.stdin)['partitions'][0]['leader'])")
other=$(( leader % 3 + 1 ))
sync
bytes=$(du -sb "$root/node$leader/backlog-0" | cut -f1)
start=$(date +%s.%N)
"$strata" topic reassign backlog --replicas "$leader,$other" --bootstrap $boot >/dev/null
# Polled with the CLI and shell matching only: a python per poll (through pyenv's shims) took
# a third of a 2-core machine's CPU and slowed the link it measured.
while :; do
    described=$("$strata" topic describe backlog --bootstrap $boot --format json | tr -d ' \n')
    [[ "$described" =~ \"isr\":\[[0-9]+,[0-9]+\] ]] && break
    sleep 0.05
done
end=$(date +%s.%N)
stop_cluster
/usr/bin/python3 - "$bytes" "$start" "$end" <<'PY' | tee "$out/follower-link.txt"
import sys
size, start, end = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"follower catch-up: {size/1e6:.0f} MB in {end-start:.2f} s = {size/(end-start)/1e6:.0f} MB/s (one partition, one link)")
PY
echo "results in $out"
