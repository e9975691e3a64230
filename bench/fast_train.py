"""Training on cached image *and* caption features (--text-features): throughput and wall time.

- ratio: pairs/s of ``Trainer.train_epoch`` (the real loop: epoch order, batches, loss,
  clipping, optimizer, progress) against a bare loop of the same two heads' forward +
  backward + step over the same batches, indexed from in-memory tensors (target ≥ 0.8);
- full run: wall time of ``Trainer.fit`` (set-up included) for --epochs epochs with a
  validation (1,000 dev images) after every epoch (target ≤ 90 s for 30 epochs on 2 cores,
  Flickr8k, 1024-d), and the test metrics of its best.pt.

Prints one JSON object. Usage:
    python bench/fast_train.py --features cache/f8k_effnet_1c.h5 --text-features cache/f8k_minilm_text.h5
Without --features, a Flickr8k-sized synthetic pair (8,000 images × 1,280 random features;
40,000 demo captions, cycled, with random 384-d unit vectors written by `encode_text`) stands
in: the same tensor sizes, so the same timings; its metrics mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchkit import trainer_vs_bare  # noqa: E402


def synthetic_pair(folder: Path, num_images: int = 8000, dim: int = 1280, text_dim: int = 384,
                   held_out: int = 1000, stem: str = "synthetic"):
    """A Flickr8k-sized feature cache (``held_out`` images each for dev and test) and caption-feature
    file of random vectors, FOLDER/STEM.h5 and FOLDER/STEM_text.h5."""
    from conftest import demo_captions, write_feature_cache

    import pipeline.text.encoders as encoders
    from pipeline.data.caption_features import encode_text

    ids, captions = demo_captions(1000)
    captions = [captions[j % len(captions)] for j in range(5 * num_images)]
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((num_images, dim)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    n, k = num_images, held_out
    splits = {"train": np.arange(n - 2 * k), "dev": np.arange(n - 2 * k, n - k), "test": np.arange(n - k, n)}
    cache = write_feature_cache(folder / f"{stem}.h5", feats, captions, np.repeat(np.arange(num_images), 5),
                                splits, image_ids=[f"img{i}" for i in range(num_images)])

    def random_vectors(texts, *args, **kwargs):
        v = rng.standard_normal((len(texts), text_dim)).astype(np.float32)
        return encoders.EncodedCaptions(v / np.linalg.norm(v, axis=1, keepdims=True))

    real = encoders.encode_captions
    encoders.encode_captions = random_vectors
    try:
        encode_text(cache, "cbow", folder / f"{stem}_text.h5")  # identity says cbow: vectors are random
    finally:
        encoders.encode_captions = real
    return cache, folder / f"{stem}_text.h5"


def measure_ratio(cfg, batches: int, rounds: int) -> dict:
    from pipeline.training.build import build_trainer

    trainer = build_trainer(cfg, echo=lambda *a: None)
    pairs = trainer.epoch_batches(0)
    pairs.slices = pairs.slices[:batches]
    images = torch.from_numpy(trainer.source.inputs._array)      # the preloaded image features
    vectors = trainer.captions.vectors                           # the caption vectors in memory
    order = [torch.from_numpy(pairs.caption_ids[pairs.order[s]]) for s in pairs.slices]
    index = [(torch.from_numpy(trainer.index.caption_image)[c], c) for c in order]

    def bare_batches():  # the gather from memory is part of the bare loop's work
        return ((images[rows], (vectors[caps],), rows) for rows, caps in index)

    return trainer_vs_bare(trainer, pairs, bare_batches, sum(len(c) for c in order), rounds, target=0.8)


def measure_full_run(cfg) -> dict:
    from pipeline.evaluation.evaluate import embed_checkpoint, evaluate_split_embeddings
    from pipeline.training.build import build_trainer

    start, cpu = time.perf_counter(), time.process_time()
    def log(message):
        print(f"[{time.perf_counter() - start:.1f} s] {message}", file=sys.stderr)

    summary = build_trainer(cfg, echo=log).fit()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    emb = embed_checkpoint(Path(cfg.run_dir) / "best.pt", cfg.features, "test", torch.device("cpu"))
    test = evaluate_split_embeddings(emb)
    return {"epochs": cfg.epochs, "wall_s": round(wall, 1), "target_wall_s": 90,
            "process_cpu_s": round(cpu, 1),  # all threads: under load, what the run itself used
            "best_dev_rsum": round(summary["best_rsum"], 2), "best_epoch": summary["best_epoch"],
            "test": {k: round(float(test[k]), 2) for k in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5",
                                                           "t2i_r10", "rsum")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features")
    parser.add_argument("--text-features")
    parser.add_argument("--loss", default="mh")
    parser.add_argument("--embed-dim", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=60, help="batches per ratio round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30, help="of the full run (0: no full run)")
    parser.add_argument("--lr-decay-epoch", type=int, default=15)
    args = parser.parse_args()
    if bool(args.features) != bool(args.text_features):
        parser.error("give --features and --text-features together (or neither: synthetic)")

    from pipeline.core.config import TrainConfig

    with tempfile.TemporaryDirectory() as tmp:
        features, text = ((args.features, args.text_features) if args.features
                          else synthetic_pair(Path(tmp)))
        common = dict(features=str(features), text_features=str(text), loss=args.loss,
                      batch_size=args.batch_size, embed_dim=args.embed_dim, workers=0, log_every=10)
        ratio = measure_ratio(TrainConfig(run_dir=str(Path(tmp) / "ratio"), val_every=0, **common),
                              args.batches, args.rounds)
        full = (measure_full_run(TrainConfig(run_dir=str(Path(tmp) / "full"), epochs=args.epochs, val_every=0,
                                             lr_decay_epoch=args.lr_decay_epoch, **common))
                if args.epochs else None)
    from pipeline.data.caption_features import CaptionFeatures

    print(json.dumps({
        "features": str(args.features) if args.features else "synthetic Flickr8k-sized (8000 × 1280 random)",
        "text_features": (str(args.text_features) if args.text_features
                          else "synthetic (40000 × 384 random unit vectors)"),
        "text_model": CaptionFeatures(text).model if args.text_features else None,
        "loss": args.loss, "batch_size": args.batch_size, "embed_dim": args.embed_dim,
        "ratio": ratio, "full_run": full,
        "torch_threads": torch.get_num_threads(), "device": "cpu",
    }, indent=2))


if __name__ == "__main__":
    main()
