#!/usr/bin/env bash
# The GPU checks, on a lent GPU machine, over the kit scripts/gpu-kit.sh built here (carry
# ./gpu-kit). Each stage has its own time limit and its own log in $OUT (the `device` tool's
# folder that comes back; /tmp/gpu-out elsewhere); a failed stage does not stop the next, and
# the script exits non-zero if any failed. Run the correctness stages first: a lease is 15
# minutes of device time.
#
# Usage: scripts/gpu-check.sh STAGE...      (stages in the order given)
#   correct `tests` and `pytest` side by side (they check bits, not time): the first stage of a
#           lease, about 30 s on an H100
#   tests   the ignored GPU tests of the kernels (shipped PTX loads; kernels and batches against
#           the CPU) and of the worker (device buffers, single and grouped, the reference's bits)
#   pytest  python/tests/test_gpu.py: torch CUDA tensors through pushpull.torch (two workers on
#           GPU 0), the stream race, float16, refusals; python/tests/test_checkpoint.py: state on
#           the GPU restarted bit for bit (PUSHPULL_REQUIRE_GPU=1: no silent skip)
#   bench   bench_gpu: kernels against a device-to-device copy, a batch's GB/s and driver calls
#   codecs  bench_compress: the CPU's onebit codecs (what a server's encode costs there) on one
#           core, 1 Mi elements (a 4 MB chunk), against memcpy
#   job     the ResNet-50-set benchmark job, 2 workers x 2 servers at the default partition,
#           host against device buffers, onebit, fp16 and none (group calls: one batch per round
#           on each worker)
#   torch   bench/torch_vs_ddp.py: ResNet-50 b32, two ranks on the GPU, pushpull.torch (none,
#           fp16, onebit + ef) against torch DDP (gloo) and the no-communication ceiling
#   oneworker  issue 28's one-worker A/B, each variant its own run and log: onebit + ef with
#           the ceiling, step() waiting on the CPU and ordered on the GPU (--ordered-step
#           both), then without the ceiling: every small gradient its own round (--no-fuse),
#           4 MiB buckets (--bucket-mb 4), and each pushpull process capped at 2 rayon and 2
#           tokio threads (is the servers' slow encode there oversubscription?); ONE_ARGS
#           (default "--config configs/gpu-local.toml --timeout 100") go to every run
# Environment: TORCH_ARGS, more arguments of torch_vs_ddp.py (e.g. "--timeout 100");
# JOB_COMPRESSORS, the job stage's compressors (default "onebit fp16 none"). RAYON_NUM_THREADS and
# TOKIO_WORKER_THREADS reach every pushpull process (servers, workers: each otherwise starts
# a rayon pool and a tokio runtime of one thread per core), e.g. to test whether the servers'
# encode on the 16-core machine is slow because two servers, the workers and torch
# oversubscribe it: RAYON_NUM_THREADS=2 TOKIO_WORKER_THREADS=2 TORCH_ARGS=... scripts/gpu-check.sh torch
#
# Logs: one per stage (and one per torch run) in /tmp/gpu-out; with the `device` tool's $OUT
# set, they come back packed as $OUT/gpu-logs.tgz (the tool returns at most 8 files), also when
# the script is stopped by its time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
out=/tmp/gpu-out
mkdir -p "$out"
if [ -n "${OUT:-}" ] && [ "$OUT" != "$out" ]; then
    trap 'tar czf "$OUT/gpu-logs.tgz" -C "$out" .' EXIT
fi
kit=gpu-kit
failed=()

# Unpack the kit (once per machine) and install the wheel where python3 finds it.
for f in "$kit"/bin/*.xz; do
    [ -e "$f" ] && [ ! -e "${f%.xz}" ] || continue
    xz -dk "$f" && chmod +x "${f%.xz}"
done
site=/tmp/pushpull-site
if [ ! -d "$site/pushpull" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$kit"/*.whl
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PUSHPULL_BIN="$PWD/$kit/bin/pushpull"
nvidia-smi -L || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

# stage NAME LIMIT COMMAND...: runs COMMAND with a time limit, its output in $out/NAME.log.
stage() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || failed+=("$name")
}

job() {
    local cfg="$out/job.toml"
    # The repository's local cluster at its default partition (128 KB), rounds unchecked (the
    # `tests` stage checks the bits; the CPU reference would dominate the time).
    sed -e 's/^check = true/check = false/' configs/local.toml >"$cfg"
    for compressor in ${JOB_COMPRESSORS:-onebit fp16 none}; do
        for buffers in host device; do
            "$PUSHPULL_BIN" local --config "$cfg" --job benchmark --buffers "$buffers" \
                --compressor "$compressor" --scale 1 --rounds 5 || return 1
        done
    done
}

for s in "$@"; do
    case "$s" in
        correct)
            # Each in a shell of its own (its failures array is its own): the exit codes say.
            OUT= "$0" tests >"$out/correct-tests.txt" 2>&1 &
            OUT= "$0" pytest >"$out/correct-pytest.txt" 2>&1 &
            ok=1
            for job in $(jobs -p); do
                wait "$job" || ok=0
            done
            [ "$ok" = 1 ] || failed+=("correct")
            grep -h "^== " "$out/correct-tests.txt" "$out/correct-pytest.txt"
            ;;
        tests)
            stage kernels-lib 120 "$kit/bin/kernels-lib" --ignored shipped_ptx
            stage kernels-cuda_gpu 240 "$kit/bin/kernels-cuda_gpu" --ignored
            stage kernels-device_batch 240 "$kit/bin/kernels-device_batch" --ignored --nocapture
            stage worker-device 240 "$kit/bin/worker-device" --ignored --nocapture
            ;;
        pytest) stage pytest 360 env PUSHPULL_REQUIRE_GPU=1 python3 -m pytest python/tests/test_gpu.py python/tests/test_checkpoint.py -q -x ;;
        bench) stage bench 240 "$kit/bin/bench_gpu" --reps 10 ;;
        codecs) stage codecs 120 "$kit/bin/bench_compress" --sizes 1048576 --min-ms 200 --filter onebit ;;
        # `timeout` runs programs, not shell functions: the job runs in a bash of its own.
        job) stage job 540 bash -c "$(declare -f job); out=$(printf %q "$out"); job" ;;
        torch) stage torch 580 python3 bench/torch_vs_ddp.py --pushpull "$PUSHPULL_BIN" --logs "$out/torch-runs" ${TORCH_ARGS:-} ;;
        oneworker)
            one=(python3 bench/torch_vs_ddp.py --pushpull "$PUSHPULL_BIN" --workers 1
                 --compressors onebit ${ONE_ARGS:---config configs/gpu-local.toml --timeout 100})
            stage oneworker-fused 240 "${one[@]}" --skip ddp --ordered-step both --logs "$out/one-fused"
            stage oneworker-nofuse 150 "${one[@]}" --skip ddp,ceiling --no-fuse --logs "$out/one-nofuse"
            stage oneworker-bucket4 150 "${one[@]}" --skip ddp,ceiling --bucket-mb 4 --logs "$out/one-bucket4"
            stage oneworker-threads2 150 env RAYON_NUM_THREADS=2 TOKIO_WORKER_THREADS=2 \
                "${one[@]}" --skip ddp,ceiling --logs "$out/one-threads2"
            ;;
        *) echo "unknown stage $s (correct, tests, pytest, bench, codecs, job, torch, oneworker)"; failed+=("$s") ;;
    esac
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "== failed: ${failed[*]}"
    exit 1
fi
echo "== all stages passed"
