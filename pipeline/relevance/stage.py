"""The relevance stage: feature cache captions → per-caption vectors → relevance file."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.core.formats import RELEVANCE, SVD_MODEL
from pipeline.core.fsutil import atomic_path, flush_to_disk, output_format
from pipeline.core.registry import RELEVANCE_METHODS
from pipeline.relevance.neighbours import top_neighbours
from pipeline.relevance.store import DTYPES, write_relevance
from pipeline.relevance.svd import DEFAULT_SVD_ITERATIONS, MODEL_FORMAT, SvdModel, model_path_for
from pipeline.text.encoders import encode_captions, encoder_identity
from pipeline.text.vectors import RelevanceVectors

METHODS = RELEVANCE_METHODS
DEFAULT_CBOW_THRESHOLD = 0.8  # the ladder code's EcoSTSMatrix(coocthreshold=0.8)


def compute_relevance_vectors(captions, fit_indices, method: str, *, k: int = 400, seed: int = 0,
                              svd_iterations: int = DEFAULT_SVD_ITERATIONS, device="auto",
                              batch_size: int = 256, cbow_threshold: float = DEFAULT_CBOW_THRESHOLD,
                              progress: bool = False) -> tuple[RelevanceVectors, SvdModel | None]:
    """Vectors of every caption; ``fit_indices`` (the training captions) are all that
    ``svd`` is fitted on. Returns the vectors and, for ``svd``, the fitted model."""
    captions = list(captions)
    fit_indices = np.asarray(fit_indices, dtype=np.int64)
    if method not in METHODS:
        raise VseError(f"unknown relevance method {method!r} (expected {', '.join(METHODS)})")
    if batch_size < 1:
        raise VseError(f"--batch-size must be at least 1, not {batch_size}")
    if method == "svd":
        model = SvdModel(k, seed, svd_iterations).fit([captions[i] for i in fit_indices])
        vectors = model.transform(captions)
        empty = int(np.count_nonzero(~vectors.any(axis=1)))
        return RelevanceVectors(method, vectors, model.params(), model.identity(),
                                counts={"captions_without_terms": empty}), model
    if method == "cbow":
        cbow = encode_captions(captions, "cbow")
        return RelevanceVectors(method, cbow.vectors, {}, encoder_identity("cbow"), counts=cbow.counts), None
    if method == "cbow+bert" and not -1.0 <= cbow_threshold <= 1.0:
        raise VseError(f"--cbow-threshold is a cosine, between -1 and 1, not {cbow_threshold}")
    bert = encode_captions(captions, "minilm", device, batch_size, progress).vectors
    params = {"batch_size": batch_size}
    if method == "bert":
        return RelevanceVectors(method, bert, params, encoder_identity("minilm")), None
    coarse = encode_captions(captions, "cbow")
    return RelevanceVectors(method, bert, {**params, "cbow_threshold": cbow_threshold},
                            {"fine": encoder_identity("minilm"), "coarse": encoder_identity("cbow")},
                            coarse_vectors=coarse.vectors, cbow_threshold=cbow_threshold,
                            counts=coarse.counts), None


@dataclass
class RelevanceSummary:
    out: Path
    method: str
    num_captions: int
    num_fit_captions: int
    dim: int
    params: dict
    counts: dict
    svd_model: Path | None
    neighbours: int


def build_relevance(features, method: str, out, *, k: int = 400, neighbours: int = 0,
                    batch_size: int = 256, device="auto", dtype: str = "float32",
                    cbow_threshold: float = DEFAULT_CBOW_THRESHOLD, fit_splits=("train",),
                    seed: int = 0, svd_iterations: int = DEFAULT_SVD_ITERATIONS,
                    progress: bool = False, overwrite: bool = False) -> RelevanceSummary:
    """Run the stage on a feature cache: vectors for all its captions, fitted on
    ``fit_splits``; optional top-``neighbours`` lists among the fitting captions."""
    from pipeline.data.cache import FeatureCache

    features, out = Path(features), Path(out)
    if method not in METHODS:
        raise VseError(f"unknown relevance method {method!r} (expected {', '.join(METHODS)})")
    if dtype not in DTYPES:
        raise VseError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if neighbours < 0:
        raise VseError(f"--neighbours must be 0 (none) or more, not {neighbours}")
    if out.resolve() == features.resolve():
        raise VseError("--out would overwrite the feature cache", out)
    RELEVANCE.guard(out, overwrite)
    if method == "svd":
        SVD_MODEL.guard(model_path_for(out), overwrite)
    with FeatureCache(features) as cache:
        captions, fingerprint = cache.captions, cache.caption_fingerprint
        if not captions:
            raise VseError("feature cache has no captions", features)
        fit_indices = np.concatenate([cache.split_captions(s) for s in fit_splits])
    if len(fit_indices) == 0:
        raise VseError(f"split(s) {', '.join(fit_splits)} have no captions to fit on", features)
    if neighbours > len(fit_indices) - 1:
        raise VseError(f"--neighbours must be at most {len(fit_indices) - 1} (the training "
                       f"captions minus the caption itself), not {neighbours}")

    rv, model = compute_relevance_vectors(captions, fit_indices, method, k=k, seed=seed,
                                          svd_iterations=svd_iterations, device=device,
                                          batch_size=batch_size, cbow_threshold=cbow_threshold,
                                          progress=progress)
    lists = None
    if neighbours:
        lists = top_neighbours(rv.vectors, fit_indices, neighbours, coarse_vectors=rv.coarse_vectors,
                               threshold=rv.cbow_threshold, device=device)
    model_path = None if model is None else model_path_for(out)
    written = False
    try:
        with contextlib.ExitStack() as stack:
            # The SVD model waits, complete and on disk, in a temporary file until the relevance
            # file is in place: a failed write (full disk) leaves an older pair at OUT as it was.
            if model is not None:
                model_tmp = stack.enter_context(atomic_path(model_path))
                model.dump(model_tmp)
                flush_to_disk(model_tmp)
            write_relevance(out, rv, features_file=features, caption_fingerprint=fingerprint,
                            fit_splits=fit_splits, num_fit_captions=len(fit_indices), dtype=dtype,
                            neighbours=lists, svd_model=None if model_path is None else model_path.name)
            written = True
    except BaseException:
        if written:  # the model could not be renamed into place: neither file, never a mixed pair
            out.unlink(missing_ok=True)
            model_path.unlink(missing_ok=True)
        raise
    stale_model = model_path_for(out)
    if model is None and output_format(stale_model) == MODEL_FORMAT:  # the replaced file's model
        stale_model.unlink(missing_ok=True)
    return RelevanceSummary(out, method, rv.num_captions, len(fit_indices), rv.vectors.shape[1],
                            rv.params, rv.counts, model_path, neighbours)
