#!/usr/bin/env bash
# Issue 50's goals on a GPU in one command, in about 4-5 minutes on an H100 or H200 (under 8):
#
#   OUT=folder bash bench/gpu_benches.sh
#
# 1. pairwise: SGR's and SAF's training steps against the authors' code running there as written
#    (bench/train_pairwise.py --device cuda: fp32, bf16 autocast, the products alone, the
#    authors'; 10 interleaved rounds, medians; peak GPU memory of each), then VSRN's the same way;
#    pairwise_one_chunk: SGR's and SAF's steps with the authors' batch in one chunk (padded to its
#    longest caption) and sgraf_ops' blocks of 2^28 floats, instead of 2 chunks and blocks of 2^26:
#    fewer launches (bench/results/op_counts.json's alternatives), more arithmetic and memory (a
#    CPU's emulation: +2.3 GB for SGR's one chunk), the choice to make there against the authors'
#    peak memory;
# 2. profile: one profiled step of each (fp32 and bf16), VSRN's at the authors' sizes:
#    host_fraction = 1 − the kernels' busy time ÷ the step's wall time (goal ≤ 0.15);
# 3. dual_step: the cached dual trainer (`vse train`'s Trainer, the cache preloaded) against the
#    bare PyTorch loop of bench/bare_loop.py with its cache on the GPU: ours_over_bare (goal
#    ≥ 0.9) and the host_fraction of each;
# 4. gpu_goals: every goal with its value and met / not met (OUT/gpu_goals.json).
# The operator counts need no GPU (bench/op_counts.py, any machine). VSE_GPU_SMOKE=1 adds
# bench/gpu_smoke.sh and the evaluation bench after them (4-5 minutes more).
#
# Env: PYTHON (default .venv/bin/python; python3 on a machine without the venv), OUT (where the
# JSON files and logs go, default bench/results), VSE_SGRAF_CHECKOUT / VSE_VSRN_CHECKOUT (the
# authors' checkouts; without one the authors' step and memory are left out), VSE_BENCH_DEVICE
# (default cuda; cpu with VSE_BENCH_QUICK=1 checks the script on any machine, small sizes).
# A failing part is reported and the next one still runs; the exit status is the number of
# failed parts.
set -uo pipefail

PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
DEV=${VSE_BENCH_DEVICE:-cuda}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
failed=0
began=$(date +%s)
if [[ ${VSE_BENCH_QUICK:-0} == 1 ]]; then  # the script's own check: small sizes, few rounds
  size=(--size small) vsrn_profile=(--size small) steps=2 dual=(--images 200 --steps 2 --rounds 1)
else
  size=() vsrn_profile=(--size authors) steps=10 dual=()
fi
suffix=$([[ $DEV == cuda ]] && echo _cuda || echo _$DEV)

part() {  # part NAME COMMAND...: run, its output to OUT/NAME.log, time it, count a failure
  local name=$1 start
  shift
  echo "== $name ($(date +%T), $(( $(date +%s) - began )) s in)"
  start=$(date +%s)
  if "$@" > "$OUT/$name.log" 2>&1; then
    echo "   ok, $(( $(date +%s) - start )) s"
  else
    echo "   FAILED ($?), $(( $(date +%s) - start )) s; its log's tail:"
    tail -n 25 "$OUT/$name.log"
    failed=$((failed + 1))
  fi
}

"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
part pairwise "$PY" bench/train_pairwise.py --device "$DEV" --bf16 --steps "$steps" "${size[@]}" \
  --authors "${VSE_SGRAF_CHECKOUT:-}" --out "$OUT/train_pairwise$suffix.json"
part pairwise_one_chunk "$PY" bench/train_pairwise.py --device "$DEV" --bf16 --steps 5 "${size[@]}" \
  --pair-budget 1073741824 --block-floats 268435456 --authors "" \
  --out "$OUT/train_pairwise_one_chunk$suffix.json"
part pairwise_vsrn "$PY" bench/train_pairwise.py --vsrn --device "$DEV" --bf16 --steps "$steps" "${size[@]}" \
  --authors "${VSE_VSRN_CHECKOUT:-}" --out "$OUT/train_pairwise_vsrn$suffix.json"
part profile "$PY" bench/train_pairwise.py --profile --device "$DEV" --bf16 "${size[@]}" \
  --out "$OUT/train_pairwise_profile$suffix.json"
part profile_vsrn "$PY" bench/train_pairwise.py --vsrn --profile --device "$DEV" --bf16 "${vsrn_profile[@]}" \
  --authors "${VSE_VSRN_CHECKOUT:-}" --out "$OUT/vsrn_step_profile$suffix.json"
part dual_step "$PY" bench/dual_step.py --device "$DEV" "${dual[@]}" --out "$OUT/dual_step$suffix.json"
part gpu_goals "$PY" bench/gpu_goals.py "$OUT" "$suffix"
cat "$OUT/gpu_goals.log" 2>/dev/null | head -n 80
if [[ ${VSE_GPU_SMOKE:-0} == 1 ]]; then
  part gpu_smoke env PYTHON="$PY" VSE_SMOKE_OUT="$OUT/gpu_smoke.json" VSE_SMOKE_DIR="${TMPDIR:-/tmp}/vse_smoke" \
    bash bench/gpu_smoke.sh
  part evaluate_cuda "$PY" bench/evaluate.py --device cuda  # its JSON: OUT/evaluate_cuda.log
fi
echo "failed parts: $failed; $(( $(date +%s) - began )) s in all"
exit "$failed"
