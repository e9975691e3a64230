"""Relevance stage: does it separate same-image from different-image captions, and what does
it cost (time, peak memory) from Flickr8k to a COCO-sized corpus?

- flickr8k: every method fitted on the official train captions; on the test split, ROC AUC
  of relevance for all same-image caption pairs (10,000) vs as many random different-image
  pairs. BERT encodes only the test captions by default (CPU: ~100 captions/s).
- synthetic: random captions drawn from the Flickr8k vocabulary (unigram frequencies,
  Flickr8k caption lengths) at 56,600 and 566,000 captions (COCO's training size): time
  and peak RSS of svd (fit + vectors) and cbow, and their 566k/56.6k ratios (10 = linear).
- neighbours: top-100 training captions of every Flickr8k caption (40k × 30k, blockwise).
- batch: time of one BatchRelevance call (B = 128) on the largest synthetic table.

Every measurement runs in a fresh subprocess; peak memory is the rise of the peak RSS
(VmHWM, reset before the measured step) above the RSS just before it.
Prints one JSON object. Usage:
  python bench/relevance.py [--sizes 56600,566000] [--bert-captions test|all|none]
                            [--no-neighbours] [--data ../shared/data/flickr8k]
Takes ~6 min on 2 idle CPU cores; --sizes 5660,56600 --bert-captions none --no-neighbours
for a quick run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "flickr8k"
AUC_PAIRS_SEED = 0


# ---------------------------------------------------------------------------- memory


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Rise of peak RSS over the RSS at entry, in MB (Linux VmHWM, reset on entry)."""

    def __enter__(self):
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            self.resettable = True
        except OSError:
            self.resettable = False
        self.start_kb = _status_kb("VmRSS") or 0
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        peak = _status_kb("VmHWM") if self.resettable else None
        peak = peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.peak_mb = round((peak - self.start_kb) / 1024, 1)

    def result(self) -> dict:
        return {"time_s": round(self.seconds, 2), "peak_rss_rise_mb": self.peak_mb}


# ---------------------------------------------------------------------------- data


def load_flickr8k(root):
    from pipeline.data.readers import load_dataset

    ds = load_dataset("flickr8k", root)
    image = ds.caption_image
    train = np.flatnonzero(np.isin(image, ds.splits["train"]))
    test = np.flatnonzero(np.isin(image, ds.splits["test"]))
    return ds.captions, image, train, test


def auc_pairs(image, test, seed=AUC_PAIRS_SEED):
    """All same-image pairs among the test captions and as many random different-image pairs."""
    test_image = image[test]
    same_i, same_j = np.nonzero(np.triu(test_image[:, None] == test_image[None, :], k=1))
    rng = np.random.default_rng(seed)
    diff_i, diff_j = [], []
    while sum(map(len, diff_i)) < len(same_i):
        a, b = rng.integers(0, len(test), (2, 2 * len(same_i)))
        keep = test_image[a] != test_image[b]
        diff_i.append(a[keep])
        diff_j.append(b[keep])
    diff_i = np.concatenate(diff_i)[: len(same_i)]
    diff_j = np.concatenate(diff_j)[: len(same_i)]
    return (same_i, same_j), (diff_i, diff_j)


def pair_scores(vectors, pairs):
    i, j = pairs
    return np.einsum("nd,nd->n", vectors[i].astype(np.float32), vectors[j].astype(np.float32))


def separation(same, different) -> dict:
    from sklearn.metrics import roc_auc_score

    labels = np.r_[np.ones(len(same)), np.zeros(len(different))]
    return {"roc_auc": round(float(roc_auc_score(labels, np.r_[same, different])), 4),
            "mean_same_image": round(float(same.mean()), 4),
            "mean_different_image": round(float(different.mean()), 4)}


def synthetic_captions(root, n: int, seed: int = 0) -> list[str]:
    from pipeline.text.vocabulary import tokenize

    captions, _, _, _ = load_flickr8k(root)
    tokens = [tokenize(c) for c in captions]
    words, counts = np.unique(np.concatenate([np.array(t, dtype=object) for t in tokens if t]),
                              return_counts=True)
    lengths = np.array([len(t) for t in tokens if t])
    rng = np.random.default_rng(seed)
    length = rng.choice(lengths, n)
    drawn = words[rng.choice(len(words), int(length.sum()), p=counts / counts.sum())].tolist()
    ends = np.cumsum(length)
    return [" ".join(drawn[e - n_words:e]) for e, n_words in zip(ends.tolist(), length.tolist())]


# ---------------------------------------------------------------------------- jobs (children)


def job_flickr8k(args, method: str) -> dict:
    from pipeline.relevance import compute_relevance_vectors
    from pipeline.relevance.neighbours import top_neighbours

    captions, image, train, test = load_flickr8k(args.data)
    same, different = auc_pairs(image, test)
    out = {"captions": len(captions), "train_captions": len(train), "test_captions": len(test),
           "same_image_pairs": len(same[0]), "different_image_pairs": len(different[0])}
    if method == "bert":  # encode the test captions (or all): index test pairs within them
        encoded = np.arange(len(captions)) if args.bert_captions == "all" else test
        subset = [captions[i] for i in encoded]
        rows = np.searchsorted(encoded, test)
        with PeakMemory() as mem:
            rv, _ = compute_relevance_vectors(subset, np.arange(len(subset)), "bert", device="cpu")
        vectors = rv.vectors[rows]
        out.update(mem.result(), captions_encoded=len(subset),
                   captions_per_s=round(len(subset) / mem.seconds, 1), **rv.identity)
        out.update(separation(pair_scores(vectors, same), pair_scores(vectors, different)))
        out["cbow+bert"] = gated_separation(captions, test, vectors, same, different)
        return out
    with PeakMemory() as mem:
        rv, model = compute_relevance_vectors(captions, train, method)
    out.update(mem.result(), dim=rv.vectors.shape[1], counts=rv.counts)
    if model is not None:
        out["num_terms"] = model.num_terms
    vectors = rv.vectors[test]
    out.update(separation(pair_scores(vectors, same), pair_scores(vectors, different)))
    if method == "svd" and args.neighbours:
        with PeakMemory() as mem:
            top_neighbours(rv.vectors, train, 100, device="cpu")
        out["neighbours_top100"] = {**mem.result(), "queries": len(captions), "pool": len(train),
                                    "queries_per_s": round(len(captions) / mem.seconds, 1)}
    if method == "cbow":  # where a cbow+bert threshold would cut
        out["cosine_percentiles"] = {
            name: {str(p): round(float(np.percentile(pair_scores(vectors, pairs), p)), 3)
                   for p in (10, 50, 90)}
            for name, pairs in (("same_image", same), ("different_image", different))}
    return out


