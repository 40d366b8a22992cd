#!/usr/bin/env bash
# Strata beside its peers, in one sitting: each comparison runs its two sides alternately
# (A B A B ..., ROUNDS rounds, default 3), a fresh broker and data dir per run, `sync` between
# runs, the broker's CPU time read from /proc/PID/stat. Prints every run and one table of B/A
# ratios (median and range) for docs/performance.md.
#
#   scripts/bench-peers.sh [ROUNDS]
#
# Comparisons (PEERS picks among them, default all three):
#   iggy    A: iggy-server with iggy-bench pinned-producer, then pinned-consumer (2 actors,
#              1 KiB messages, 1,000 per batch; ../shared/peers/iggy, 0.9-edge)
#           B: Strata with `strata bench --preset pinned-producer`, then pinned-consumer
#   kafka   A: Strata's native protocol (`strata bench produce`, then consume)
#           B: Strata's Kafka listener on the same kind of node, through
#              `strata bench --protocol kafka` (librdkafka)
#   tansu   A: Tansu 0.6 (memory storage: nothing reaches a disk) through
#              `strata bench --protocol kafka`
#           B: Strata's Kafka listener through the same bench
#   rdkafka A: Strata's native protocol (`strata bench produce`, then consume: 2 partitions,
#              1 KiB records, linger 5 ms, 1 MB batches, acks=1), uncompressed and zstd
#           B: Strata's Kafka listener in the same shape: uncompressed through librdkafka's own
#              load tool, `rdkafka_performance` (built once from ../shared/peers' librdkafka
#              source under PEERS_DIR; its consumer reads both partitions from the start);
#              compressed through `strata bench --protocol kafka` (librdkafka, the native
#              side's records). One comparison per codec in KAFKA_CODECS (default "none zstd").
#
# STRATA_PINNED_ARGS adds flags to Strata's pinned producer (say `--topic-config
# direct.writes=never`, to write through the page cache as Iggy does, where the default `auto`
# writes large appends past it at the disk's speed).
# BENCH_BYTES (default 2000000000) is what each pinned run moves; RECORDS (default 1000000,
# 1 KiB each) what each Kafka-protocol run does. STRATA_BIN=path uses that binary instead of
# building. Tansu is installed with `cargo install` under /var/tmp/strata-peers the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
source scripts/lib/bench-node.sh
strata=$(strata_release_binary)
rounds="${1:-3}"
peers="${PEERS:-iggy kafka tansu rdkafka}"
kafka_codecs="${KAFKA_CODECS:-none zstd}"
bytes="${BENCH_BYTES:-2000000000}"
records="${RECORDS:-1000000}"
peers_dir="${PEERS_DIR:-/var/tmp/strata-peers}"
iggy_dir="$(cd .. && pwd)/shared/peers/iggy"
work="$(mktemp -d /var/tmp/strata-bench-peers.XXXXXX)"
results="$work/results"
mkdir -p "$results"
node_pid=""
trap 'stop_node; rm -rf "$work"' EXIT

# A fresh data dir, the page cache's dirty pages written out, a moment's rest: the same state
# for each side of each round.
fresh() {
    rm -rf "$work/data" "$work/iggy" && mkdir -p "$work/data"
    sync
    sleep 1
}

# Records a run's broker CPU: label, then the command.
measured() {
    local label="$1"; shift
    local before after
    before="$(cpu_seconds "$node_pid")"
    "$@" >"$results/$label.out" 2>&1 || { cat "$results/$label.out" >&2; return 1; }
    after="$(cpu_seconds "$node_pid")"
    echo "$before $after" >"$results/$label.cpu"
}

strata_node() {
    fresh
    "$strata" serve --shards 2 --data-dir "$work/data" --listen 127.0.0.1:17900 \
        --admin 127.0.0.1:17980 --kafka-listen 127.0.0.1:17992 >"$work/node.log" 2>&1 &
    node_pid=$!
    wait_for_port 17900
    wait_for_port 17992
}

