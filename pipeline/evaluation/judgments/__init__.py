"""Human relevance judgments of (image, caption) pairs (docs/PROTOCOL.md, "Human judgments").

- ``formats``: the judgment files (flickr8k-crowdflower, flickr8k-expert, csv) → ``Judgments``.
- ``matching``: judged pairs → rows of an evaluated split, named by image ids and caption keys
  (``pipeline.data.caption_index``), checked against a Flickr8k token file when one is at hand.
- ``metrics``: the agreement metrics (``human_*`` keys of ``pipeline.evaluation.metrics.METRICS``), on
  the formulas of ``pipeline.evaluation.metrics``.

Evaluating a model against judgments: ``pipeline.evaluation.evaluate.judge_split`` / ``judge_npz``;
scoring relevance methods against them (`vse relevance-human`): ``pipeline.evaluation.relevance_human``.
"""

from pipeline.evaluation.judgments.formats import (
    CSV_HEADER,
    DEFAULT_THRESHOLDS,
    EXPERT_GRADES,
    FORMATS,
    JudgmentOptions,
    Judgments,
    read_judgments,
)
from pipeline.evaluation.judgments.matching import (
    MatchedJudgments,
    SplitIdentity,
    check_caption_keys,
    match_judgments,
    match_rows,
    match_split,
    split_identity,
    token_file_near,
)
from pipeline.evaluation.judgments.metrics import (
    NDCG_KS,
    TAU_MIN_JUDGED,
    format_human,
    grouped_kendall_tau_b,
    grouped_ndcg,
    human_metrics,
    plausible_ranks,
)
from pipeline.evaluation.metrics import auc, spearman

__all__ = ["auc", "spearman", "CSV_HEADER", "DEFAULT_THRESHOLDS", "EXPERT_GRADES", "FORMATS",
           "JudgmentOptions", "Judgments", "read_judgments", "MatchedJudgments", "SplitIdentity",
           "check_caption_keys", "match_judgments", "match_rows", "match_split", "split_identity",
           "token_file_near", "NDCG_KS", "TAU_MIN_JUDGED", "format_human", "grouped_kendall_tau_b",
           "grouped_ndcg", "human_metrics", "plausible_ranks"]