def gated_separation(captions, test, bert, same, different) -> dict:
    """cbow+bert: the BERT pair scores, set to 0 where the CBoW cosine is below a threshold."""
    from pipeline.relevance.stage import DEFAULT_CBOW_THRESHOLD
    from pipeline.text.cbow import cbow_vectors

    coarse, _ = cbow_vectors([captions[i] for i in test])
    result = {}
    for threshold in sorted({DEFAULT_CBOW_THRESHOLD, 0.9, 0.95}):
        scores = []
        for pairs in (same, different):
            fine, gate = pair_scores(bert, pairs), pair_scores(coarse, pairs)
            scores.append(np.where(gate < threshold, 0.0, fine))
        result[str(threshold)] = {**separation(*scores),
                                  "gated_same": round(float((scores[0] == 0).mean()), 4),
                                  "gated_different": round(float((scores[1] == 0).mean()), 4)}
    return result


def job_synthetic(args, method: str, n: int, batch: bool) -> dict:
    import torch

    from pipeline.relevance import BatchRelevance, compute_relevance_vectors

    captions = synthetic_captions(args.data, n)
    out = {}
    if method == "cbow":  # the GloVe table is a fixed cost: measured on its own
        from pipeline.text.glove import load_glove
        with PeakMemory() as mem:
            load_glove()
        out["glove_load"] = mem.result()
    with PeakMemory() as mem:
        rv, model = compute_relevance_vectors(captions, np.arange(n), method)
    out.update(mem.result(), captions=n, dim=rv.vectors.shape[1],
               vectors_mb=round(rv.vectors.nbytes / 2**20, 1))
    if model is not None:
        out["num_terms"] = model.num_terms
    if batch:  # per-op thread wake-ups dominate such small ops on a busy CPU: both shown
        relevance = BatchRelevance(rv.vectors)
        index = torch.randint(0, n, (200, 128), generator=torch.Generator().manual_seed(0))
        threads = torch.get_num_threads()
        out["batch_relevance_B128_ms"] = {}
        for num_threads in sorted({1, threads}):
            torch.set_num_threads(num_threads)
            relevance(index[0])
            t0 = time.perf_counter()
            for row in index:
                relevance(row)
            out["batch_relevance_B128_ms"][f"threads_{num_threads}"] = round(
                (time.perf_counter() - t0) / len(index) * 1e3, 3)
        torch.set_num_threads(threads)
    return out


# ---------------------------------------------------------------------------- parent


def run_child(args, job: dict) -> dict:
    cmd = [sys.executable, __file__, "--data", str(args.data), "--bert-captions", args.bert_captions,
           "--job", json.dumps(job)] + ([] if args.neighbours else ["--no-neighbours"])
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratio(results: dict, key: str, small: int, large: int):
    a, b = results.get(str(small), {}).get(key), results.get(str(large), {}).get(key)
    return round(b / a, 2) if a and b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--sizes", default="56600,566000")
    parser.add_argument("--bert-captions", choices=["test", "all", "none"], default="test")
    parser.add_argument("--no-neighbours", dest="neighbours", action="store_false",
                        help="skip the top-100 neighbour search of every Flickr8k caption")
    parser.add_argument("--job")
    args = parser.parse_args()

    import torch
    torch.set_num_threads(min(torch.get_num_threads(), os.cpu_count() or 1))
    if args.job:  # child: one measurement, one JSON line
        job = json.loads(args.job)
        if job["kind"] == "flickr8k":
            result = job_flickr8k(args, job["method"])
        else:
            result = job_synthetic(args, job["method"], job["n"], job.get("batch", False))
        print(json.dumps(result))
        return

    t0 = time.perf_counter()
    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    report = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
              "flickr8k": {}, "synthetic": {}}
    methods = ["svd", "cbow"] + ([] if args.bert_captions == "none" else ["bert"])
    for method in methods:
        report["flickr8k"][method] = run_child(args, {"kind": "flickr8k", "method": method})
    if "bert" in report["flickr8k"]:
        report["flickr8k"]["cbow+bert"] = report["flickr8k"]["bert"].pop("cbow+bert", None)
    for method in ("svd", "cbow"):
        runs = {str(n): run_child(args, {"kind": "synthetic", "method": method, "n": n,
                                         "batch": method == "svd" and n == sizes[-1]})
                for n in sizes}
        if len(sizes) > 1:
            runs["size_ratio"] = round(sizes[-1] / sizes[0], 2)
            runs["time_ratio"] = ratio(runs, "time_s", sizes[0], sizes[-1])
            runs["memory_ratio"] = ratio(runs, "peak_rss_rise_mb", sizes[0], sizes[-1])
        report["synthetic"][method] = runs
    report["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
