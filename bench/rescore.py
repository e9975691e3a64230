"""Re-scoring cost bench (issue 61): what a correction against hubness adds to a 5K × 25K evaluation.

On synthetic embeddings of COCO 5K's size (``--images`` 5,000 images, 5 captions each, ``--dim``
1,024; no model: the correction's cost does not depend on where the vectors come from), measured
side by side in one process, on the CPU:

- ``evaluation_s``: the evaluation itself (``metrics.evaluate_embeddings``, single protocol: the
  5K × 25K score matrix and both directions' ranks);
- per method (isf, csls, qbnorm, nnn with their authors' defaults; dsl, which has no bank):
  ``fit_s`` (``Rescorer.fit`` of both directions' banks as vectors, ``rescore_bank.VectorBank``: the
  ``--bank-images`` reference images against the 25K captions, their captions against the 5K
  images; csls's and nnn's k-NN an exact FAISS search, isf's and qbnorm's log-sum-exp over the
  bank's score blocks: the bank's scoring included, as a dual network's `vse evaluate --rescore`
  pays it), ``apply_s`` (the corrected matrices, ``Rescorer.apply``) and ``ranks_s`` (their ranks,
  ``metrics.score_ranks``); ``correction_s`` is fit and apply (the bank's k-NN and the correction,
  what issue 61's cost bound is about) and ``correction_over_evaluation`` its ratio to
  ``evaluation_s``; ``row_s`` is a re-scored row's whole cost, the ranks included, and
  ``row_over_evaluation`` its ratio;
- the score-matrix path beside it (a pairwise network's, averaged checkpoints'): ``bank_scores_s``,
  the bank's two score matrices materialised once, and per method ``matrix_fit_s``, the fit over them
  (torch.topk over their blocks); ``matrix_correction_over_evaluation`` is the bank's scores, that fit
  and the same apply over the evaluation.

- the approximate bank indexes beside the exact one, for the methods whose fit is a k-NN (csls,
  nnn; ``--rescore-index``, ``rescore_bank.BANK_INDEXES``): per method and index, ``approximate.KIND``
  with the same ``fit_s``, ``apply_s``, ``correction_s``, ``correction_over_evaluation``,
  ``row_over_evaluation`` and ``rsum``, and against the exact fit ``rsum_diff`` (approximate minus
  exact), ``max_bias_difference`` and ``same_topk_sets`` (the fraction of gallery items, both
  directions, whose k reference queries are the exact k-NN's set); the indexes' parameters are
  recorded (``bank_indexes``).

An exact k-NN reads every reference query × gallery score: both directions' banks hold
``bank_score_products_over_evaluation`` times the evaluated matrix's inner products (2 with a bank
of the evaluated split's size), a floor no exact index goes under.

The scores and the banks are float32, as a model's are, so the corrections run in float32
(rescore.py computes in its input's precision; float64 input stays float64, the golden tests').

The generator: ``CLUSTERS`` Gaussian centres in ``dim`` dimensions; each image is a centre plus noise,
each caption its image plus noise, all unit length, so neighbours exist and popular centres make hubs.
The bank is drawn from the same generator (the training split's role). Each timing is the best of
``--repeats`` runs. Writes bench/results/rescore_cost.json.

    python bench/rescore.py [--images 5000] [--dim 1024] [--bank-images 5000] [--repeats 1] [--threads 2]
                            [--indexes hnsw ivf]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.benchkit import cpu_name, write_report  # noqa: E402
from pipeline.evaluation import rescore_bank  # noqa: E402
from pipeline.evaluation.metrics import evaluate_embeddings, score_ranks  # noqa: E402
from pipeline.evaluation.rescore import RESCORE_NAMES, build_rescorer  # noqa: E402
from pipeline.evaluation.rescore_bank import VectorBank  # noqa: E402

CLUSTERS = 500
LATENT = 32  # the vectors live near a LATENT-d subspace (as a model's do), mapped into --dim
IMAGE_NOISE, CAPTION_NOISE, AMBIENT = 1.0, 1.2, 0.3  # of the unit signal's norm: retrieval neither
# trivial nor chance (R@1 about 10-40 % at 5K)
CAPTIONS_PER_IMAGE = 5


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def generate(images: int, seed: int, centres: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``images`` image vectors and their ``CAPTIONS_PER_IMAGE`` captions each (unit rows of
    ``basis``'s width): latent centre + noise for an image, its latent + noise for a caption, mapped
    by ``basis`` (LATENT × dim, orthonormal rows), plus ambient noise."""
    rng = np.random.default_rng(seed)
    popularity = rng.zipf(1.5, len(centres)).astype(np.float64)  # a few popular centres: hubs
    picked = rng.choice(len(centres), images, p=popularity / popularity.sum())
    latent = unit(centres[picked] + IMAGE_NOISE * rng.standard_normal((images, LATENT)) / np.sqrt(LATENT))
    said = np.repeat(latent, CAPTIONS_PER_IMAGE, axis=0)
    said = unit(said + CAPTION_NOISE * rng.standard_normal(said.shape) / np.sqrt(LATENT))
    dim = basis.shape[1]

    def embedded(x):
        return unit(x @ basis + AMBIENT * rng.standard_normal((len(x), dim)) / np.sqrt(dim))

    return embedded(latent), embedded(said)


