#!/usr/bin/env bash
# The Kafka listener's cost, beside the native protocol's, for docs/performance.md: one release
# node (--shards 2, --overprovisioned), 1 KiB records, 4 partitions per topic. The same records
# are produced by kcat (librdkafka, through --kafka-listen) and by `strata bench produce`
# (native), then read back by kcat and by `strata bench consume`. Reported per run: wall time,
# MB/s, and the broker's CPU seconds (utime + stime from /proc) per GB moved, the figure the
# translation changes. RECORDS=N (default 1,000,000); ROUNDS=N (default 3, alternating).
# STRATA_BIN=path uses that binary instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
strata=$(strata_release_binary)
command -v kcat >/dev/null || { echo "kcat is needed (apt-get install kcat)" >&2; exit 1; }
records="${RECORDS:-1000000}"
rounds="${ROUNDS:-3}"
root=$(mktemp -d /var/tmp/strata-kafka-bench.XXXXXX)
boot=127.0.0.1:17700
kafka=127.0.0.1:17792
python3 -c "
import sys
value = 'x' * 1023
out = sys.stdout
for i in range($records):
    out.write(value + '\n')
" > "$root/records.txt"
bytes=$((records * 1024))

"$strata" serve --data-dir "$root/data" --listen $boot --admin 127.0.0.1:17780 \
    --kafka-listen $kafka --shards 2 --overprovisioned >"$root/node.log" 2>&1 &
node=$!
trap 'kill $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$root"' EXIT
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/17700) 2>/dev/null && break; sleep 0.1; done

cpu() { awk '{print $14 + $15}' "/proc/$node/stat"; }
ticks=$(getconf CLK_TCK)
measure() { # label, command...
    local label=$1; shift
    local cpu0 start end cpu1
    cpu0=$(cpu); start=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    end=$(date +%s.%N); cpu1=$(cpu)
    awk -v l="$label" -v s="$start" -v e="$end" -v c0="$cpu0" -v c1="$cpu1" -v t="$ticks" -v b="$bytes" \
        'BEGIN { w = e - s; c = (c1 - c0) / t; printf "%-34s %6.2f s %7.0f MB/s  broker %5.2f CPU s = %5.2f s/GB\n", l, w, b / w / 1e6, c, c / (b / 1e9) }'
}
sync
for round in $(seq 1 "$rounds"); do
    echo "# round $round"
    for topic in "k$round" "n$round"; do
        "$strata" topic create "$topic" --partitions 4 --bootstrap $boot >/dev/null
    done
    measure "produce, kcat (Kafka protocol)" \
        kcat -b $kafka -P -t "k$round" -l "$root/records.txt" -X linger.ms=5
    measure "produce, strata bench (native)" \
        "$strata" bench produce --bootstrap $boot --topic "n$round" --partitions 4 \
        --records "$records" --record-size 1024 --linger-ms 5 --producers 2
    measure "consume, kcat (Kafka protocol)" \
        kcat -b $kafka -C -t "k$round" -o beginning -e -q -f '%s\n'
    measure "consume, strata bench (native)" \
        "$strata" bench consume --bootstrap $boot --topic "n$round" --records "$records"
done
