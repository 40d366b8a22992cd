#!/usr/bin/env bash
# What transactions cost, for docs/performance.md: one release node (--shards 2,
# --overprovisioned), 1 KiB records, 4 partitions, 2 producers. Each round, alternating A B:
#   produce: idempotent producers (A), then transactional ones committing every TXN_INTERVAL
#            (default 100ms) (B), each on a fresh topic, for DURATION seconds (default 5);
#   consume: the transactional topic read back read_uncommitted (A), then read_committed (B).
# Per run: records/s, the broker's CPU seconds (utime + stime from /proc) per GB, and for
# transactional producers the commit latency (EndTxn to its answer). Then, over the rounds, the
# median of each ratio B / A with its range. ROUNDS=N (default 3); STRATA_BIN=path uses that
# binary instead of building. Results (JSON and text) go to $1 (default: a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/build-cache.sh
strata=$(strata_release_binary)
rounds="${ROUNDS:-3}"
duration="${DURATION:-5}"
interval="${TXN_INTERVAL:-100ms}"
root=$(mktemp -d /var/tmp/strata-txn-bench.XXXXXX)
out="${1:-$root/results}"
mkdir -p "$out"
boot=127.0.0.1:17900

"$strata" serve --data-dir "$root/data" --listen $boot --admin 127.0.0.1:17980 \
    --shards 2 --overprovisioned >"$root/node.log" 2>&1 &
node=$!
trap 'kill $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$root/data"' EXIT
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/17900) 2>/dev/null && break; sleep 0.1; done

ticks=$(getconf CLK_TCK)
cpu() { awk -v t="$ticks" '{ print ($14 + $15) / t }' "/proc/$node/stat"; }
run() { # name, bench flags... (writes $out/name.json with the broker's CPU seconds added)
    local name=$1; shift
    local before after
    before=$(cpu)
    "$strata" bench --bootstrap $boot "$@" --json "$out/$name.json" >"$out/$name.txt"
    after=$(cpu)
    python3 - "$out/$name.json" "$before" "$after" <<'PY'
import json, sys
path, before, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
report = json.load(open(path))
report["broker_cpu_s"] = after - before
json.dump(report, open(path, "w"), indent=1)
PY
}
sync
for round in $(seq 1 "$rounds"); do
    for kind in idem txn; do
        "$strata" topic create "$kind$round" --partitions 4 --bootstrap $boot >/dev/null
    done
    common=(--partitions 4 --producers 2 --record-size 1024 --duration "$duration" --warmup 1)
    run "produce-idem-$round" produce --topic "idem$round" "${common[@]}" --idempotent
    run "produce-txn-$round" produce --topic "txn$round" "${common[@]}" --transactional \
        --txn-interval "$interval"
    produced=$(python3 -c "import json;r=json.load(open('$out/produce-txn-$round.json'));print(r['records'])")
    # As many records as the produce run measured (the topic holds its warmup's too).
    run "consume-uncommitted-$round" consume --topic "txn$round" --records "$produced"
    run "consume-committed-$round" consume --topic "txn$round" --records "$produced" \
        --isolation read_committed
    # A round writes several GB a second: the next starts on an empty disk.
    for kind in idem txn; do
        "$strata" topic delete "$kind$round" --bootstrap $boot >/dev/null
    done
    sync
    echo "round $round done" >&2
done

python3 - "$out" "$rounds" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name, round):
    return json.load(open(f"{out}/{name}-{round}.json"))
def per_gb(report):
    return report["broker_cpu_s"] / (report["bytes"] / 1e9)
def show(name, report):
    line = f"  {name:22} {report['records_per_s']:>10.0f} records/s  {report['mb_per_s']:>6.1f} MB/s  broker {per_gb(report):5.2f} CPU s/GB"
    commit = report.get("commit_latency_us")
    if commit:
        line += f"  commit p50 {commit['p50'] / 1e3:.1f} ms p99 {commit['p99'] / 1e3:.1f} ms ({commit['count']} commits)"
    print(line)
ratios = {"produce": [], "produce cpu/GB": [], "consume": [], "consume cpu/GB": []}
commits = []
for r in range(1, rounds + 1):
    print(f"round {r}")
    reports = {n: load(n, r) for n in ["produce-idem", "produce-txn", "consume-uncommitted", "consume-committed"]}
    for name, report in reports.items():
        show(name, report)
    ratios["produce"].append(reports["produce-txn"]["records_per_s"] / reports["produce-idem"]["records_per_s"])
    ratios["produce cpu/GB"].append(per_gb(reports["produce-txn"]) / per_gb(reports["produce-idem"]))
    ratios["consume"].append(reports["consume-committed"]["records_per_s"] / reports["consume-uncommitted"]["records_per_s"])
    ratios["consume cpu/GB"].append(per_gb(reports["consume-committed"]) / per_gb(reports["consume-uncommitted"]))
    commits.append(reports["produce-txn"]["commit_latency_us"]["p99"] / 1e3)
print("B / A over the rounds: median (min-max)")
for name, values in ratios.items():
    a, b = ("idempotent", "transactional") if name.startswith("produce") else ("read_uncommitted", "read_committed")
    print(f"  {name:16} {b} / {a}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
print(f"  commit p99: {statistics.median(commits):.1f} ms ({min(commits):.1f}-{max(commits):.1f})")
PY
echo "results in $out"
