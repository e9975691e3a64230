"""`vse evaluate`'s modes, one function each, called by the CLI (cli/evaluate_cmd.py) once it has
checked which options go together:

- ``evaluate_embeddings_file``: saved embeddings (``--embeddings FILE.npz``);
- ``evaluate_checkpoint``: a checkpoint on a feature cache, or an RC run's checkpoint on a
  dataset's images (``--root``), optionally averaged with other checkpoints' scores, with CS@K
  (``--relevance``) and human judgments (``--judgments``); its notes say when the split is small
  or the result within the noise of chance (``chance``);
- ``evaluate_shortlist``: a pairwise checkpoint re-ranking a dual checkpoint's top k.

Each returns an ``Evaluation`` (its metrics and the title of its table; ``render`` gives the text
or JSON the command prints) and says its notes through ``echo`` (standard error in the CLI).
The fourth mode, many run folders (``--runs``), reads training's run folders, which this package
may not import: it is ``pipeline.reports.runs_command``'s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from pipeline.core.errors import VseError
from pipeline.data.cache import FeatureCache
from pipeline.evaluation.chance import evaluation_notes
from pipeline.evaluation.evaluate import (
    cs_note,
    embed_checkpoint,
    evaluate_npz,
    evaluate_split_embeddings,
    format_table,
    json_metrics,
    relevance_for_cache,
)
from pipeline.evaluation.inference import embed_member
from pipeline.evaluation.metrics import hubness_metrics
from pipeline.evaluation.rescore import Rescorer, split_scores
from pipeline.evaluation.rescore_bank import BANK_INDEX, VectorBank, reference_bank

Echo = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class Evaluation:
    """One evaluation: its metrics, the title of its table, and what else it prints."""

    metrics: dict
    title: str
    json_extra: dict = field(default_factory=dict)  # items after the metrics in --json
    footer: str | None = None                        # a line after the table
    notes: list[str] = field(default_factory=list)   # said after the table (standard error): ``chance``

    def as_dict(self) -> dict:
        """What --json prints (and ``pipeline.evaluate`` returns): the metrics, then the rest."""
        return {**json_metrics(self.metrics), **self.json_extra}

    def render(self, as_json: bool = False) -> str:
        """The table (with the human-judgment lines, when there are some), or one JSON object."""
        if as_json:
            return json.dumps(self.as_dict())
        from pipeline.evaluation.judgments import format_human

        return "\n".join(filter(None, [format_table(self.metrics, self.title), format_human(self.metrics),
                                       self.footer]))


def evaluate_embeddings_file(path, protocol: str, device, similarity: str = "cosine", judgments=None,
                             echo: Echo = _quiet) -> Evaluation:
    """Saved embeddings (an npz of images and captions) under ``protocol``; with ``judgments``
    (``JudgmentOptions``), agreement with people too; the hubness of each direction (single and 5k
    protocols), as for a checkpoint. How many networks made them is not known: no ``ensemble``."""
    metrics = evaluate_npz(path, protocol, device, similarity)
    if protocol != "5fold":
        import torch

        from pipeline.core.similarity import image_caption_scores
        from pipeline.evaluation.evaluate import load_embeddings_npz

        images, captions, _ = load_embeddings_npz(path)
        metrics.update(hubness_metrics(image_caption_scores(torch.from_numpy(images),
                                                            torch.from_numpy(captions), similarity)))
    if judgments:
        from pipeline.evaluation.evaluate import judge_npz

        metrics.update(_report_matched(*judge_npz(path, judgments.load(), similarity, device), echo))
    return Evaluation(metrics, f"{path} ({protocol})")


def evaluate_checkpoint(checkpoint, device, *, features=None, root=None, dataset_kind: str = "flickr8k",
                        dataset_options=None, split: str = "test", protocol: str = "single",
                        amp: bool = False, text_features=None, average_with=(), relevance=None, cs_ks=(),
                        judgments=None, rescore=None, member: int | None = None,
                        echo: Echo = _quiet) -> Evaluation:
    """A checkpoint's split embeddings on the feature cache ``features`` (or, for an RC run, on
    the images of the dataset at ``root``), its scores averaged with ``average_with``'s; CS@K
    when a ``relevance`` file is given, human-judgment metrics with ``judgments``; the hubness of
    each direction (single and 5k protocols). ``rescore`` (``rescore.RescorePlan``): each correction's
    metrics too, with its paired test against the raw scores (``rescored_evaluation``). ``member``: a
    co-trained checkpoint's network of that index alone (``inference.embed_member``). The result
    records how many networks' scores it averages (``ensemble``: docs/PROTOCOL.md, "Ensemble size")."""
    if root:
        from pipeline.evaluation.inference import embed_rc_checkpoint

        emb = embed_rc_checkpoint(checkpoint, dataset_kind, root, split, device, amp=amp,
                                  dataset_options=dataset_options)
    else:
        with FeatureCache(features) as cache:  # a relevance file of other captions: refused first
            relevance = relevance_for_cache(relevance, cache) if relevance else None
            bank_images = rescore.check_bank(len(cache.split_rows(rescore.bank_split)[0])) if rescore else 0
            own = (embed_checkpoint if member is None else partial(embed_member, member=member))
            members = [own(checkpoint, cache, split, device, amp=amp, text_features=text_features)]
            emb = members[0]
            if average_with:
                from pipeline.evaluation.evaluate import average_scores

                members += [embed_checkpoint(other, cache, split, device, amp=amp) for other in average_with]
                emb = average_scores(members, [checkpoint, *average_with])
            banks = None
            if rescore and rescore.uses_bank:  # each model's own bank scores, averaged as its test scores
                paths = [checkpoint, *average_with]
                banks = _mean_banks([checkpoint_banks(path, cache, member, rescore, device, amp=amp,
                                                      text_features=text_features if i == 0 else None)
                                     for i, (path, member) in enumerate(zip(paths, members))])
    metrics = evaluate_split_embeddings(emb, protocol, device, relevance, cs_ks if relevance else ())
    if protocol != "5fold":
        metrics.update(hubness_metrics(split_scores(emb)))
    note = cs_note(cs_ks, len(emb.images), split) if relevance else None
    if note:
        echo(note)
    ensemble = emb.ensemble  # read from the checkpoints as they were embedded (a member: one network)
    named = " + ".join([checkpoint, *average_with]) + (" (scores averaged)" if average_with else "")
    title = (f"{named}{ensemble_title(ensemble, member)} on {root or features} "
             f"[{split}, {len(emb.images)} images, {protocol}]")
    matched = None
    if judgments:
        judged, matched = _judge_split(emb, judgments, features, root, dataset_kind, device, dataset_options,
                                       echo)
        metrics.update(judged)
    notes = evaluation_notes(metrics["rsum"], len(emb.images), len(emb.captions), split, protocol)
    footer, extra = None, {}
    if rescore:
        footer, extra = rescored_evaluation(emb, rescore, banks, bank_images, metrics, matched, device)
    recorded = {"ensemble": ensemble, **({"member": member} if member is not None else {})}
    return Evaluation(metrics, title, json_extra={**recorded, **extra}, footer=footer, notes=notes)


