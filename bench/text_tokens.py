"""Reading a token caption-feature file (`vse encode-text --tokens`): open time, batch gather
time, and how close the mean of each caption's tokens is to the pooled file of the same model.

- open_s: ``CaptionTokenFeatures(path)``: the whole file read into memory and checked;
- gather_ms: ``batch(ids)`` for random batches of --batch captions → (B, T_max, d) float32 +
  lengths, median and 90th percentile over --rounds;
- cosine (with --vectors): normalised mean of every caption's token vectors against the row of
  the one-vector file (`vse encode-text` without --tokens), minimum and median.

Prints one JSON object. Usage:
    python bench/text_tokens.py --tokens cache/f8k_minilm_tokens.h5 --vectors cache/f8k_minilm_text.h5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from pipeline.data.caption_features import CaptionFeatures, CaptionTokenFeatures

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--vectors")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()

    start = time.perf_counter()
    file = CaptionTokenFeatures(args.tokens)
    open_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    times, widths = [], []
    for _ in range(args.rounds):
        ids = rng.integers(0, file.num_captions, args.batch)
        start = time.perf_counter()
        padded, _ = file.batch(ids)
        times.append(time.perf_counter() - start)
        widths.append(padded.shape[1])
    result = {"file": Path(args.tokens).name, "size_mb": round(os.path.getsize(args.tokens) / 1e6, 1),
              "model": file.model, "num_captions": file.num_captions, "num_tokens": file.num_tokens,
              "dim": file.dim, "mean_tokens": round(float(file.lengths.mean()), 2),
              "max_tokens": int(file.lengths.max()), "open_s": round(open_s, 2), "batch": args.batch,
              "gather_ms_median": round(1e3 * float(np.median(times)), 2),
              "gather_ms_p90": round(1e3 * float(np.percentile(times, 90)), 2),
              "padded_width_median": float(np.median(widths)), "load_average": os.getloadavg()[0]}
    if args.vectors:
        sums = np.add.reduceat(file.tokens.astype(np.float32), file.offsets[:-1], axis=0)
        means = sums / np.linalg.norm(sums, axis=1, keepdims=True)
        cosine = (means * CaptionFeatures(args.vectors).vectors()).sum(axis=1)
        result.update(cosine_min=float(cosine.min()), cosine_median=float(np.median(cosine)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
