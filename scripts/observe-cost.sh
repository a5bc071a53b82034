#!/usr/bin/env bash
# What metrics and the timeline cost a round (BENCHMARKS.md, "Observability"): the benchmark
# job (onebit, the ResNet-50 set at --scale, 2 workers × 2 servers on loopback: CPU-bound),
# alternately with nothing on and with both on (every node serving /metrics, and writing a
# Chrome trace of every round), RUNS times each; prints each run's median round time and the
# medians' ratio, and the same for the workers' CPU seconds per round. ON=metrics or ON=trace
# turns on one of them only.
#
# ON=window compares within each job instead, where the sitting's noise is common to both
# sides: every node serves /metrics for the whole job, and the timeline records half of its
# timed rounds (`[trace] start_step` / `end_step`): the first half in one run, the second half
# in the next, alternately (so a job that speeds up or slows down over its rounds biases the
# two kinds oppositely). Each run's ratio is the median round time inside the window over the
# median outside it; RUNS runs of each kind.
#   [ON=both|metrics|trace|window] scripts/observe-cost.sh [RUNS] [SCALE] [ROUNDS]
# PUSHPULL_BIN: the launcher to measure (default: this tree's, built here), e.g. to alternate
# two builds.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5} scale=${2:-0.25} rounds=${3:-20}
bin=${PUSHPULL_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --bins >&2
    bin=target/release/pushpull
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
warmup=2
base=("$bin" local --job benchmark --compressor onebit --scale "$scale"
      --rounds "$rounds" --warmup "$warmup" --workers 2 --servers 2 --json)
if [ "${ON:-both}" = window ]; then
  half=$((rounds / 2))
  # Round r (from 0, warm-up included) is step r + 1: the timed rounds are steps
  # warmup + 1 ..= warmup + rounds.
  for i in $(seq "$runs"); do
    for kind in first second; do
      if [ $kind = first ]; then from=$((warmup + 1)) to=$((warmup + half))
      else from=$((warmup + half + 1)) to=$((warmup + rounds)); fi
      window='[metrics]\nlisten = "127.0.0.1:0"\n[trace]\ndir = "'"$tmp"'/trace"\nstart_step = '$from'\nend_step = '$to'\n'
      sed -e "/^\[server\]/i $window" configs/local.toml > "$tmp/$kind.toml"
      rm -rf "$tmp/trace"
      "${base[@]}" --config "$tmp/$kind.toml" > "$tmp/$kind-$i.json"
    done
  done
  python3 - "$tmp" "$runs" "$half" <<'PY'
import json, statistics, sys
tmp, runs, half = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ratio(path, first):
    r = json.load(open(path))
    inside, outside = [], []
    for w in r["workers"]:
        for i, s in enumerate(w["round_seconds"]):
            (inside if (i < half) == first else outside).append(s)
    return statistics.median(inside) / statistics.median(outside)
first = [ratio(f"{tmp}/first-{i}.json", True) for i in range(1, runs + 1)]
second = [ratio(f"{tmp}/second-{i}.json", False) for i in range(1, runs + 1)]
print("traced / untraced rounds, window first: ", " ".join(f"{x:.3f}" for x in first))
print("traced / untraced rounds, window second:", " ".join(f"{x:.3f}" for x in second))
print(f"medians {statistics.median(first):.3f}, {statistics.median(second):.3f}; "
      f"all {statistics.median(first + second):.3f}x")
PY
  exit 0
fi
metrics='[metrics]\nlisten = "127.0.0.1:0"\n' trace='[trace]\ndir = "'"$tmp"'/trace"\n'
case ${ON:-both} in
  both) add="$metrics\n$trace" ;; metrics) add=$metrics ;; trace) add=$trace ;;
  *) echo "ON=$ON: expected both, metrics or trace" >&2; exit 2 ;;
esac
sed -e "/^\[server\]/i $add" configs/local.toml > "$tmp/on.toml"
for i in $(seq "$runs"); do
  "${base[@]}" > "$tmp/off-$i.json"
  rm -rf "$tmp/trace"
  "${base[@]}" --config "$tmp/on.toml" > "$tmp/on-$i.json"
done
python3 - "$tmp" "$runs" <<'PY'
import json, statistics, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
def median_round(path):
    r = json.load(open(path))
    return statistics.median(s for w in r["workers"] for s in w["round_seconds"])
off = [median_round(f"{tmp}/off-{i}.json") for i in range(1, runs + 1)]
on = [median_round(f"{tmp}/on-{i}.json") for i in range(1, runs + 1)]
print("off (s/round):", " ".join(f"{x:.4f}" for x in off))
print("on  (s/round):", " ".join(f"{x:.4f}" for x in on))
print(f"median off {statistics.median(off):.4f}, on {statistics.median(on):.4f}: "
      f"{statistics.median(on) / statistics.median(off):.3f}x")
# The workers' CPU in the timed rounds (all their threads), less sensitive to a busy host than
# wall time; servers and the scheduler are not in it.
def worker_cpu(path):
    r = json.load(open(path))
    return sum(w["cpu_seconds_push_pull"] / w["rounds"] for w in r["workers"])
off = [worker_cpu(f"{tmp}/off-{i}.json") for i in range(1, runs + 1)]
on = [worker_cpu(f"{tmp}/on-{i}.json") for i in range(1, runs + 1)]
print("workers' CPU-s per round, off:", " ".join(f"{x:.4f}" for x in off))
print("workers' CPU-s per round, on: ", " ".join(f"{x:.4f}" for x in on))
print(f"median off {statistics.median(off):.4f}, on {statistics.median(on):.4f}: "
      f"{statistics.median(on) / statistics.median(off):.3f}x")
PY