def best_of(repeats: int, work):
    """(the smallest wall time of ``repeats`` runs of ``work()``, its last result)."""
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return min(times), result


def rsum_of(ranks) -> float:
    """rsum of both directions' ranks (0-based: R@K counts ranks below K)."""
    return float(sum(100.0 * np.mean(r < k) for r in ranks for k in (1, 5, 10)))


def index_parameters(bank_images: int, bank_captions: int) -> dict:
    """The approximate indexes' parameters as rescore_bank.py sets them (its constants), per direction."""
    return {"hnsw": {"M": rescore_bank.HNSW_M, "efConstruction": rescore_bank.HNSW_EF_CONSTRUCTION,
                     "efSearch": f"max({rescore_bank.HNSW_EF_SEARCH}, k)"},
            "ivf": {"nlist": {"i2t": rescore_bank.ivf_lists(bank_images),
                              "t2i": rescore_bank.ivf_lists(bank_captions)},
                    "nprobe": rescore_bank.IVF_NPROBE,
                    "kmeans_iterations": rescore_bank.IVF_KMEANS_ITERATIONS,
                    "train_per_list": rescore_bank.IVF_TRAIN_PER_LIST}}


def approximate_arm(method, kind, repeats, evaluation_s, scores, cap, img, bank_images, bank_captions,
                    caption_image, exact_fits, exact_rsum) -> dict:
    """``method`` fitted on the banks as vectors searched with the approximate index ``kind``: its
    timings as the exact arm's, and its difference from the exact fit (``exact_fits``, ``exact_rsum``)."""
    vectors = {"i2t": VectorBank(torch.from_numpy(bank_images), cap, kind),
               "t2i": VectorBank(torch.from_numpy(bank_captions), img, kind)}
    fit_s, fits = best_of(repeats, lambda: (method.fit(vectors["i2t"], scores.shape[1]),
                                            method.fit(vectors["t2i"], scores.shape[0])))
    apply_s, both = best_of(repeats, lambda: (method.apply(scores, fits[0]), method.apply(scores.T, fits[1])))
    ranks_s, ranks = best_of(repeats, lambda: score_ranks(*both, caption_image))
    same = []  # outside the timings: the k-NN sets of both indexes, item by item
    for direction in ("i2t", "t2i"):
        exact = rescore_bank.faiss_topk(VectorBank(vectors[direction].queries, vectors[direction].gallery),
                                        method.k)[1].numpy()
        found = rescore_bank.faiss_topk(vectors[direction], method.k)[1].numpy()
        same += [set(a) == set(b) for a, b in zip(exact, found)]
    rsum = rsum_of(ranks)
    correction_s = fit_s + apply_s
    return {"fit_s": round(fit_s, 3), "apply_s": round(apply_s, 3), "correction_s": round(correction_s, 3),
            "correction_over_evaluation": round(correction_s / evaluation_s, 3),
            "row_over_evaluation": round((correction_s + ranks_s) / evaluation_s, 3),
            "rsum": round(rsum, 1), "rsum_diff": round(rsum - exact_rsum, 2),
            "max_bias_difference": float(max((a.bias - b.bias).abs().max()
                                             for a, b in zip(fits, exact_fits))),
            "same_topk_sets": round(float(np.mean(same)), 4)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--bank-images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    approximate = [kind for kind in rescore_bank.BANK_INDEXES if kind != rescore_bank.BANK_INDEX]
    parser.add_argument("--indexes", nargs="*", default=approximate, choices=approximate,
                        help="the approximate bank indexes measured beside the exact one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rescore_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)  # FAISS's own threads, as many as torch's
    rng = np.random.default_rng(0)
    centres = unit(rng.standard_normal((CLUSTERS, LATENT)))
    basis = np.linalg.qr(rng.standard_normal((args.dim, LATENT)))[0].T.astype(np.float32)
    images, captions = generate(args.images, 1, centres, basis)
    bank_images, bank_captions = generate(args.bank_images, 2, centres, basis)
    caption_image = np.repeat(np.arange(args.images), CAPTIONS_PER_IMAGE)

    evaluation_s, raw_metrics = best_of(args.repeats, lambda: evaluate_embeddings(images, captions))
    img, cap = torch.from_numpy(images), torch.from_numpy(captions)
    scores = img @ cap.T

    def bank_scores():
        return {"i2t": torch.from_numpy(bank_images) @ cap.T, "t2i": torch.from_numpy(bank_captions) @ img.T}

    bank_s, banks = best_of(args.repeats, bank_scores)
    vectors = {"i2t": VectorBank(torch.from_numpy(bank_images), cap),
               "t2i": VectorBank(torch.from_numpy(bank_captions), img)}
    methods = {}
    for name in RESCORE_NAMES:
        method = build_rescorer(name)

        def fitted(bank):
            return method.fit(bank["i2t"], scores.shape[1]), method.fit(bank["t2i"], scores.shape[0])

        fit_s, fits = matrix_fit_s, matrix_fits = 0.0, None  # dsl: no bank
        if not method.transductive:
            fit_s, fits = best_of(args.repeats, lambda: fitted(vectors))
            matrix_fit_s, matrix_fits = best_of(args.repeats, lambda: fitted(banks))

        def corrected():
            if method.transductive:
                return method(scores), method(scores.T)
            return method.apply(scores, fits[0]), method.apply(scores.T, fits[1])

        apply_s, both = best_of(args.repeats, corrected)
        ranks_s, ranks = best_of(args.repeats, lambda: score_ranks(*both, caption_image))
        correction_s = fit_s + apply_s
        row_s = correction_s + ranks_s
        matrix_s = (0 if method.transductive else bank_s) + matrix_fit_s + apply_s
        rsum = rsum_of(ranks)
        methods[name] = {"options": dict(vars(method.options)), "transductive": method.transductive,
                         "fit_s": round(fit_s, 3), "apply_s": round(apply_s, 3),
                         "correction_s": round(correction_s, 3),
                         "correction_over_evaluation": round(correction_s / evaluation_s, 3),
                         "ranks_s": round(ranks_s, 3),
                         "row_s": round(row_s, 3), "row_over_evaluation": round(row_s / evaluation_s, 3),
                         "matrix_fit_s": round(matrix_fit_s, 3),
                         "matrix_correction_over_evaluation": round(matrix_s / evaluation_s, 3),
                         "paths_max_bias_difference": None if method.transductive else float(max(
                             (a.bias - b.bias).abs().max() for a, b in zip(fits, matrix_fits))),
                         "rsum": round(rsum, 1)}
        if method.knn:
            methods[name]["approximate"] = {
                kind: approximate_arm(method, kind, args.repeats, evaluation_s, scores, cap, img, bank_images,
                                      bank_captions, caption_image, fits, rsum) for kind in args.indexes}
    report = {
        "bench": "rescore_cost", "issue": 61,
        "data": {"synthetic": True, "images": args.images, "captions": len(captions), "dim": args.dim,
                 "bank_images": args.bank_images, "bank_captions": len(bank_captions),
                 "generator": f"{CLUSTERS} Zipf-popular Gaussian centres, images and captions around them",
                 "precision": str(scores.dtype).removeprefix("torch.")},
        "machine": {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version(), "loadavg": list(os.getloadavg()),
                    "repeats": args.repeats},
        "evaluation_s": round(evaluation_s, 3), "raw_rsum": round(raw_metrics["rsum"], 1),
        "bank_scores_s": round(bank_s, 3), "bank_scores_over_evaluation": round(bank_s / evaluation_s, 3),
        "bank_indexes": index_parameters(len(bank_images), len(bank_captions)),
        "bank_score_products_over_evaluation": round((len(bank_images) * len(captions) + len(bank_captions)
                                                      * len(images)) / (len(images) * len(captions)), 3),
        "methods": methods,
        "notes": ["fit_s: the banks as vectors (rescore_bank.VectorBank), csls's and nnn's k-NN an exact "
                  "FAISS IndexFlatIP search, isf's and qbnorm's log-sum-exp over the bank's score blocks, "
                  "the bank's scoring included; matrix_fit_s: over the materialised bank scores "
                  "(bank_scores_s), torch.topk over their blocks",
                  "bank_score_products_over_evaluation: the inner products an exact k-NN over both banks "
                  "computes, over the evaluated matrix's (by construction, not timed)",
                  "ranks_s is metrics.score_ranks of the corrected matrices, the evaluation's own rank "
                  "step: it bounds row_over_evaluation from below whatever the correction costs",
                  "paths_max_bias_difference: the largest difference of a per-item correction between the "
                  "two paths (float32)",
                  "approximate.KIND: the same fit with --rescore-index KIND (csls, nnn), timed in the same "
                  "run; rsum_diff, max_bias_difference and same_topk_sets against the exact (flat) fit",
                  "a shared machine: loadavg says how busy it was"],
    }
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
