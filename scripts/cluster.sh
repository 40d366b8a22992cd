#!/usr/bin/env bash
# Starts a local Strata cluster: one etcd and three brokers on loopback (node k on ports
# 7300+100k, its shards on 7310+100k...), data under ./strata-cluster. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
command -v etcd >/dev/null || { echo "etcd is missing: apt-get install etcd-server" >&2; exit 1; }
cargo build --release
strata="$CARGO_TARGET_DIR/release/strata"
root="${STRATA_CLUSTER_DIR:-./strata-cluster}"
mkdir -p "$root"

pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT INT TERM
etcd --name strata-local --data-dir "$root/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster strata-local=http://127.0.0.1:2380 >"$root/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/2379) 2>/dev/null && break
    sleep 0.1
done
for k in 1 2 3; do
    "$strata" serve --node-id "$k" --data-dir "$root/node$k" --etcd 127.0.0.1:2379 --cluster local \
        --listen "127.0.0.1:$((7300 + 100 * k))" --shards 1 >"$root/node$k.log" 2>&1 &
    pids+=($!)
done
for _ in $(seq 1 100); do
    brokers=$("$strata" cluster info --bootstrap 127.0.0.1:7400 --format json 2>/dev/null | grep -o '"alive":true' | wc -l || true)
    [ "$brokers" = 3 ] && break
    sleep 0.2
done
"$strata" cluster info --bootstrap 127.0.0.1:7400
echo "cluster running (logs in $root); try: $strata topic create demo --partitions 6 --replication-factor 3 --bootstrap 127.0.0.1:7400"
wait
