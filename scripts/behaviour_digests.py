"""Digests of what training gives, to show a restructure changed no behaviour.

    PYTHONPATH=. python scripts/behaviour_digests.py --out digests.json [--only NAME,...]

Run it in two checkouts (e.g. ``git worktree add /tmp/before <commit>``, then in each) and compare
the two files: ``python scripts/behaviour_digests.py --compare before.json after.json`` prints every
entry that differs and exits 1 if any does.

It writes two tiny caches of the shipped demo captions (tests/conftest.py's learnable features: one
vector per image, and a 2 × 3 grid set per image) and trains each case of ``CASES`` for one or two
epochs through the CLI (`vse train`), as a user would. Per run it records: the config id and
config.json (less paths), the sha256 of every tensor of last.pt's model and optimizer state, the
validation records of metrics.jsonl (less their time), and, for each refused case, the error line.
Torch on one CPU thread is deterministic, so equal code gives equal digests; any difference is a
change of behaviour to explain.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

COMMON = ("--epochs", 1, "--word-dim", 8, "--batch-size", 16, "--lr", 5e-3, "--min-word-count", 1,
          "--val-every", 0, "--workers", 0, "--device", "cpu", "--log-every", 1)
# name → (cache: "vec" | "set", options)
CASES = {
    "vse++_sh": ("vec", ("--loss", "sh", "--embed-dim", 16)),
    "vse++_mh": ("vec", ("--loss", "mh", "--embed-dim", 16, "--epochs", 2, "--lr-decay-epoch", 1)),
    "vse++_infonce": ("vec", ("--loss", "infonce", "--embed-dim", 16)),
    "vse++_siglip": ("vec", ("--loss", "siglip", "--embed-dim", 16)),
    "vse++_csn": ("vec", ("--loss", "csn", "--embed-dim", 16)),
    "vse++_order": ("vec", ("--loss", "order", "--embed-dim", 16)),
    "vse++_mlp": ("vec", ("--loss", "mh", "--embed-dim", 16, "--projection", "mlp")),
    "vse++_rcl": ("vec", ("--loss", "rcl", "--embed-dim", 16, "--noise-rate", 0.2)),
    "vse++_decl": ("vec", ("--loss", "decl", "--embed-dim", 16, "--noise-rate", 0.2, "--epochs", 2,
                           "--loss-option", "warmup_epochs=1")),
    "vse++_ncr": ("vec", ("--loss", "ncr", "--embed-dim", 16, "--noise-rate", 0.2, "--epochs", 3)),
    "vse-infty_gpo": ("set", ("--network", "vse-infty", "--loss", "mh", "--embed-dim", 16)),
    "vse++_set_mean": ("set", ("--loss", "mh", "--image-pool", "mean", "--embed-dim", 16)),
    "vsrn": ("set", ("--network", "vsrn", "--loss", "mh", "--embed-dim", 16)),
    "vsrn_no_caption": ("set", ("--network", "vsrn", "--loss", "mh", "--embed-dim", 16,
                                "--caption-loss-weight", 0)),
    "sgr_mh": ("set", ("--network", "sgr", "--loss", "mh", "--embed-dim", 16,
                       "--network-option", "sim_dim=8")),
    "saf_mh": ("set", ("--network", "saf", "--loss", "mh", "--embed-dim", 16,
                       "--network-option", "sim_dim=8")),
    "sgr_ncr": ("set", ("--network", "sgr", "--loss", "ncr", "--embed-dim", 16, "--noise-rate", 0.2,
                        "--epochs", 3, "--network-option", "sim_dim=8")),
    "sgr_decl": ("set", ("--network", "sgr", "--loss", "decl", "--embed-dim", 16, "--noise-rate", 0.2,
                         "--network-option", "sim_dim=8")),
    # refusals: the message is the behaviour
    "refuse_vsrn_pool": ("set", ("--network", "vsrn", "--image-pool", "mean")),
    "refuse_sgr_rc": ("set", ("--network", "sgr", "--text-pool", "gpo")),
    "refuse_options_vse++": ("vec", ("--network-option", "sim_dim=8")),
    "refuse_sgr_option": ("set", ("--network", "sgr", "--network-option", "nope=1")),
    "sgr_infonce": ("set", ("--network", "sgr", "--loss", "infonce", "--embed-dim", 16)),
    "refuse_sgr_clip_vectors": ("set", ("--network", "sgr", "--loss", "mh", "--image-pool", "gpo")),
    "refuse_vec_pool": ("vec", ("--image-pool", "gpo")),
    "refuse_set_no_pool": ("set", ("--loss", "mh")),
    "refuse_caption_weight": ("vec", ("--caption-loss-weight", 1.0)),
}


def make_caches(folder: Path) -> dict:
    from conftest import demo_captions, learnable_features, write_feature_cache

    ids, captions = demo_captions(40)
    caption_image = np.repeat(np.arange(40), 5)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    vec = learnable_features(captions, caption_image, 40)
    base = learnable_features(captions, caption_image, 40, dim=24)
    sets = base[:, None, :] + 0.3 * np.random.default_rng(1).standard_normal((40, 6, 24)).astype(np.float32)
    return {"vec": write_feature_cache(folder / "vec.h5", vec, captions, caption_image, splits,
                                       image_ids=ids),
            "set": write_feature_cache(folder / "set.h5", sets, captions, caption_image, splits,
                                       image_ids=ids, grid=[2, 3])}


def tensor_digests(state) -> dict:
    import torch

    out = {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            out[prefix] = hashlib.sha256(value.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
        elif isinstance(value, dict):
            for k in sorted(value, key=str):
                walk(f"{prefix}/{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)
    walk("", state)
    return out


def run_case(name: str, cache: Path, options: tuple, folder: Path) -> dict:
    import torch
    from click.testing import CliRunner

    from cli.main import cli

    run = folder / name
    args = ["train", "--features", str(cache), "--run-dir", str(run), *map(str, COMMON), *map(str, options)]
    result = CliRunner().invoke(cli, args)
    if name.startswith("refuse_") or result.exit_code != 0:
        lines = [line for line in result.output.splitlines() if line.strip()]
        error = lines[-1] if lines else repr(result.exception)
        return {"exit_code": result.exit_code, "error": error.replace(str(folder.parent), "TMP")}
    config = json.loads((run / "config.json").read_text())
    for key in ("features", "run_dir"):
        config.pop(key, None)
    state = torch.load(run / "last.pt", weights_only=True)
    records = [{k: v for k, v in json.loads(line).items() if k != "time"}
               for line in (run / "metrics.jsonl").read_text().splitlines()]
    kept = {k: state[k] for k in ("model", "optimizer", "loss", "pool_weights") if k in state}
    digests = tensor_digests(kept)
    return {"exit_code": 0, "config": config, "records": records, "tensors": len(digests),
            "state_sha256": hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest(),
            "state": digests}


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = 0
    for name in sorted(set(a) | set(b)):
        if a.get(name) == b.get(name):
            print(f"equal   {name}")
            continue
        differ += 1
        x, y = a.get(name, {}), b.get(name, {})
        keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
        print(f"DIFFERS {name}: {', '.join(keys)}")
        for k in keys:
            if k in ("error", "config", "records"):
                print(f"    before {k}: {x.get(k)}\n    after  {k}: {y.get(k)}")
    print(f"{len(set(a) | set(b)) - differ} equal, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    import torch

    torch.set_num_threads(1)
    names = [n for n in CASES if not args.only or n in args.only.split(",")]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        caches = make_caches(Path(tmp))
        for name in names:
            kind, options = CASES[name]
            out[name] = run_case(name, caches[kind], options, Path(tmp) / "runs")
            print(f"{name}: exit {out[name]['exit_code']} "
                  f"{out[name].get('state_sha256', out[name].get('error', ''))[:80]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