def ensemble_title(ensemble: int, member: int | None = None) -> str:
    """What a table's title says of its ensemble: '' for one network."""
    if member is not None:
        return f" (network {member} alone)"
    return f" ({ensemble} networks' scores averaged)" if ensemble > 1 else ""


def rescored_evaluation(emb, plan, banks, bank_images: int, raw: dict, matched=None,
                        device=None) -> tuple[str, dict]:
    """Each correction of ``plan`` on the split's scores: its table (the raw row's name ``+ METHOD``),
    hubness, its human-judgment metrics when the raw row has them (``matched``: the judged pairs the
    raw row was judged on) and its paired permutation test against the raw scores over the test
    queries (rsum's difference and two-sided p); and the same in JSON (``rescore``: one entry per
    method with what it saw, ``Rescorer.record`` and the bank)."""
    from pipeline.evaluation.judgments.metrics import format_human
    from pipeline.evaluation.metrics import score_ranks
    from pipeline.evaluation.stats import DEFAULT_PERMUTATIONS, paired_permutation_test

    scores = split_scores(emb)
    raw_ranks = score_ranks(scores, scores.T, emb.caption_image)
    lines, entries = [hubness_line(raw)], []
    for method in plan.methods:
        metrics, ranks = rescored_metrics(scores, emb.caption_image, method, banks, matched, device)
        test = paired_permutation_test(ranks, raw_ranks)["rsum"]
        label = plan.label(method, bank_images)
        human = format_human(metrics)
        lines += ["", format_table(metrics, f"+ {label}"), *([human] if human else []), hubness_line(metrics),
                  f"against the raw scores: rsum {test['diff']:+.1f}, p = {test['p']:.4f} (paired "
                  f"permutation test over the test queries, {DEFAULT_PERMUTATIONS} sign flips, two-sided)"]
        entries.append({"row": plan.row_name(method), **plan.record(method, bank_images),
                        "metrics": json_metrics(metrics),
                        "against_raw": {"rsum_diff": test["diff"], "p": test["p"]}})
    return "\n".join(lines), {"rescore": entries}


