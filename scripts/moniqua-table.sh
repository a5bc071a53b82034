#!/usr/bin/env bash
# Moniqua's Table 2 on the built-in training job (BENCHMARKS.md, "Moniqua"):
# a ring of 8 workers, 3 seeds each: full-precision D-PSGD, Moniqua at 1, 2 and 4 bits and
# naive min-max averaging at the same bits. Writes one JSON report per row group to OUT
# (default bench/results/moniqua-DATE) and prints the tables.
#   scripts/moniqua-table.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/moniqua-$(date +%F)}
mkdir -p "$out"
# `pushpull local` starts the pushpull-server and pushpull-worker next to it: build them all.
cargo build --release --bins
bin=target/release/pushpull
run() { # name, args...: one JSON report, and its summary as a table
  local name=$1; shift
  "$bin" local --workers 8 --servers 2 --seeds 3 --json "$@" > "$out/$name.json"
  python3 - "$out/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps_params = lambda s: s["steps"] * r["params"]
for s in r["summary"]:
    acc = s["test_accuracy"]
    bits = 8 * s["bytes_pushed"] / steps_params(s)
    print(f'{s["name"]:14} {100 * acc["mean"]:6.2f} ± {100 * acc["sd"]:4.2f} %  '
          f'{bits:6.2f} bits/param/step  {s["wall_seconds"]["mean"]:6.1f} s  {s["compression"]}')
PY
}
run bits2 --compare dpsgd,moniqua,minmax-gossip
run bits4 --compare moniqua,minmax-gossip --param bits=4
run bits1-moniqua --config configs/gossip-1bit.toml
run bits1-minmax --config configs/gossip-1bit.toml --compressor minmax-gossip --param bits=1
