#!/usr/bin/env bash
# GPU smoke run: the whole pipeline once on a CUDA device, small, with timings.
#
#   bash bench/gpu_smoke.sh                       # from the repo root, the venv at .venv
#   VSE_SMOKE_DEVICE=cpu bash bench/gpu_smoke.sh  # the same steps on the CPU (checks the script)
#
# Steps: the CUDA-only tests of tests/test_gpu_faults.py (none may be skipped on a GPU) →
# a 64-image subset of data/ (48 train, 8 dev, 8 test) → `vse extract` 1C, efficientnet-lite0 →
# 1 epoch cached → 1 epoch RC fine-tuned, without and with --deterministic (the cost of
# deterministic kernels) → exact resume of a cached run, with and without --deterministic
# (2 epochs straight vs 1 + --resume 1, weights compared bit for bit) → torchrun with 2
# processes (one per GPU with 2 GPUs; both on one GPU through gloo with 1, as NCCL refuses two
# ranks on one GPU) → `vse evaluate` of the cached checkpoint in fp32 on the device and on the
# CPU, with --amp, and of the RC checkpoint on images.
# Writes bench/results/gpu_smoke.json (device, versions, seconds per step, rsums, exactness)
# and prints the timings.  Any failing step stops the run with its log's tail.
# Env: PYTHON (default .venv/bin/python), VSE_SMOKE_DEVICE (cuda | cpu), VSE_SMOKE_DIR (work
# folder, default a fresh temporary one), VSE_SMOKE_OUT (default bench/results/gpu_smoke.json),
# VSE_SMOKE_SKIP (step names left out, space-separated, e.g. to finish a run that a short GPU
# lease cut off: "tests train_rc train_rc_deterministic"; their figures are null in the JSON).
set -euo pipefail

PY=${PYTHON:-.venv/bin/python}
DEVICE=${VSE_SMOKE_DEVICE:-cuda}
WORK=${VSE_SMOKE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/vse_gpu_smoke.XXXXXX")}
OUT=${VSE_SMOKE_OUT:-bench/results/gpu_smoke.json}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

die() { echo "gpu_smoke: $*" >&2; exit 1; }
[[ -f cli/main.py && -d data/images ]] || die "run it from the repository root (bash bench/gpu_smoke.sh)"
command -v "$PY" > /dev/null || die "no Python at $PY (make install creates .venv; or set PYTHON=...)"
case $DEVICE in
  cuda) "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" \
          || die "no CUDA device is visible (VSE_SMOKE_DEVICE=cpu runs the steps on the CPU)" ;;
  cpu) ;;
  *) die "VSE_SMOKE_DEVICE must be cuda or cpu, not '$DEVICE'" ;;
esac
mkdir -p "$WORK" "$(dirname "$OUT")"
TIMES="$WORK/times.tsv"
: > "$TIMES"
echo "gpu_smoke: device $DEVICE, work folder $WORK" >&2

# step NAME COMMAND...: run, log to $WORK/NAME.log, record the wall time; stop loudly on failure
SKIP=" ${VSE_SMOKE_SKIP:-} "
step() {
  local name=$1 start end
  shift
  if [[ $SKIP == *" $name "* ]]; then
    echo "== $name: skipped (VSE_SMOKE_SKIP)" >&2
    return 0
  fi
  echo "== $name" >&2
  start=$(date +%s.%N)
  if ! "$@" > "$WORK/$name.log" 2>&1; then
    tail -n 40 "$WORK/$name.log" >&2
    die "step '$name' failed (whole log: $WORK/$name.log)"
  fi
  end=$(date +%s.%N)
  printf '%s\t%s\n' "$name" "$(awk "BEGIN {printf \"%.2f\", $end - $start}")" >> "$TIMES"
}

vse() { "$PY" -m cli.main "$@"; }

# tests: on a GPU the CUDA-only checks must run, not be skipped
gpu_tests() {
  "$PY" -m pytest tests/test_gpu_faults.py -q -rs -p no:cacheprovider
}
step tests gpu_tests
if [[ $DEVICE == cuda && -f $WORK/tests.log ]] && grep -q "SKIPPED" "$WORK/tests.log"; then
  grep "SKIPPED" "$WORK/tests.log" >&2
  die "CUDA-only tests were skipped on a GPU run"
fi

