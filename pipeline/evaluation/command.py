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

    def render(self, as_json: bool = False) -> str:
        """The table (with the human-judgment lines, when there are some), or one JSON object."""
        if as_json:
            return json.dumps({**json_metrics(self.metrics), **self.json_extra})
        from pipeline.evaluation.judgments import format_human

        return "\n".join(filter(None, [format_table(self.metrics, self.title), format_human(self.metrics),
                                       self.footer]))


def evaluate_embeddings_file(path, protocol: str, device, similarity: str = "cosine", judgments=None,
                             echo: Echo = _quiet) -> Evaluation:
    """Saved embeddings (an npz of images and captions) under ``protocol``; with ``judgments``
    (``JudgmentOptions``), agreement with people too."""
    metrics = evaluate_npz(path, protocol, device, similarity)
    if judgments:
        from pipeline.evaluation.evaluate import judge_npz

        metrics.update(_report_matched(*judge_npz(path, judgments.load(), similarity, device), echo))
    return Evaluation(metrics, f"{path} ({protocol})")


def evaluate_checkpoint(checkpoint, device, *, features=None, root=None, dataset_kind: str = "flickr8k",
                        dataset_options=None, split: str = "test", protocol: str = "single",
                        amp: bool = False, text_features=None, average_with=(), relevance=None, cs_ks=(),
                        judgments=None, echo: Echo = _quiet) -> Evaluation:
    """A checkpoint's split embeddings on the feature cache ``features`` (or, for an RC run, on
    the images of the dataset at ``root``), its scores averaged with ``average_with``'s; CS@K
    when a ``relevance`` file is given, human-judgment metrics with ``judgments``."""
    if root:
        from pipeline.evaluation.inference import embed_rc_checkpoint

        emb = embed_rc_checkpoint(checkpoint, dataset_kind, root, split, device, amp=amp,
                                  dataset_options=dataset_options)
    else:
        with FeatureCache(features) as cache:  # a relevance file of other captions: refused first
            relevance = relevance_for_cache(relevance, cache) if relevance else None
            emb = embed_checkpoint(checkpoint, cache, split, device, amp=amp, text_features=text_features)
            if average_with:
                from pipeline.evaluation.evaluate import average_scores

                emb = average_scores([emb] + [embed_checkpoint(other, cache, split, device, amp=amp)
                                              for other in average_with], [checkpoint, *average_with])
    metrics = evaluate_split_embeddings(emb, protocol, device, relevance, cs_ks if relevance else ())
    note = cs_note(cs_ks, len(emb.images), split) if relevance else None
    if note:
        echo(note)
    named = " + ".join([checkpoint, *average_with]) + (" (scores averaged)" if average_with else "")
    title = f"{named} on {root or features} [{split}, {len(emb.images)} images, {protocol}]"
    if judgments:
        metrics.update(_judge_split(emb, judgments, features, root, dataset_kind, device, dataset_options,
                                    echo))
    notes = evaluation_notes(metrics["rsum"], len(emb.images), len(emb.captions), split, protocol)
    return Evaluation(metrics, title, notes=notes)


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


def _judge_split(emb, judgments, features, root, dataset_kind, device, dataset_options, echo: Echo) -> dict:
    """Human-judgment metrics of a checkpoint's split embeddings; caption keys are rebuilt from
    the cache (or dataset) order and checked against Flickr8k.token.txt when it is at hand."""
    from pipeline.evaluation.evaluate import judge_split
    from pipeline.evaluation.judgments import token_file_near

    loaded = judgments.load()
    if root:
        from pipeline.data.readers import load_dataset

        index = load_dataset(dataset_kind, root, **(dataset_options or {})).select()[1]
        return _report_matched(*judge_split(emb, index, loaded, device, token_file_near(root)), echo)
    with FeatureCache(features) as cache:
        token_file = token_file_near(cache.attrs.get("dataset_root"))
        return _report_matched(*judge_split(emb, cache, loaded, device, token_file), echo)


def _report_matched(metrics: dict, matched, echo: Echo) -> dict:
    echo(f"judgments: {matched.summary()}")
    return metrics
