"""A pairwise network re-ranking a dual network's shortlist, against exhaustive scoring, in one run.

    python bench/shortlist.py --pairwise runs/f8k/sgr_short/method=lseh-svd,seed=0/best.pt \
        --features cache/f8k_effnet_grid7.h5 \
        --shortlist runs/f8k/noisy/noise=clean,method=mh,seed=0/best.pt \
        --shortlist-features cache/f8k_effnet_1c.h5 --ks 10,50,100

On the test split: the dual network alone, the pairwise network scoring every pair (as
`vse evaluate` does), and the pairwise network re-ranking the dual network's top k for each k
(`vse evaluate --shortlist`, pipeline/evaluation/shortlist.py): R@K, rsum, the pairs scored and
the wall time of the scoring (the dual network's encoding, shared by every k, is timed apart).
Writes bench/results/shortlist.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from benchkit import write_report  # noqa: E402

KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairwise", required=True, help="A pairwise checkpoint (sgr, saf).")
    parser.add_argument("--features", required=True, help="Its feature cache.")
    parser.add_argument("--shortlist", required=True, help="A dual checkpoint.")
    parser.add_argument("--shortlist-features", required=True, help="Its feature cache.")
    parser.add_argument("--ks", default="10,50,100")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "shortlist.json")
    args = parser.parse_args()

    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.evaluate import embed_checkpoint
    from pipeline.evaluation.inference import load_model, score_split
    from pipeline.evaluation.metrics import evaluate_embeddings
    from pipeline.evaluation.shortlist import rerank_split

    cpu = torch.device("cpu")
    started = time.perf_counter()
    dual = embed_checkpoint(args.shortlist, args.shortlist_features, args.split, cpu)
    dual_seconds = time.perf_counter() - started
    dual_metrics = evaluate_embeddings(dual.images, dual.captions, dual.caption_image,
                                       similarity=dual.similarity)
    loaded = load_model(args.pairwise, cpu)
    rows = {}
    with FeatureCache(args.features) as cache:
        captions = loaded.captions(cache)
        started = time.perf_counter()
        full = score_split(loaded.model, cache, captions, args.split, cpu)
        seconds = time.perf_counter() - started
        metrics = evaluate_embeddings(full.images, full.captions, full.caption_image)
        pairs = full.captions.size
        rows["exhaustive"] = {**{k: metrics[k] for k in KEYS}, "pairs_scored": pairs,
                              "seconds": round(seconds, 1)}
        for k in (int(k) for k in args.ks.split(",")):
            started = time.perf_counter()
            reranked = rerank_split(loaded.model, cache, captions, args.split, cpu, dual, k)
            seconds = time.perf_counter() - started
            metrics = reranked.metrics()
            rows[f"top{k}"] = {**{key: metrics[key] for key in KEYS}, "pairs_scored": reranked.pairs_scored,
                               "seconds": round(seconds, 1),
                               "time_vs_exhaustive": round(seconds / rows["exhaustive"]["seconds"], 3)}
    write_report({
        "what": "a pairwise network re-ranking a dual network's top k, against scoring every pair",
        "split": args.split,
        "pairwise": args.pairwise, "features": args.features,
        "shortlist": args.shortlist, "shortlist_features": args.shortlist_features,
        "pairs": pairs,
        "dual_alone": {**{k: dual_metrics[k] for k in KEYS}, "seconds": round(dual_seconds, 1)},
        "pairwise_scoring": rows,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__},
    }, args.out)


if __name__ == "__main__":
    main()