def rescored_metrics(scores, caption_image, method: Rescorer, banks=None, matched=None,
                     device=None) -> tuple[dict, tuple]:
    """The retrieval metrics and hubness of ``scores`` (N images × M captions) re-scored by ``method``
    in each direction on its own (image→text: ``scores``, text→image: its transpose), and the ranks
    ``(i2t, t2i)`` (for the paired test against the raw scores). ``banks(direction)``: the reference
    bank of an inductive method, ``"i2t"`` reference images × M, ``"t2i"`` reference captions × N.
    ``matched`` (``judgments.MatchedJudgments`` of the split): the human-judgment metrics too, of the
    two corrected matrices (``human_metrics_of_scores``, as the raw row's of the raw ones; on ``device``)."""
    from pipeline.evaluation.judgments.metrics import human_metrics_of_scores
    from pipeline.evaluation.metrics import retrieval_metrics, score_ranks

    scores = torch.as_tensor(scores)
    if method.transductive:
        i2t, t2i = method(scores), method(scores.T)
    else:
        i2t = method.apply(scores, method.fit(banks("i2t"), scores.shape[1]))
        t2i = method.apply(scores.T, method.fit(banks("t2i"), scores.shape[0]))
    ranks = score_ranks(i2t, t2i, caption_image)
    metrics = {**retrieval_metrics(*ranks), **hubness_metrics(i2t, t2i)}
    if matched is not None:
        metrics.update(human_metrics_of_scores(i2t, t2i, caption_image, matched, device=device))
    return metrics, ranks


def hubness_line(metrics: dict) -> str:
    """The hubness of both directions, as a line under a table (the skewness of N_10)."""
    from pipeline.evaluation.metrics import metric_of

    cells = [f"{direction} {metric_of(f'{key}_hubness').format(metrics.get(f'{key}_hubness'), 'n/a')}"
             for key, direction in (("i2t", "image→text"), ("t2i", "text→image"))]
    return "hubness (skewness of N_10): " + ", ".join(cells)


def checkpoint_banks(checkpoint, cache, member, plan, device, *, amp: bool = False, text_features=None,
                     loaded=None, captions=None) -> dict:
    """One model's reference banks (``plan``: the first ``bank_size`` images of ``bank_split`` and their
    captions): ``i2t``, those images × the evaluated captions; ``t2i``, those captions × the evaluated
    images. ``member``: the model's own split embeddings (a dual network's test embeddings are reused,
    its bank ``rescore_bank.reference_bank``'s: vectors for an inner product, searched with ``plan.index``;
    a pairwise network scores the pairs, a score matrix: an approximate index refused);
    ``loaded``/``captions``: the model and its caption side when the caller has them."""
    from pipeline.evaluation.inference import encode_split, load_model
    from pipeline.networks.network import network_kind

    loaded = loaded or load_model(checkpoint, device)
    captions = captions or loaded.captions(cache, text_features, checkpoint)
    if network_kind(loaded.model) == "pairwise":
        if plan.index != BANK_INDEX:
            raise VseError(f"--rescore-index {plan.index}: {checkpoint} is a pairwise network, its bank is "
                           "a score matrix with no vector index (use the default, exact)")
        image_rows, caption_rows, _ = cache.split_rows(plan.bank_split, plan.bank_size)
        model = loaded.model
        return {"i2t": pair_scores(model, cache, captions, image_rows, member.caption_rows, device, amp),
                "t2i": pair_scores(model, cache, captions, member.image_rows, caption_rows, device, amp).T}
    bank = encode_split(loaded.model, cache, captions, plan.bank_split, device, max_images=plan.bank_size,
                        amp=amp)
    images, texts = torch.from_numpy(bank.images), torch.from_numpy(bank.captions)
    gallery = {"i2t": torch.from_numpy(member.captions), "t2i": torch.from_numpy(member.images)}
    return {"i2t": reference_bank(images, gallery["i2t"], bank.similarity, "i2t", plan.index),
            "t2i": reference_bank(texts, gallery["t2i"], bank.similarity, "t2i", plan.index)}


def _mean_banks(banks: list[dict]) -> Callable:
    """``rescored_metrics``' ``banks``: the mean of several models' banks (one model: its own, vectors
    or scores as ``checkpoint_banks`` gave it); averaged, their score matrices in float64 (a vector
    bank's formed whole: the mean of inner products of several spaces has no vectors; an approximate
    index refused)."""
    if len(banks) == 1:
        return banks[0].__getitem__

    def scores(bank):
        if isinstance(bank, VectorBank):
            if bank.index != BANK_INDEX:
                raise VseError(f"--rescore-index {bank.index}: averaged checkpoints' bank is the mean of "
                               "their score matrices, with no vector index (use the default, exact)")
            return bank.scores().double()
        return bank.double()

    mean = {key: sum(scores(bank[key]) for bank in banks) / len(banks) for key in ("i2t", "t2i")}
    return mean.__getitem__


