#!/usr/bin/env bash
# Builds Strata, starts a single node on the embedded coordinator (no etcd), shows a produce /
# consume round trip against it, then keeps the node serving until Ctrl-C.
#
#   scripts/quickstart.sh          the round trip, then the node keeps running
#   scripts/quickstart.sh --exit   the round trip, then the node stops; exits non-zero unless
#                                  the three records came back from this script's own node
#
# The build needs Rust and a C compiler, nothing else (no system packages: etcd's gRPC code is
# generated ahead of time, see vendor/etcd-client/STRATA.md). STRATA_DATA_DIR picks the data
# directory (default ./strata-data).
set -euo pipefail
cd "$(dirname "$0")/.."

exit_after=false
case "${1:-}" in
    "") ;;
    --exit) exit_after=true ;;
    *) echo "usage: $0 [--exit]" >&2; exit 2 ;;
esac

source scripts/lib/build-cache.sh
cargo build --release --locked --bin strata
strata="$CARGO_TARGET_DIR/release/strata"
data="${STRATA_DATA_DIR:-./strata-data}"
client_port=7300
admin_port=7380

fail() {
    echo "quickstart: $*" >&2
    exit 1
}

# Whether something accepts TCP connections on 127.0.0.1:$1 (bash's /dev/tcp: no curl needed).
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# The admin endpoint's answer to GET $1: status line, headers, body.
admin_get() {
    local answer
    exec 3<>"/dev/tcp/127.0.0.1/$admin_port" || return 1
    printf 'GET %s HTTP/1.0\r\nhost: localhost\r\n\r\n' "$1" >&3
    answer=$(cat <&3)
    exec 3<&-
    printf '%s' "$answer" | tr -d '\r'
}

# Client ports are shared between processes (SO_REUSEPORT), so a second broker would start
# beside one already there and the round trip could reach either: refuse to start instead.
for port in "$client_port" "$admin_port"; do
    if listening "$port"; then
        fail "127.0.0.1:$port already answers (another Strata node?); stop it first"
    fi
done

log="$(mktemp -t strata-quickstart.XXXXXX.log)"
"$strata" serve --data-dir "$data" 2>"$log" &
node=$!
trap 'kill -TERM "$node" 2>/dev/null || true; wait "$node" 2>/dev/null || true' EXIT

# Ready means: this process is alive, and its admin endpoint says healthy and names it.
ready=false
for _ in $(seq 1 300); do
    if ! kill -0 "$node" 2>/dev/null; then
        wait "$node" && status=0 || status=$?
        trap - EXIT
        echo "quickstart: the node exited (status $status) before it was ready; its log:" >&2
        cat "$log" >&2
        exit 1
    fi
    health="$(admin_get /health 2>/dev/null || true)"
    if grep -q '^HTTP/1.1 200' <<<"$health"; then
        pid="$(sed -n 's/^strata-pid: //p' <<<"$health")"
        [ "$pid" = "$node" ] || fail "127.0.0.1:$admin_port is answered by process ${pid:-?}, not this node ($node)"
        ready=true
        break
    fi
    sleep 0.1
done
if ! $ready; then
    echo "quickstart: the node did not become healthy in 30 s; its log:" >&2
    cat "$log" >&2
    exit 1
fi
"$strata" cluster info

echo "== create a topic (kept across restarts)"
"$strata" topic create quickstart --partitions 4 --config flush=always 2>/dev/null \
    || echo "topic quickstart already exists"
echo "== produce three keyed records (prints PARTITION OFFSET per ack)"
printf 'user-1:hello\nuser-2:strata\nuser-1:again\n' \
    | "$strata" produce quickstart --key-separator : --print-offsets
echo "== consume them back"
consumed="$("$strata" consume quickstart --from-beginning --max-messages 3 --format json)"
echo "$consumed"
for value in hello strata again; do
    grep -q "\"value\":\"$value\"" <<<"$consumed" || fail "record '$value' did not come back"
done
kill -0 "$node" 2>/dev/null || fail "the node exited during the round trip; its log: $log"

if $exit_after; then
    echo "== round trip done; stopping the node"
    exit 0
fi
echo "== node running on 127.0.0.1:$client_port (pid $node, data in $data, log in $log); Ctrl-C stops it cleanly"
wait "$node"
