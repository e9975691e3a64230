"""Golden values of the test-time re-scoring methods (pipeline/evaluation/rescore.py) from their
authors' code, for tests/test_rescore.py, all in float64 on a CPU:

- OUT/rescore_muse.npz: MUSE's (facebookresearch/MUSE) ``get_word_translation_accuracy`` with
  ``invsm_beta_B`` (inverted softmax, Smith et al.) and ``csls_knn_K`` (CSLS; its
  ``get_nn_avg_dist`` on the torch path), the score matrix it ranks captured at its
  ``scores.topk(10, 1, True)``. Source words: the bank's rows, then the queries' (MUSE normalises
  over every source word, so the bank the test passes is all of them); target words: the gallery.
- OUT/rescore_qbnorm.npz: ``qb_norm`` of ioanacroi/qb-norm (dynamic inverted softmax) on a bank
  and test matrix of sigmoid scores (a pairwise network's kind) with hub columns, each given a copy
  (theirs writes into its input).
- OUT/rescore_dsl.npz: CAMoE's ``dual_softmax_loss`` (starmemda/CAMoE, DSL.py) on
  ``logit_scale × S``; the revised matrix captured at its ``F.log_softmax``. The authors released
  the loss only: the revision it applies to a batch is the one applied to a test matrix.
- OUT/rescore_nnn.npz: the authors' package nnn-retrieval (``NNNRanker`` over ``NNNRetriever``),
  ``search`` with top_k = the whole gallery, scattered back into the full corrected matrix.

Inputs have structure: a few hub gallery items (near the queries' common direction, or columns
with a raised score), several k and temperatures, so each option matters. Their code is imported
at run time from checkouts outside this repository and never enters it; each npz stores the repo,
its commit (or the package version) and the sha256 of every file of theirs that ran.

Rerun (a CPU is enough; this project's .venv has torch, numpy, scipy, tqdm and faiss-cpu, which
their imports need; nnn-retrieval goes into a throwaway venv, never into .venv):

    git clone https://github.com/facebookresearch/MUSE /tmp/muse
    git -C /tmp/muse checkout 3159355b93f5c3c4883808ba785ba9d18d7f5e81
    git clone https://github.com/ioanacroi/qb-norm /tmp/qbnorm
    git -C /tmp/qbnorm checkout 76d4d90783c1085fe88c52d34acaa3d4d89eea8a
    git clone https://github.com/starmemda/CAMoE /tmp/camoe
    git -C /tmp/camoe checkout 390e5ab47db13cba9e9b37934d42665f47e155cf
    python3 -m venv /tmp/nnnvenv && /tmp/nnnvenv/bin/pip install --no-deps nnn-retrieval==1.0.1
    .venv/bin/python scripts/golden_rescore.py --muse /tmp/muse --qbnorm /tmp/qbnorm \\
        --camoe /tmp/camoe --nnn /tmp/nnnvenv/lib/python3.11/site-packages --out tests/golden
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, write_bundles

DIM = 16
QUERIES, GALLERY, BANK, NNN_BANK, QB_BANK = 20, 30, 60, 300, 8
HUBS = 4
ISF_BETAS = (30.0, 10.0)
CSLS_KS = (1, 3, 10)
QBNORM_CASES = ((20.0, 1), (20.0, 3), (5.0, 2))       # (beta, k)
DSL_CASES = ((1000.0, 100.0), (1.0, 100.0), (0.05, 1.0))  # (temperature, logit_scale)
NNN_CASES = ((256, 0.5), (8, 0.75), (1, 0.5))           # (k, alpha)


@contextlib.contextmanager
def importable(path: Path, *modules: str):
    """``path`` first on sys.path inside the block; the named modules forgotten after it."""
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))
        for name in list(sys.modules):
            if name.split(".")[0] in modules:
                del sys.modules[name]


def provenance(repo: str, version: str, root: Path, files) -> dict:
    meta = {"repo": np.array(repo), "commit": np.array(version), "torch": np.array(torch.__version__)}
    for path in files:
        meta[f"sha256:{path}"] = np.array(hashlib.sha256((root / path).read_bytes()).hexdigest())
    return meta


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def embeddings(rng, queries: int, bank: int) -> dict:
    """Unit vectors: queries and bank leaning on one common direction; HUBS gallery items close to
    it (the hubs), the rest spread."""
    common = unit(rng.normal(size=(1, DIM)))
    lean = lambda n, w: unit(w * common + rng.normal(size=(n, DIM)) / np.sqrt(DIM))  # noqa: E731
    gallery = np.concatenate([lean(HUBS, 2.0), unit(rng.normal(size=(GALLERY - HUBS, DIM)))])
    return {"queries": lean(queries, 0.6), "gallery": gallery[rng.permutation(GALLERY)],
            "bank": lean(bank, 0.6)}


def hub_scores(rng, rows: int) -> np.ndarray:
    """Sigmoid scores (a pairwise network's range, (0, 1)) with HUBS raised columns."""
    raised = np.zeros(GALLERY)
    raised[rng.choice(GALLERY, HUBS, replace=False)] = rng.uniform(1.0, 2.0, HUBS)
    return 1.0 / (1.0 + np.exp(-(rng.normal(size=(rows, GALLERY)) * 1.5 + raised)))


# ---------------------------------------------------------------------------- MUSE

def muse_case(checkout: Path) -> tuple[dict, dict]:
    rng = np.random.default_rng(61)
    emb = embeddings(rng, QUERIES, BANK)
    source = np.concatenate([emb["bank"], emb["queries"]])
    out = {"queries": emb["queries"], "gallery": emb["gallery"], "bank": emb["bank"]}
    with importable(checkout, "src"):
        utils = importlib.import_module("src.utils")
        translation = importlib.import_module("src.evaluation.word_translation")
        utils.FAISS_AVAILABLE = False  # their torch path: float64, no faiss float32
        with tempfile.TemporaryDirectory() as folder:
            dico = Path(folder) / "dico.txt"
            dico.write_text("".join(f"s{BANK + i} t{i % GALLERY}\n" for i in range(QUERIES)))
            word2id1 = {f"s{i}": i for i in range(len(source))}
            word2id2 = {f"t{j}": j for j in range(GALLERY)}
            methods = [f"invsm_beta_{beta:g}" for beta in ISF_BETAS] + [f"csls_knn_{k}" for k in CSLS_KS]
            for method in methods:
                out[method] = ranked_scores(lambda m=method: translation.get_word_translation_accuracy(
                    "s", word2id1, torch.from_numpy(source), "t", word2id2,
                    torch.from_numpy(emb["gallery"]), m, str(dico)))
    meta = provenance("facebookresearch/MUSE", commit_of(checkout), checkout,
                      ("src/utils.py", "src/evaluation/word_translation.py"))
    return out, meta


def ranked_scores(run) -> np.ndarray:
    """The matrix their evaluation ranks: the tensor of its first ``topk(10, 1, True)``."""
    seen, topk = [], torch.Tensor.topk

    def recorded(self, *args, **kwargs):
        if args == (10, 1, True) and not kwargs and not seen:
            seen.append(self.detach().clone().numpy())
        return topk(self, *args, **kwargs)

    torch.Tensor.topk = recorded
    try:
        run()
    finally:
        torch.Tensor.topk = topk
    assert len(seen) == 1, "their evaluation no longer ranks with scores.topk(10, 1, True)"
    assert seen[0].dtype == np.float64 and seen[0].shape == (QUERIES, GALLERY)
    return seen[0]


# ---------------------------------------------------------------------------- QB-Norm

def qbnorm_case(checkout: Path) -> tuple[dict, dict]:
    rng = np.random.default_rng(62)
    scores, bank = hub_scores(rng, QUERIES), hub_scores(rng, QB_BANK)
    out = {"scores": scores, "bank": bank}
    with importable(checkout, "dynamic_inverted_softmax", "metric"):
        theirs = importlib.import_module("dynamic_inverted_softmax")
        for beta, k in QBNORM_CASES:
            result = theirs.qb_norm(bank.copy(), scores.copy(), {"k": k, "beta": beta})
            active = ~(result == scores).all(axis=1)
            assert 0 < active.sum() < QUERIES, f"beta {beta}, k {k}: every or no query normalised"
            out[f"beta{beta:g}_k{k}"] = result
            out[f"beta{beta:g}_k{k}:normalised"] = active
    meta = provenance("ioanacroi/qb-norm", commit_of(checkout), checkout, ("dynamic_inverted_softmax.py",))
    return out, meta


# ---------------------------------------------------------------------------- CAMoE's DSL

def dsl_case(checkout: Path) -> tuple[dict, dict]:
    rng = np.random.default_rng(63)
    scores = hub_scores(rng, QUERIES)
    out = {"scores": scores}
    with importable(checkout, "DSL"):
        theirs = importlib.import_module("DSL")
        for temperature, scale in DSL_CASES:
            seen, log_softmax = [], theirs.F.log_softmax

            def recorded(x, *args, _seen=seen, _f=log_softmax, **kwargs):
                _seen.append(x.detach().clone().numpy())
                return _f(x, *args, **kwargs)

            theirs.F.log_softmax = recorded
            try:
                theirs.dual_softmax_loss()(torch.from_numpy(scale * scores), temp=temperature)
            finally:
                theirs.F.log_softmax = log_softmax
            assert len(seen) == 1 and seen[0].dtype == np.float64
            out[f"temp{temperature:g}_scale{scale:g}"] = seen[0]
    meta = provenance("starmemda/CAMoE", commit_of(checkout), checkout, ("DSL.py",))
    return out, meta


# ---------------------------------------------------------------------------- NNN

def nnn_case(site: Path) -> tuple[dict, dict]:
    rng = np.random.default_rng(64)
    emb = embeddings(rng, QUERIES, NNN_BANK)
    out = dict(emb)
    with importable(site, "nnn"):
        nnn = importlib.import_module("nnn")
        for k, alpha in NNN_CASES:
            retriever = nnn.NNNRetriever(DIM)
            ranker = nnn.NNNRanker(retriever, emb["gallery"], emb["bank"], alternate_ks=k, batch_size=7,
                                   alternate_weight=alpha)
            values, indices = ranker.search(emb["queries"], GALLERY)
            full = np.full((QUERIES, GALLERY), np.nan)
            np.put_along_axis(full, indices, values, axis=1)
            assert values.dtype == np.float64 and np.isfinite(full).all()
            out[f"k{k}_alpha{alpha:g}"] = full
        files = sorted(str(p.relative_to(site)) for p in (site / "nnn").glob("*.py"))
        version = package_version(site)
    meta = provenance("PyPI nnn-retrieval", version, site, files)
    return out, meta


def package_version(site: Path) -> str:
    found = sorted(site.glob("nnn_retrieval-*.dist-info"))
    assert found, f"{site}: no nnn_retrieval-*.dist-info (pip install --no-deps nnn-retrieval there)"
    return found[-1].name.removeprefix("nnn_retrieval-").removesuffix(".dist-info")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--muse", type=Path, required=True, help="a facebookresearch/MUSE checkout")
    parser.add_argument("--qbnorm", type=Path, required=True, help="an ioanacroi/qb-norm checkout")
    parser.add_argument("--camoe", type=Path, required=True, help="a starmemda/CAMoE checkout")
    parser.add_argument("--nnn", type=Path, required=True,
                        help="the site-packages folder holding the package nnn-retrieval (its nnn/)")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name, (case, where) in {"muse": (muse_case, args.muse), "qbnorm": (qbnorm_case, args.qbnorm),
                                "dsl": (dsl_case, args.camoe), "nnn": (nnn_case, args.nnn)}.items():
        values, meta = case(where)
        write_bundles(args.out, "rescore", {name: values}, meta)


if __name__ == "__main__":
    main()
