#!/usr/bin/env bash
# Tiered storage, for docs/performance.md: one release node (--shards 2, --overprovisioned) on
# an S3-protocol server (s3s-fs, over HTTP on loopback; scripts/test.sh installs it), rounds
# alternating the two sides (A B A B) in the same minutes.
#
#  1. Remote read rate: BYTES (default 1 GB) of 1 KiB records in a tiered topic whose local
#     log keeps nothing uploaded (local.retention.bytes=0), read from offset 0 by one
#     consumer-group member, 4 MiB a fetch: every byte comes from the bucket through the chunk
#     cache and its read-ahead. Beside it, the same read of a topic on the local disk.
#  2. Produce latency while uploading: RATE records of 1 KiB a second (default 20000, open
#     loop, acks=1) for DURATION (default 30s) into a tiered topic with 8 MiB segments (a
#     segment uploads every ~0.4 s) against the same into a topic that uploads nothing and
#     deletes its old segments at the same pace (retention.bytes). Ack p99 of each.
#
# STRATA_BIN=path uses that binary instead of building. ROUNDS (default 2). TIER=file reads
# and writes a file:// tier instead (Strata's side alone, without an HTTP server). SEGMENT
# (default 16777216) is the read test's segment size: s3s-fs hashes a whole object on every
# ranged GET, so its reads slow down as objects grow (64 MiB objects: 170 ms a GET).
# STORE_NICE=10 runs s3s-fs below the broker's priority: on a host of two cores the store's own
# work (it hashes every object it receives) competes with the broker's, as a remote store's
# would not.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
source scripts/lib/bench-node.sh
strata=$(strata_release_binary)
s3s_fs="${STRATA_S3S_FS:-/var/tmp/strata-tools/bin/s3s-fs}"
rounds="${ROUNDS:-2}"
bytes="${BYTES:-1000000000}"
rate="${RATE:-20000}"
duration="${DURATION:-30s}"
root=$(mktemp -d /var/tmp/strata-tiered-bench.XXXXXX)
boot=127.0.0.1:17900
admin=127.0.0.1:17980
s3_port=17990

segment="${SEGMENT:-16777216}"
tier="${TIER:-s3}"
mkdir -p "$root/bucket/bench"
remote_url=s3://bench/tier
[ "$tier" = file ] && remote_url="file://$root/bucket/bench"
nice -n "${STORE_NICE:-0}" "$s3s_fs" --host 127.0.0.1 --port $s3_port --access-key bench --secret-key bench-secret \
    "$root/bucket" >"$root/s3.log" 2>&1 &
s3_pid=$!
wait_for_port $s3_port
AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1 \
    AWS_ENDPOINT_URL=http://127.0.0.1:$s3_port AWS_ALLOW_HTTP=true \
    "$strata" serve --data-dir "$root/data" --listen $boot --admin $admin --shards 2 \
    --overprovisioned --remote-storage "$remote_url" --retention-check-interval-ms 500 \
    >"$root/node.log" 2>&1 &
node_pid=$!
trap 'stop_node; kill $s3_pid 2>/dev/null; rm -rf "$root"' EXIT
wait_for_port 17900

bench() { "$strata" bench "$@" --bootstrap $boot --broker-admin $admin --json "$root/run.json" >/dev/null; }
# A field of the last run's JSON report, by its path: field mb_per_s, field ack_latency_us p99.
field() {
    python3 - "$root/run.json" "$@" <<'PY'
import json, sys
value = json.load(open(sys.argv[1]))
for key in sys.argv[2:]:
    value = value[key]
print(value)
PY
}
metric() { curl -s "http://$admin/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
local_start() {
    "$strata" topic describe "$1" --format json --bootstrap $boot |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["partitions"][0]["local_log_start_offset"])'
}

count=$((bytes / 1024))
echo "# remote read: $bytes bytes of 1 KiB records from offset 0, one member, 4 MiB a fetch"
for round in $(seq 1 "$rounds"); do
    for side in remote local; do
        topic="r$round-$side"
        if [ $side = remote ]; then
            "$strata" topic create $topic --partitions 1 --bootstrap $boot \
                --config segment.bytes=$segment --config remote.storage.enable=true \
                --config local.retention.bytes=0 >/dev/null
        else
            "$strata" topic create $topic --partitions 1 --bootstrap $boot \
                --config segment.bytes=$segment >/dev/null
        fi
        bench produce --topic $topic --total-bytes "$bytes" --record-size 1024 --producers 1
        if [ $side = remote ]; then
            # Uploaded and gone from the local disk: all but the active segment. What lies below
            # the local start is what both sides read.
            per_segment=$((segment / 1024))
            until [ "$(metric strata_remote_upload_lag_bytes)" = "0" ] &&
                [ "$(local_start $topic)" -ge $((count - per_segment - per_segment / 10)) ]; do
                sleep 1
            done
            reads=$(local_start $topic)
        fi
        bench consume --topic $topic --records "$reads" --group "g-$topic" \
            --consumers 1 --fetch-bytes 4194304
        rate_mb=$(field mb_per_s)
        cost=$(field broker_cpu_s_per_gb)
        printf "round %d %-6s %7.1f MB/s  broker %5.2f CPU s/GB\n" "$round" $side "$rate_mb" "$cost"
        "$strata" topic delete $topic --bootstrap $boot >/dev/null
    done
done
echo "remote fetches: $(metric strata_remote_fetch_latency_seconds_count), $(metric strata_remote_fetch_latency_seconds_sum) s; cache hits $(metric strata_remote_cache_hits_total), misses $(metric strata_remote_cache_misses_total)"

echo "# produce latency: $rate records/s of 1 KiB for $duration, acks=1"
for round in $(seq 1 "$rounds"); do
    for side in uploading plain; do
        topic="p$round-$side"
        # Both delete segments at the same pace, so that uploading is the one difference:
        # the tiered topic each one once uploaded, the plain one by its retention.bytes.
        if [ $side = uploading ]; then
            settings="--config remote.storage.enable=true --config local.retention.bytes=0"
        else
            settings="--config retention.bytes=8388608"
        fi
        # shellcheck disable=SC2086
        "$strata" topic create $topic --partitions 1 --bootstrap $boot \
            --config segment.bytes=8388608 $settings >/dev/null
        uploaded_before=$(metric strata_remote_uploaded_segments_total)
        bench produce --topic $topic --rate "$rate" --duration "$duration" --record-size 1024 \
            --producers 1 --acks 1 --warmup 5s
        p99=$(field ack_latency_us p99)
        uploads=$(awk -v a="$(metric strata_remote_uploaded_segments_total)" -v b="$uploaded_before" 'BEGIN { print a - b }')
        printf "round %d %-9s ack p99 %6d us  (segments uploaded meanwhile: %d)\n" "$round" $side "$p99" "$uploads"
        "$strata" topic delete $topic --bootstrap $boot >/dev/null
    done
done