# --- iggy against Strata's pinned presets -------------------------------------------------
iggy_side() {
    local round="$1"
    fresh
    mkdir -p "$work/iggy" && cp "$iggy_dir/config.toml" "$work/iggy/"
    (cd "$work/iggy" && IGGY_SYSTEM_PATH="$work/iggy/data" exec "$iggy_dir/iggy-server" \
        --fresh --with-default-root-credentials >"$work/iggy.log" 2>&1) &
    node_pid=$!
    wait_for_port 8090
    sleep 1
    for workload in producer consumer; do
        mkdir -p "$results/iggy-A-$round-$workload"
        measured "iggy-A-$round-$workload" "$iggy_dir/iggy-bench" -m 1024 -P 1000 -T "$((bytes / 1000000))MB" \
            "pinned-$workload" "--${workload}s" 2 tcp output -o "$results/iggy-A-$round-$workload"
    done
    stop_node
}

strata_pinned_side() {
    local round="$1"
    strata_node
    local -a extra=()
    for workload in producer consumer; do
        [ "$workload" = producer ] && read -r -a extra <<<"${STRATA_PINNED_ARGS:-}"
        [ "$workload" = consumer ] && extra=()
        measured "iggy-B-$round-$workload" "$strata" bench --bootstrap 127.0.0.1:17900 \
            --preset "pinned-$workload" "--${workload}s" 2 --total-bytes "$bytes" \
            "${extra[@]}" --json "$results/iggy-B-$round-$workload.json"
    done
    stop_node
}

# --- the Kafka protocol: native against the listener, Tansu against the listener ---------
kafka_protocol_runs() { # label, bootstrap, protocol
    local label="$1" bootstrap="$2" protocol="$3" topic="t$RANDOM"
    measured "$label-producer" "$strata" bench produce --protocol "$protocol" \
        --bootstrap "$bootstrap" --topic "$topic" --partitions 2 --producers 2 \
        --records "$records" --record-size 1024 --json "$results/$label-producer.json"
    measured "$label-consumer" "$strata" bench consume --protocol "$protocol" \
        --bootstrap "$bootstrap" --topic "$topic" --consumers 2 --records "$records" \
        --json "$results/$label-consumer.json"
}

tansu_binary() {
    if [ ! -x "$peers_dir/tansu/bin/tansu" ]; then
        echo "== installing Tansu 0.6 into $peers_dir/tansu (once)" >&2
        # The memory storage engine is behind the `dynostore` feature.
        cargo install --quiet --locked tansu --version 0.6.0 --features dynostore \
            --root "$peers_dir/tansu" --target-dir "$peers_dir/tansu-target" >&2
    fi
    echo "$peers_dir/tansu/bin/tansu"
}

tansu_side() {
    local round="$1" tansu
    tansu="$(tansu_binary)"
    fresh
    "$tansu" broker --storage-engine memory://tansu/ \
        --kafka-listener-url tcp://127.0.0.1:17993 \
        --kafka-advertised-listener-url tcp://127.0.0.1:17993 >"$work/tansu.log" 2>&1 &
    node_pid=$!
    wait_for_port 17993
    kafka_protocol_runs "tansu-A-$round" 127.0.0.1:17993 kafka
    stop_node
}

# --- librdkafka's rdkafka_performance against the native protocol, per codec ------------
rdkafka_performance_binary() {
    local source="$peers_dir/librdkafka"
    if [ ! -x "$source/examples/rdkafka_performance" ]; then
        echo "== building rdkafka_performance into $source (once)" >&2
        source scripts/lib/debian-packages.sh
        install_debian_packages build-essential libssl-dev libsasl2-dev libzstd-dev liblz4-dev zlib1g-dev >&2
        mkdir -p "$peers_dir"
        tar -xzf "$(cd .. && pwd)/shared/peers/librdkafka-2.15-src.tar.gz" -C "$peers_dir"
        (cd "$source" && ./configure --disable-gssapi && make -j2 libs \
            && make -C examples rdkafka_performance) >&2
    fi
    echo "$source/examples/rdkafka_performance"
}

