#!/usr/bin/env bash
# Builds Strata, starts a single node on the embedded coordinator (no etcd), shows a produce /
# consume round trip against it, then keeps the node serving until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/strata-target}"
cargo build --release
strata="$CARGO_TARGET_DIR/release/strata"
data="${STRATA_DATA_DIR:-./strata-data}"

"$strata" serve --data-dir "$data" &
node=$!
trap 'kill -TERM "$node" 2>/dev/null || true; wait "$node" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    "$strata" cluster info >/dev/null 2>&1 && break
    sleep 0.1
done
"$strata" cluster info

echo "== create a topic (kept across restarts)"
"$strata" topic create quickstart --partitions 4 --config flush=always 2>/dev/null \
    || echo "topic quickstart already exists"
echo "== produce three keyed records (prints PARTITION OFFSET per ack)"
printf 'user-1:hello\nuser-2:strata\nuser-1:again\n' \
    | "$strata" produce quickstart --key-separator : --print-offsets
echo "== consume them back"
"$strata" consume quickstart --from-beginning --max-messages 3 --format json
echo "== node running on 127.0.0.1:7300 (pid $node, data in $data); Ctrl-C stops it cleanly"
wait "$node"