def pair_scores(model, cache, captions, image_rows, caption_rows, device, amp: bool = False):
    """A pairwise network's scores of the cache's ``image_rows`` × ``caption_rows`` (any rows, of any
    split), in the blocks ``inference.score_split`` uses; float32 on the CPU."""
    from pipeline.core.runtime import precision
    from pipeline.evaluation.inference import CAPTION_BLOCK, IMAGE_BLOCK, read_image_features
    from pipeline.networks.network import at_least_float32

    out = torch.empty(len(image_rows), len(caption_rows), dtype=torch.float32)
    with torch.no_grad():
        blocks = []
        for a in range(0, len(image_rows), IMAGE_BLOCK):
            feats = read_image_features(cache, image_rows[a:a + IMAGE_BLOCK], "bank")
            with precision(device, amp):
                blocks.append(model.encode_images(at_least_float32(torch.from_numpy(feats).to(device))))
        for b in range(0, len(caption_rows), CAPTION_BLOCK):
            text = captions.batch(caption_rows[b:b + CAPTION_BLOCK])
            with precision(device, amp):
                encoded = model.encode_captions(text[0].to(device), *text[1:])
                for a, block in zip(range(0, len(image_rows), IMAGE_BLOCK), blocks):
                    part = model.score(block, encoded).float().cpu()
                    out[a:a + len(part), b:b + part.shape[1]] = part
    return out


def evaluate_shortlist(checkpoint, features, shortlist, device, *, shortlist_features=None, k: int = 100,
                       split: str = "test", protocol: str = "single", amp: bool = False, text_features=None,
                       echo: Echo = _quiet) -> Evaluation:
    """A pairwise checkpoint re-ranking a dual checkpoint's (``shortlist``) top ``k`` of each
    query (pipeline.evaluation.shortlist); ``shortlist_features``: the dual checkpoint's cache
    (default ``features``)."""
    from pipeline.evaluation.inference import check_features_match, load_model
    from pipeline.evaluation.shortlist import check_kinds, rerank_split
    from pipeline.networks.network import network_kind

    loaded = load_model(checkpoint, device)  # each checkpoint's kind before the split is embedded
    check_kinds(loaded.model, network_kind(load_model(shortlist, device).model) == "pairwise", checkpoint,
                shortlist)
    dual = embed_checkpoint(shortlist, shortlist_features or features, split, device, amp=amp)
    started = time.perf_counter()
    with FeatureCache(features) as cache:
        check_features_match(cache, loaded.model, loaded.state.get("feature_source", {}), checkpoint)
        captions = loaded.captions(cache, text_features, checkpoint)
        reranked = rerank_split(loaded.model, cache, captions, split, device, dual, k, amp=amp,
                                model_path=checkpoint, dual_path=shortlist)
    seconds = time.perf_counter() - started
    scored = (f"scored {reranked.pairs_scored:,} of {reranked.pairs:,} pairs "
              f"({100 * reranked.pairs_scored / reranked.pairs:.1f}%) in {seconds:.1f} s")
    return Evaluation(reranked.metrics(),
                      f"{checkpoint} re-ranking the top {k} of {shortlist} on {features} "
                      f"[{split}, {len(reranked.i2t)} images, {protocol}]",
                      json_extra={"shortlist_k": k, "seconds": round(seconds, 2),
                                  "pairs_scored": reranked.pairs_scored, "pairs": reranked.pairs},
                      footer=scored)


def _judge_split(emb, judgments, features, root, dataset_kind, device, dataset_options,
                 echo: Echo) -> tuple[dict, object]:
    """Human-judgment metrics of a checkpoint's split embeddings, and the judged pairs matched to the
    split (``MatchedJudgments``: a re-scored row is judged on them too); caption keys are rebuilt from
    the cache (or dataset) order and checked against Flickr8k.token.txt when it is at hand."""
    from pipeline.evaluation.evaluate import judge_split
    from pipeline.evaluation.judgments import token_file_near

    loaded = judgments.load()
    if root:
        from pipeline.data.readers import load_dataset

        index = load_dataset(dataset_kind, root, **(dataset_options or {})).select()[1]
        judged = judge_split(emb, index, loaded, device, token_file_near(root))
    else:
        with FeatureCache(features) as cache:
            judged = judge_split(emb, cache, loaded, device, token_file_near(cache.attrs.get("dataset_root")))
    return _report_matched(*judged, echo), judged[1]


def _report_matched(metrics: dict, matched, echo: Echo) -> dict:
    echo(f"judgments: {matched.summary()}")
    return metrics
