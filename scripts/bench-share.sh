#!/usr/bin/env bash
# Share groups beside consumer groups, for docs/performance.md: one release node (--shards 2,
# --overprovisioned), rounds alternating the two sides (A B A B) in the same minutes.
#
#  1. Processing-bound throughput: one partition of pre-produced 100-byte records, consumers
#     spending PROCESS_MS (default 1) on each record. A consumer group's one member (a
#     partition is one member's) against SHARE_CONSUMERS (default 4) share consumers.
#  2. Broker cost: one partition of BYTES (default 500 MB) of 1 KiB records read by one
#     consumer-group member and by one share consumer (each record accepted), 1 MiB a fetch
#     (Kafka's max.partition.fetch.bytes; 1024 records of 1 KiB), the broker's CPU seconds per
#     GB from its /metrics; natively (`strata bench consume --group` / `--share-group`) and through
#     Kafka's protocol (`--protocol kafka`: records a Kafka producer wrote, read by librdkafka's
#     consumer and by the bench's KIP-932 share consumer, which speaks as Kafka's Java share
#     consumer does).
#
# STRATA_BIN=path uses that binary instead of building. ROUNDS (default 3), RECORDS (default
# 4000, the throughput rows).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
source scripts/lib/bench-node.sh
strata=$(strata_release_binary)
rounds="${ROUNDS:-3}"
records="${RECORDS:-4000}"
process_ms="${PROCESS_MS:-1}"
share_consumers="${SHARE_CONSUMERS:-4}"
bytes="${BYTES:-500000000}"
root=$(mktemp -d /var/tmp/strata-share-bench.XXXXXX)
boot=127.0.0.1:17800
kafka=127.0.0.1:17892
admin=127.0.0.1:17880

"$strata" serve --data-dir "$root/data" --listen $boot --admin $admin --kafka-listen $kafka \
    --shards 2 --overprovisioned >"$root/node.log" 2>&1 &
node_pid=$!
trap 'stop_node; rm -rf "$root"' EXIT
wait_for_port 17800

# A share group reads from the start of the partition.
earliest() {
    "$strata" group config "$1" --set share.auto.offset.reset=earliest --bootstrap $boot >/dev/null
}
bench() { "$strata" bench "$@" --bootstrap $boot --broker-admin $admin --json "$root/run.json" >/dev/null; }
# The same, a client of the node's Kafka listener.
kafka_bench() {
    "$strata" bench "$@" --protocol kafka --bootstrap $kafka --broker-admin $admin \
        --json "$root/run.json" >/dev/null
}
field() { python3 -c "import json,sys; print(json.load(open('$root/run.json'))['$1'])"; }

echo "# processing-bound: $records records of 100 B, ${process_ms} ms each"
for round in $(seq 1 "$rounds"); do
    topic="p$round"
    "$strata" topic create $topic --partitions 1 --bootstrap $boot >/dev/null
    bench produce --topic $topic --records "$records" --record-size 100 --producers 1
    bench consume --topic $topic --records "$records" --group "g-$round" --consumers 1 \
        --process-ms "$process_ms"
    group_rate=$(field records_per_s)
    earliest "s-$round"
    bench consume --topic $topic --records "$records" --share-group "s-$round" \
        --consumers "$share_consumers" --process-ms "$process_ms"
    share_rate=$(field records_per_s)
    awk -v r="$round" -v g="$group_rate" -v s="$share_rate" -v n="$share_consumers" \
        'BEGIN { printf "round %d: consumer group (1 member) %7.0f rec/s   share group (%d) %7.0f rec/s   x%.2f\n", r, g, n, s, s / g }'
done

echo "# broker cost: $bytes bytes of 1 KiB records, one reader"
for round in $(seq 1 "$rounds"); do
    topic="c$round"
    "$strata" topic create $topic --partitions 1 --bootstrap $boot >/dev/null
    bench produce --topic $topic --total-bytes "$bytes" --record-size 1024 --producers 1
    count=$((bytes / 1024))
    bench consume --topic $topic --records $count --group "cg-$round" --consumers 1 \
        --fetch-bytes 1048576
    group_cost=$(field broker_cpu_s_per_gb)
    earliest "cs-$round"
    # 1024 records of 1 KiB a fetch: the 1 MiB the consumer-group member's fetch reads.
    bench consume --topic $topic --records $count --share-group "cs-$round" --consumers 1 \
        --max-poll-records 1024
    share_cost=$(field broker_cpu_s_per_gb)
    awk -v r="$round" -v g="$group_cost" -v s="$share_cost" \
        'BEGIN { printf "round %d native: consumer group %5.2f CPU s/GB   share group %5.2f CPU s/GB   x%.2f\n", r, g, s, s / g }'
    "$strata" topic delete $topic --bootstrap $boot >/dev/null
    # The same through Kafka's protocol, of records a Kafka producer wrote (stored and served
    # as sent, nothing translated): librdkafka's consumer-group member (the rdkafka crate)
    # against the bench's KIP-932 share consumer (what Kafka's Java share consumer sends),
    # both reading 1 MiB a fetch.
    topic="k$round"
    "$strata" topic create $topic --partitions 1 --bootstrap $boot >/dev/null
    kafka_bench produce --topic $topic --total-bytes "$bytes" --record-size 1024 --producers 1
    kafka_bench consume --topic $topic --records $count \
        --group "kg-$round" --consumers 1 --fetch-bytes 1048576
    kafka_group=$(field broker_cpu_s_per_gb)
    earliest "ks-$round"
    kafka_bench consume --topic $topic --records $count \
        --share-group "ks-$round" --consumers 1 --max-poll-records 1024
    kafka_share=$(field broker_cpu_s_per_gb)
    awk -v r="$round" -v g="$kafka_group" -v s="$kafka_share" \
        'BEGIN { printf "round %d kafka:  consumer group %5.2f CPU s/GB   share group %5.2f CPU s/GB   x%.2f\n", r, g, s, s / g }'
    "$strata" topic delete $topic --bootstrap $boot >/dev/null
done
