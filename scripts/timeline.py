#!/usr/bin/env python3
"""Draws a worker's timeline (a Chrome trace file from `[trace] dir` / PUSHPULL_TRACE) as a
Gantt-like PNG: one row per tensor with its rounds (push_pull calls), and under it one row per
chunk with its phases coloured (compress, wait, pull, decompress).

    scripts/timeline.py TRACE.json OUT.png [--rank R] [--max-chunks N] [--max-tensors N]

Needs matplotlib. Spans are the file's async events ("b"/"e" matched by cat, id and name; see
net/src/timeline.rs).
"""

import argparse
import json
import sys
from collections import defaultdict

COLOURS = {
    "round": "#d9d9d9",
    "compress": "#1f77b4",
    "wait": "#ffbb78",
    "pull": "#d62728",
    "decompress": "#2ca02c",
}


def spans(events):
    """(cat, name, begin µs, end µs, args) of every matched b/e pair."""
    open_ = defaultdict(list)
    out = []
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        ph = e.get("ph")
        track = (e.get("cat"), e.get("id"), e.get("name"))
        if ph == "b":
            open_[track].append((e["ts"], e.get("args", {})))
        elif ph == "e" and open_[track]:
            ts, args = open_[track].pop()
            out.append((track[0], track[2], ts, e["ts"], args))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=None, help="the worker (default: the first)")
    ap.add_argument("--max-chunks", type=int, default=6, help="chunk rows per tensor")
    ap.add_argument("--max-tensors", type=int, default=8, help="tensors drawn (first started)")
    a = ap.parse_args()

    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    all_spans = [s for s in spans(events) if s[0] in ("round", "chunk")]
    if not all_spans:
        sys.exit(f"{a.trace}: no worker spans (is it a worker's file, inside the step window?)")
    ranks = sorted({s[4].get("rank") for s in all_spans if s[4].get("rank") is not None})
    rank = ranks[0] if a.rank is None else a.rank
    mine = [s for s in all_spans if s[4].get("rank") == rank]

    # Which tensor and chunk each key is (pull spans carry only the key).
    where = {}
    for cat, name, b, e, args in mine:
        if cat == "chunk" and "tensor" in args:
            where[args["key"]] = (args["tensor"], args["chunk"])
    first = {}
    for cat, name, b, e, args in mine:
        if cat == "round":
            first[args["tensor"]] = min(b, first.get(args["tensor"], b))
    tensors = sorted(first, key=first.get)[: a.max_tensors]

    rows = []  # (label, tensor, chunk or None)
    for t in tensors:
        rows.append((t, t, None))
        chunks = sorted({c for (tt, c) in where.values() if tt == t})
        for c in chunks[: a.max_chunks]:
            rows.append((f"  chunk {c}", t, c))
        if len(chunks) > a.max_chunks:
            rows.append((f"  ({len(chunks) - a.max_chunks} more chunks)", t, -1))
    index = {(t, c): i for i, (_, t, c) in enumerate(rows)}
    t0 = min(b for _, _, b, _, _ in mine)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.24 * len(rows)), dpi=90)
    for cat, name, b, e, args in mine:
        if cat == "round":
            row = index.get((args["tensor"], None))
            height, colour = 0.7, COLOURS["round"]
        else:
            t, c = where.get(args["key"], (None, None))
            row = index.get((t, c))
            height = 0.35 if name == "pull" else 0.7
            colour = COLOURS.get(name, "black")
        if row is None:
            continue
        ax.broken_barh(
            [((b - t0) / 1000, max((e - b) / 1000, 0.02))],
            (row - height / 2, height),
            facecolors=colour,
            edgecolor="none",
            zorder=3 if name == "pull" else 2,
        )
        if cat == "round":
            ax.text((b - t0) / 1000, row, f" r{args['round']}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"worker {rank}: rounds per tensor and each chunk's phases", fontsize=10)
    ax.legend(
        handles=[Patch(color=c, label=n) for n, c in COLOURS.items()],
        loc="lower right",
        fontsize=8,
        ncol=5,
    )
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"{a.out}: {len(rows)} rows, worker {rank}")


if __name__ == "__main__":
    main()