# a 64-image subset of the bundled data (copied: 2 MB)
make_subset() {
  "$PY" - "$WORK/data64" <<'EOF'
import shutil, sys
from pathlib import Path
src, dst = Path("data"), Path(sys.argv[1])
(dst / "images").mkdir(parents=True, exist_ok=True)
keep = set()
for split, n in (("train", 48), ("dev", 8), ("test", 8)):
    names = (src / f"Flickr_8k.{split}Images.txt").read_text().split()[:n]
    (dst / f"Flickr_8k.{split}Images.txt").write_text("\n".join(names) + "\n")
    keep.update(names)
for name in sorted(keep):
    shutil.copyfile(src / "images" / name, dst / "images" / name)
rows = [r for r in (src / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()
        if r.split("#")[0] in keep]
(dst / "Flickr8k.token.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
print(f"{len(keep)} images, {len(rows)} captions")
EOF
}
step subset make_subset
DATA="$WORK/data64"
FEATURES="$WORK/f64_effnet_1c.h5"
WORKERS=$([[ $DEVICE == cuda ]] && echo 4 || echo 1)
SMALL=(--embed-dim 256 --min-word-count 1 --val-every 0 --batch-size 32 --device "$DEVICE" --workers 0)
RC=(--rc --root "$DATA" --backbone efficientnet-lite0 --finetune --backbone-lr-factor 0.1 --epochs 1
    --embed-dim 256 --min-word-count 1 --val-every 0 --batch-size 32 --device "$DEVICE" --workers "$WORKERS")

step extract vse extract --dataset flickr8k --root "$DATA" --backbone efficientnet-lite0 --crops 1 \
  --out "$FEATURES" --device "$DEVICE" --workers "$WORKERS" --quiet
step train_cached vse train --features "$FEATURES" --run-dir "$WORK/cached" --epochs 1 "${SMALL[@]}"
step train_rc vse train "${RC[@]}" --run-dir "$WORK/rc"
step train_rc_deterministic vse train "${RC[@]}" --run-dir "$WORK/rc_det" --deterministic

# exact resume: 2 epochs straight against 1 epoch + --resume for the 2nd
resume_pair() {  # resume_pair NAME [--deterministic]
  local name=$1
  shift
  vse train --features "$FEATURES" --run-dir "$WORK/$name/full" --epochs 2 "${SMALL[@]}" "$@"
  vse train --features "$FEATURES" --run-dir "$WORK/$name/cut" --epochs 1 "${SMALL[@]}" "$@"
  vse train --features "$FEATURES" --run-dir "$WORK/$name/cut" --epochs 2 --resume "${SMALL[@]}" "$@"
}
step resume_default resume_pair resume_default
step resume_deterministic resume_pair resume_deterministic --deterministic

ddp() {
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m cli.main train --features "$FEATURES" \
    --run-dir "$WORK/ddp" --epochs 1 --embed-dim 256 --min-word-count 1 --val-every 0 --batch-size 16 \
    --device "$DEVICE" --workers 0
}
step torchrun_2proc ddp

evaluate_json() {  # evaluate_json NAME ARGS...: one JSON line of metrics → $WORK/NAME.json
  local name=$1
  shift
  vse evaluate --split test --json "$@" > "$WORK/$name.json"
}
CACHED_BEST=(--checkpoint "$WORK/cached/best.pt" --features "$FEATURES")
step evaluate_fp32 evaluate_json eval_fp32 "${CACHED_BEST[@]}" --device "$DEVICE"
step evaluate_fp32_cpu evaluate_json eval_fp32_cpu "${CACHED_BEST[@]}" --device cpu
step evaluate_amp evaluate_json eval_amp "${CACHED_BEST[@]}" --device "$DEVICE" --amp
step evaluate_rc evaluate_json eval_rc --checkpoint "$WORK/rc/best.pt" --root "$DATA" --device "$DEVICE"

"$PY" - "$WORK" "$DEVICE" "$OUT" <<'EOF'
import json, os, re, subprocess, sys
from pathlib import Path
import torch
from pipeline.core.checkpoint import load_checkpoint

work, device, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
seconds = {}
for line in (work / "times.tsv").read_text().splitlines():
    name, value = line.split("\t")
    seconds[name] = float(value)

def ran(name):
    return name in seconds

def same_weights(name):
    if not ran(name):
        return None
    full, cut = (load_checkpoint(work / name / run / "last.pt") for run in ("full", "cut"))
    return all(torch.equal(value, cut["model"][key]) for key, value in full["model"].items())

def rsum(name):
    if not (work / f"{name}.json").exists():
        return None
    return json.loads((work / f"{name}.json").read_text())["rsum"]

def setup_line(log):
    if not (work / log).exists():
        return None
    return next((line for line in (work / log).read_text().splitlines() if line.startswith("device ")), "")

gpu = torch.cuda.is_available() and device == "cuda"
try:  # a copy of the tree without its .git (a lent GPU machine) says so
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
commit = commit or os.environ.get("VSE_SMOKE_COMMIT", "unknown")
ddp_line = setup_line("torchrun_2proc.log")
summary = {
    "device": torch.cuda.get_device_name(0) if gpu else "cpu",
    "gpus": torch.cuda.device_count() if gpu else 0,
    "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if gpu else None,
    "torch": torch.__version__, "cuda": torch.version.cuda, "commit": commit,
    "images": {"train": 48, "dev": 8, "test": 8}, "backbone": "efficientnet-lite0",
    "seconds": seconds,
    "skipped": sorted(set(os.environ.get("VSE_SMOKE_SKIP", "").split())),
    "deterministic_rc_slowdown": (round(seconds["train_rc_deterministic"] / seconds["train_rc"], 3)
                                  if ran("train_rc") and ran("train_rc_deterministic") else None),
    "setup": {"cached": setup_line("train_cached.log"), "rc": setup_line("train_rc.log"),
              "rc_deterministic": setup_line("train_rc_deterministic.log"), "torchrun": ddp_line},
    "torchrun_backend": (re.findall(r"\((\w+)\)$", ddp_line or "") or [None])[0],
    "resume_bit_exact": {"default": same_weights("resume_default"),
                         "deterministic": same_weights("resume_deterministic")},
    "rsum": {"fp32_device": rsum("eval_fp32"), "fp32_cpu": rsum("eval_fp32_cpu"),
             "amp_device": rsum("eval_amp"), "rc_device": rsum("eval_rc")},
}
if rsum("eval_fp32") is not None and rsum("eval_fp32_cpu") is not None:
    summary["rsum"]["fp32_device_minus_cpu"] = round(rsum("eval_fp32") - rsum("eval_fp32_cpu"), 4)
out.write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
print("\nseconds per step:")
for name, value in seconds.items():
    print(f"  {name:24s}{value:9.2f}")
print(f"→ {out}")
EOF
