#!/usr/bin/env bash
# Everything a GPU session checks, in one command (a lent GPU machine's time is short):
# bench/gpu_smoke.sh, then the pairwise networks' training steps on the GPU against the authors'
# code running there as written (bench/train_pairwise.py --device cuda, SGR/SAF and VSRN, fp32
# and bf16 autocast), then the evaluation bench on the GPU.
#
#   OUT=folder bash bench/gpu_benches.sh
#
# Env: PYTHON (default .venv/bin/python; python3 on a machine without the venv), OUT (where the
# JSON files and logs go, default bench/results), VSE_SGRAF_CHECKOUT / VSE_VSRN_CHECKOUT (the
# authors' checkouts; without one the authors' step is left out). A failing part is reported
# and the next one still runs; the exit status is the number of failed parts.
set -uo pipefail

PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
failed=0

part() {  # part NAME COMMAND...: run, its output to OUT/NAME.log, time it, count a failure
  local name=$1 start
  shift
  echo "== $name ($(date +%T))"
  start=$(date +%s)
  if "$@" > "$OUT/$name.log" 2>&1; then
    echo "   ok, $(( $(date +%s) - start )) s"
  else
    echo "   FAILED ($?), $(( $(date +%s) - start )) s; its log's tail:"
    tail -n 25 "$OUT/$name.log"
    failed=$((failed + 1))
  fi
}

"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
part gpu_smoke env PYTHON="$PY" VSE_SMOKE_OUT="$OUT/gpu_smoke.json" VSE_SMOKE_DIR="${TMPDIR:-/tmp}/vse_smoke" \
  bash bench/gpu_smoke.sh
part pairwise "$PY" bench/train_pairwise.py --device cuda --bf16 --steps 10 \
  --authors "${VSE_SGRAF_CHECKOUT:-}" --out "$OUT/train_pairwise_cuda.json"
part pairwise_vsrn "$PY" bench/train_pairwise.py --vsrn --device cuda --bf16 --steps 10 \
  --authors "${VSE_VSRN_CHECKOUT:-}" --out "$OUT/train_pairwise_vsrn_cuda.json"
part evaluate_cuda "$PY" bench/evaluate.py --device cuda  # its JSON: OUT/evaluate_cuda.log
echo "failed parts: $failed"
exit "$failed"
