#!/usr/bin/env bash
# What recording the timeline costs a round, from CPU samples rather than wall time (which
# varies 3-10 % run to run on a shared machine): the benchmark job of scripts/observe-cost.sh
# (onebit, the ResNet-50 set at --scale, 2 workers x 2 servers on loopback) with
# PUSHPULL_TRACE, under `perf record` (every process); the samples whose stack holds the
# timeline's recording (pushpull_net::timeline, trace::frame, the worker's and server's spans,
# not the file's writing at the end) against the CPU the rounds used (the workers'
# cpu_seconds_push_pull, the servers' whole CPU time, per round). Needs perf.
#   scripts/timeline-share.sh [SCALE] [ROUNDS]
# PUSHPULL_BIN: the launcher to measure (default: this tree's, built here), e.g. to alternate
# two builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${1:-0.25} rounds=${2:-40} hz=2000
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 2; }
bin=${PUSHPULL_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --bins >&2
    bin=target/release/pushpull
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PUSHPULL_TRACE=$tmp/trace perf record -q -F $hz -g -o "$tmp/perf.data" \
  "$bin" local --job benchmark --compressor onebit --scale "$scale" \
  --rounds "$rounds" --warmup 2 --workers 2 --servers 2 --json > "$tmp/report.json"
perf script -i "$tmp/perf.data" 2>/dev/null | python3 -c '
import json, sys
hz, report = int(sys.argv[1]), json.load(open(sys.argv[2]))
samples, cur = [], []
for line in sys.stdin:
    if line.strip():
        cur.append(line)
    elif cur:
        samples.append(cur)
        cur = []
samples.append(cur)
recording = ("timeline::", "trace::frame", "spans::")
writing = ("timeline::write", "timeline::render", "event_json", "json_str")
def has(s, pats):
    return any(p in l for l in s for p in pats)
rec = sum(1 for s in samples if has(s, recording) and not has(s, writing))
w = report["workers"]
rounds = w[0]["rounds"] + w[0]["warmup"]
round_cpu = sum(x["cpu_seconds_push_pull"] / x["rounds"] for x in w) + sum(
    v for k, v in report["cpu_seconds"].items() if k.startswith("server")) / rounds
per_round = rec / hz / rounds
print(f"{rec} of {len(samples)} samples record the timeline: {per_round * 1e3:.2f} ms of CPU a "
      f"round, against {round_cpu * 1e3:.1f} ms of CPU a round: {100 * per_round / round_cpu:.1f} %")
' $hz "$tmp/report.json"
