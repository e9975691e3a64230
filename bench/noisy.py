"""What each noisy-pair method costs per epoch against mh on the same network, measured side by
side in one run (each method in a child process of its own, one after the other, ``--rounds``
times interleaved, the best round of each):

    python bench/noisy.py --features cache/f8k_effnet_1c.h5 --text-features cache/f8k_minilm_text.h5 \\
        --grid cache/f8k_effnet_grid7.h5 --tokens cache/f8k_minilm_tokens.h5

- the fast loop (1C + MiniLM vectors, 1024-d, batch 128): mh, csn, infonce, siglip, rcl, decl, ncr;
- SGR at the size of experiments/f8k_noisy_sgr.yaml (embed 32, sim_dim 8, batch 32): mh, rcl, ncr.

An epoch = (training steps per epoch) × (median step) + the method's pass over every training
pair before the epoch (ncr, decl: ``Trainer.sample_statistics``, timed once). ncr trains two
networks: its step holds both forwards and backwards. Writes bench/results/noisy.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchkit import write_report  # noqa: E402

CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
import torch
from pipeline.core.config import TrainConfig
from pipeline.training.build import build_trainer
config, steps = json.loads(sys.argv[1]), int(sys.argv[2])
trainer = build_trainer(TrainConfig(**config), echo=lambda *a, **k: None, overwrite=True)
pairs = trainer.epoch_batches(0)
trainer.step(pairs[0])  # warm-up
times = []
for b in range(1, 1 + steps):
    t = time.perf_counter(); trainer.step(pairs[b]); times.append(time.perf_counter() - t)
pass_s = None
if trainer.loss_traits.sample_pass:
    t = time.perf_counter(); trainer.sample_statistics(); pass_s = time.perf_counter() - t
step = sorted(times)[len(times) // 2]
print(json.dumps({{"steps_per_epoch": len(pairs), "step_s": step, "pass_s": pass_s}}))
"""


def measure(config: dict, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), json.dumps(config), str(steps)],
                         check=True, cwd=ROOT, capture_output=True, text=True).stdout.splitlines()[-1]
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", default="cache/f8k_effnet_1c.h5")
    parser.add_argument("--text-features", default="cache/f8k_minilm_text.h5")
    parser.add_argument("--grid", default="cache/f8k_effnet_grid7.h5")
    parser.add_argument("--tokens", default="cache/f8k_minilm_tokens.h5")
    parser.add_argument("--noise-index", default="data/noise/flickr8k/image_20.npy")
    parser.add_argument("--fast-steps", type=int, default=60)
    parser.add_argument("--sgr-steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-sgr", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "noisy.json")
    args = parser.parse_args()
    run_dir = "/tmp/vse_bench_noisy"
    fast = dict(features=args.features, text_features=args.text_features, embed_dim=1024, batch_size=128,
                val_every=0, noise_index=args.noise_index, run_dir=run_dir)
    sgr = dict(features=args.grid, text_features=args.tokens, network="sgr", embed_dim=32,
               network_options={"sim_dim": 8}, batch_size=32, val_every=0, noise_index=args.noise_index,
               run_dir=run_dir)
    cases = {f"fast/{m}": (dict(fast, loss=m), args.fast_steps)
             for m in ("mh", "csn", "infonce", "siglip", "rcl", "decl", "ncr")}
    if not args.skip_sgr:
        cases.update({f"sgr/{m}": (dict(sgr, loss=m), args.sgr_steps) for m in ("mh", "rcl", "ncr")})
    best: dict = {}
    for _ in range(args.rounds):
        for name, (config, steps) in cases.items():
            result = measure(config, steps)
            if name not in best or result["step_s"] < best[name]["step_s"]:
                best[name] = result
    table = {}
    for name, r in best.items():
        epoch = r["steps_per_epoch"] * r["step_s"] + (r["pass_s"] or 0.0)
        table[name] = {"median_step_s": round(r["step_s"], 4), "steps_per_epoch": r["steps_per_epoch"],
                       "pass_s": None if r["pass_s"] is None else round(r["pass_s"], 1),
                       "epoch_s": round(epoch, 1)}
    for name, row in table.items():
        mh = table[name.split("/")[0] + "/mh"]["epoch_s"]
        row["epoch_vs_mh"] = round(row["epoch_s"] / mh, 2)
    write_report({"machine": platform.processor() or platform.machine(), "rounds": args.rounds,
                  "noise_index": args.noise_index, "methods": table}, args.out)


if __name__ == "__main__":
    main()
