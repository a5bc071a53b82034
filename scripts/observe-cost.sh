#!/usr/bin/env bash
# What metrics and the timeline cost a round (BENCHMARKS.md, "Watching a job"): the benchmark
# job (onebit, the ResNet-50 set at --scale, 2 workers × 2 servers on loopback: CPU-bound),
# alternately with nothing on and with both on (every node serving /metrics, and writing a
# Chrome trace of every round), RUNS times each; prints each run's median round time and the
# medians' ratio, and the same for the workers' CPU seconds per round. ON=metrics or ON=trace
# turns on one of them only.
#   [ON=both|metrics|trace] scripts/observe-cost.sh [RUNS] [SCALE] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5} scale=${2:-0.25} rounds=${3:-20}
cargo build --release --bins >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(target/release/pushpull local --job benchmark --compressor onebit --scale "$scale"
      --rounds "$rounds" --warmup 2 --workers 2 --servers 2 --json)
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
