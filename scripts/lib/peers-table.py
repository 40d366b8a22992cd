"""The table of scripts/bench-peers.sh: every run, then B/A ratios (median and range).

Usage: peers-table.py RESULTS ROUNDS PEER...

Each run left LABEL.cpu (the broker's CPU seconds before and after) and either LABEL.json
(`strata bench --json`) or, for iggy-bench, LABEL/ (its `output` directory) and LABEL.out.
"""

import glob
import json
import os
import re
import statistics
import sys

results, rounds, peers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

SIDES = {
    "iggy": ("Iggy 0.9-edge", "Strata native, pinned presets"),
    "kafka": ("Strata native", "Strata Kafka listener (librdkafka)"),
    "tansu": ("Tansu 0.6, memory storage (librdkafka)", "Strata Kafka listener (librdkafka)"),
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


def find_number(data, names):
    """The first number under any of `names`, anywhere in a JSON document."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in names and isinstance(value, (int, float)):
                return float(value)
        for value in data.values():
            found = find_number(value, names)
            if found is not None:
                return found
    elif isinstance(data, list):
        for value in data:
            found = find_number(value, names)
            if found is not None:
                return found
    return None


def iggy_run(label):
    """iggy-bench's summary: its JSON report where it wrote one, else its printed summary."""
    for path in glob.glob(f"{results}/{label}/**/*.json", recursive=True):
        data = json.load(open(path))
        mb_s = find_number(data, {"total_throughput_megabytes_per_second",
                                  "throughput_megabytes_per_second"})
        total = find_number(data, {"total_bytes", "total_user_data_bytes"})
        p99 = find_number(data, {"average_p99_latency_ms", "p99_latency_ms"})
        if mb_s is not None:
            return {"mb_s": mb_s, "bytes": total, "p99_ms": p99}
    text = open(f"{results}/{label}.out").read()
    mb_s = re.search(r"Total throughput: ([\d.]+) MB/s", text)
    p99 = re.search(r"p99: ([\d.]+) ms", text)
    return {"mb_s": float(mb_s.group(1)) if mb_s else float("nan"), "bytes": None,
            "p99_ms": float(p99.group(1)) if p99 else None}


def run(peer, side, round, workload):
    label = f"{peer}-{side}-{round}-{workload}"
    figures = iggy_run(label) if (peer, side) == ("iggy", "A") else strata_run(label)
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
