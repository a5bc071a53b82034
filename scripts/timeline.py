#!/usr/bin/env python3
"""Draws a worker's timeline (a Chrome trace file from `[trace] dir` / PUSHPULL_TRACE) as a
Gantt-like PNG: one row per tensor with its rounds (push_pull calls), and under it one row per
chunk with its phases coloured (compress, wait, pull, decompress, and a local group's turn,
add, others add, outcome, copy); the legend lists the phases drawn.

    scripts/timeline.py TRACE.json OUT.png [--rank R] [--max-chunks N] [--max-tensors N]
        [--min-chunks N]

Needs Pillow. Spans are the file's async events ("b"/"e" matched by cat, id and name; see
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
    # A local group's phases (cluster.local_size > 1).
    "turn": "#c5b0d5",
    "add": "#9467bd",
    "others add": "#e377c2",
    "outcome": "#f7b6d2",
    "copy": "#8c564b",
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


def hex_rgb(colour):
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))


def draw(mine, rows, index, where, t0, rank, out):
    """The picture, with Pillow: rows top to bottom, time left to right, a ms axis below."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    left, top, row_h, width = 170, 28, 16, 1200
    plot_w = width - left - 20
    height = top + row_h * len(rows) + 56
    t1 = max(e for _, _, _, e, _ in mine)
    span_ms = max((t1 - t0) / 1000, 1e-3)
    x = lambda ts: left + (ts - t0) / 1000 / span_ms * plot_w
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    d.text((left, 8), f"worker {rank}: rounds per tensor and each chunk's phases", fill="black", font=font)
    for i, (label, _, _) in enumerate(rows):
        y = top + i * row_h
        d.text((6, y + 2), label[:28], fill="black", font=font)
        d.line([(left, y + row_h - 1), (width - 20, y + row_h - 1)], fill=(240, 240, 240))
    # Rounds first, then phases, pull last (drawn over its wait).
    order = {"round": 0, "pull": 2}
    drawn = set()
    for cat, name, b, e, args in sorted(mine, key=lambda s: order.get(s[1] if s[0] == "chunk" else "round", 1)):
        if cat == "round":
            row = index.get((args["tensor"], None))
            frac, colour = 0.8, COLOURS["round"]
        else:
            t, c = where.get(args["key"], (None, None))
            row = index.get((t, c))
            frac = 0.4 if name == "pull" else 0.8
            colour = COLOURS.get(name, "#000000")
        if row is None:
            continue
        drawn.add(name if cat == "chunk" else "round")
        y = top + row * row_h + row_h / 2
        x0, x1 = x(b), max(x(e), x(b) + 1)
        d.rectangle([x0, y - frac * row_h / 2, x1, y + frac * row_h / 2], fill=hex_rgb(colour))
        if cat == "round":
            d.text((x0 + 2, y - 6), f"r{args['round']}", fill="black", font=font)
    # The ms axis.
    y_axis = top + row_h * len(rows) + 4
    d.line([(left, y_axis), (width - 20, y_axis)], fill="black")
    step = max(1, round(span_ms / 10))
    ms = 0
    while ms <= span_ms:
        xx = left + ms / span_ms * plot_w
        d.line([(xx, y_axis), (xx, y_axis + 4)], fill="black")
        d.text((xx - 6, y_axis + 6), f"{ms}", fill="black", font=font)
        ms += step
    d.text((left - 24, y_axis + 6), "ms", fill="black", font=font)
    # The legend.
    lx = left
    for name, colour in COLOURS.items():
        if name not in drawn:
            continue
        d.rectangle([lx, height - 18, lx + 12, height - 6], fill=hex_rgb(colour))
        d.text((lx + 16, height - 18), name, fill="black", font=font)
        lx += 110
    img.save(out, optimize=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=None, help="the worker (default: the first)")
    ap.add_argument("--max-chunks", type=int, default=6, help="chunk rows per tensor")
    ap.add_argument("--max-tensors", type=int, default=8, help="tensors drawn (first started)")
    ap.add_argument("--min-chunks", type=int, default=1, help="only tensors of this many chunks")
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
    n_chunks = defaultdict(set)
    for t, c in where.values():
        n_chunks[t].add(c)
    tensors = [t for t in sorted(first, key=first.get) if len(n_chunks[t]) >= a.min_chunks]
    tensors = tensors[: a.max_tensors]

    rows = []  # (label, tensor, chunk or None)
    for t in tensors:
        rows.append((t, t, None))
        chunks = sorted({c for (tt, c) in where.values() if tt == t})
        for c in chunks[: a.max_chunks]:
            rows.append((f"  chunk {c}", t, c))
        if len(chunks) > a.max_chunks:
            rows.append((f"  ({len(chunks) - a.max_chunks} more chunks)", t, -1))
    index = {(t, c): i for i, (_, t, c) in enumerate(rows)}
    drawn = set(tensors)
    mine = [
        s
        for s in mine
        if (s[4].get("tensor") or where.get(s[4].get("key"), (None,))[0]) in drawn
    ]
    t0 = min(b for _, _, b, _, _ in mine)

    draw(mine, rows, index, where, t0, rank, a.out)
    print(f"{a.out}: {len(rows)} rows, worker {rank}")


if __name__ == "__main__":
    main()