# Uncompressed, rdkafka_performance itself. Compressed, how well records compress moves the
# broker's figures (rdkafka_performance repeats one pattern, far more compressible than
# `strata bench`'s word text), so librdkafka through `strata bench --protocol kafka` writes the
# same records the native side does.
rdkafka_runs() { # label, codec
    local label="$1" codec="$2" topic="r$RANDOM" tool
    if [ "$codec" != none ]; then
        measured "$label-producer" "$strata" bench produce --protocol kafka \
            --bootstrap 127.0.0.1:17992 --topic "$topic" --partitions 2 --producers 2 \
            --records "$records" --record-size 1024 --linger-ms 5 --batch-size 1MB --acks 1 \
            --compression "$codec" --json "$results/$label-producer.json"
        measured "$label-consumer" "$strata" bench consume --protocol kafka \
            --bootstrap 127.0.0.1:17992 --topic "$topic" --consumers 2 --records "$records" \
            --json "$results/$label-consumer.json"
        return
    fi
    tool="$(rdkafka_performance_binary)"
    "$strata" topic create "$topic" --partitions 2 --bootstrap 127.0.0.1:17900 >/dev/null
    measured "$label-producer" "$tool" -P -t "$topic" -b 127.0.0.1:17992 -s 1024 -c "$records" \
        -a 1 -X linger.ms=5 -X batch.size=1000000 -q
    # 4 MiB per partition and fetch, as `strata bench consume` asks natively.
    measured "$label-consumer" "$tool" -C -t "$topic" -p 0 -p 1 -o beginning \
        -b 127.0.0.1:17992 -c "$records" -X max.partition.fetch.bytes=4194304 -q
}

native_runs() { # label, codec
    local label="$1" codec="$2" topic="n$RANDOM"
    measured "$label-producer" "$strata" bench produce --bootstrap 127.0.0.1:17900 \
        --topic "$topic" --partitions 2 --producers 2 --records "$records" --record-size 1024 \
        --linger-ms 5 --batch-size 1MB --acks 1 --compression "$codec" \
        --json "$results/$label-producer.json"
    measured "$label-consumer" "$strata" bench consume --bootstrap 127.0.0.1:17900 \
        --topic "$topic" --consumers 2 --records "$records" \
        --json "$results/$label-consumer.json"
}

for round in $(seq "$rounds"); do
    for peer in $peers; do
        case "$peer" in
        iggy)
            iggy_side "$round"
            strata_pinned_side "$round"
            ;;
        kafka)
            strata_node
            kafka_protocol_runs "kafka-A-$round" 127.0.0.1:17900 native
            stop_node
            strata_node
            kafka_protocol_runs "kafka-B-$round" 127.0.0.1:17992 kafka
            stop_node
            ;;
        tansu)
            tansu_side "$round"
            strata_node
            kafka_protocol_runs "tansu-B-$round" 127.0.0.1:17992 kafka
            stop_node
            ;;
        rdkafka)
            for codec in $kafka_codecs; do
                strata_node
                native_runs "rdkafka-$codec-A-$round" "$codec"
                stop_node
                strata_node
                rdkafka_runs "rdkafka-$codec-B-$round" "$codec"
                stop_node
            done
            ;;
        *) echo "unknown peer $peer (iggy, kafka, tansu, rdkafka)" >&2; exit 2 ;;
        esac
    done
done

table_peers=""
for peer in $peers; do
    if [ "$peer" = rdkafka ]; then
        for codec in $kafka_codecs; do table_peers="$table_peers rdkafka-$codec"; done
    else
        table_peers="$table_peers $peer"
    fi
done
python3 scripts/lib/peers-table.py "$results" "$rounds" $table_peers
