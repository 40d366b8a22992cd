"""The table of scripts/bench-peers.sh: every run, then B/A ratios (median and range).

Usage: peers-table.py RESULTS ROUNDS PEER...

Each run left LABEL.cpu (the broker's CPU seconds before and after) and either LABEL.json
(`strata bench --json`), for iggy-bench LABEL/ (its `output` directory) and LABEL.out, or for
rdkafka_performance LABEL.out (its summary line).
"""

import glob
import json
import os
import statistics
import sys

results, rounds, peers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

SIDES = {
    "iggy": ("Iggy 0.9-edge", "Strata native, pinned presets"),
    "kafka": ("Strata native", "Strata Kafka listener (librdkafka)"),
    "tansu": ("Tansu 0.6, memory storage (librdkafka)", "Strata Kafka listener (librdkafka)"),
    "rdkafka-none": ("Strata native", "Strata Kafka listener (rdkafka_performance)"),
    "rdkafka-zstd": ("Strata native, zstd", "Strata Kafka listener (librdkafka), zstd"),
}


def cpu_seconds(label):
    before, after = map(float, open(f"{results}/{label}.cpu").read().split())
    return after - before


def strata_run(label):
    report = json.load(open(f"{results}/{label}.json"))
    p99 = (report.get("batch_latency_us") or report.get("ack_latency_us") or {}).get("p99")
    if report["workload"] != "produce":
        p99 = None
    return {"mb_s": report["mb_per_s"], "bytes": report["bytes"], "p99_ms": p99 and p99 / 1000}


def iggy_run(label):
    """iggy-bench's report.json (its `output` directory): the actors' summary, and the bytes
    from its parameters (MB = 10^6 bytes, as Strata's)."""
    path = glob.glob(f"{results}/{label}/*/report.json")[0]
    report = json.load(open(path))
    summary = report["group_metrics"][0]["summary"]
    params = report["params"]
    moved = params["message_batches"] * params["messages_per_batch"] * params["message_size"]
    return {"mb_s": summary["total_throughput_megabytes_per_second"], "bytes": moved,
            "p99_ms": summary["average_p99_latency_ms"] if label.endswith("producer") else None}


def rdkafka_performance_run(label):
    """rdkafka_performance's summary: `% N messages (B bytes) consumed in T ms: ... (X MB/s)`
    or `% N messages produced (B bytes), ... in T ms: ... and X MB/s`."""
    import re
    text = open(f"{results}/{label}.out").read()
    line = [line for line in text.splitlines() if " messages " in line and " in " in line][-1]
    moved = int(re.search(r"\((\d+) bytes\)", line).group(1))
    elapsed_ms = int(re.search(r" in (\d+)ms", line).group(1))
    return {"mb_s": moved / 1e6 / (elapsed_ms / 1e3), "bytes": moved, "p99_ms": None}


def run(peer, side, round, workload):
    label = f"{peer}-{side}-{round}-{workload}"
    if (peer, side) == ("iggy", "A"):
        figures = iggy_run(label)
    elif peer == "rdkafka-none" and side == "B":
        figures = rdkafka_performance_run(label)
    else:
        figures = strata_run(label)
    moved = figures["bytes"] or float(os.environ.get("BENCH_BYTES", "2000000000"))
    figures["cpu_s_gb"] = cpu_seconds(label) / (moved / 1e9)
    return figures


def spread(values):
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


print(f"{'run':<28}{'MB/s':>10}{'CPU s/GB':>10}{'p99 ms':>9}")
table = []
for peer in peers:
    a_name, b_name = SIDES[peer]
    for workload in ("producer", "consumer"):
        ratios = {"MB/s": [], "CPU s/GB": [], "p99": []}
        for round in range(1, rounds + 1):
            a, b = run(peer, "A", round, workload), run(peer, "B", round, workload)
            for side, figures in (("A", a), ("B", b)):
                p99 = f"{figures['p99_ms']:.1f}" if figures["p99_ms"] else "-"
                print(f"{peer} {workload} {side}{round:<8}{figures['mb_s']:>10.0f}"
                      f"{figures['cpu_s_gb']:>10.2f}{p99:>9}")
            ratios["MB/s"].append(b["mb_s"] / a["mb_s"])
            ratios["CPU s/GB"].append(b["cpu_s_gb"] / a["cpu_s_gb"])
            if a["p99_ms"] and b["p99_ms"]:
                ratios["p99"].append(b["p99_ms"] / a["p99_ms"])
        table.append((f"{b_name} / {a_name}, {workload}", ratios))
print()
print("| B / A | MB/s | broker CPU s/GB | p99 |")
print("|---|---|---|---|")
for name, ratios in table:
    print(f"| {name} | {spread(ratios['MB/s'])} | {spread(ratios['CPU s/GB'])} "
          f"| {spread(ratios['p99'])} |")
