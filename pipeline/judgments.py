"""Human relevance judgments of (image, caption) pairs: readers, matching to an evaluated
split, and the agreement metrics of docs/PROTOCOL.md ("Human judgments").

Formats (``FORMATS``):

- ``flickr8k-crowdflower``: ``<image>\\t<image'>#<n>\\t<fraction yes>\\t<yes>\\t<no>`` (Hodosh
  et al. 2013). Grade = yes / (yes + no); accepted when the grade >= 0.5 (default).
- ``flickr8k-expert``: ``<image>\\t<image'>#<n>\\t<g1>\\t<g2>\\t<g3>``, three expert grades 1-4.
  Grade = their mean; gain (NDCG) = (grade - 1) / 3; accepted when the mean >= 3 (default).
- ``csv``: header ``image,caption_key,grade``; gain = grade (>= 0); accepted when the grade
  >= the threshold (0.5 by default when every grade lies in [0, 1], else required).

The caption key ``<image>#<n>`` names caption n of an image as ``Flickr8k.token.txt`` does.
Caches and datasets keep each image's captions in file order but not their keys:
``caption_keys`` is the one mapping from a caption list to keys, and
``check_caption_keys`` compares it with a token file when one is at hand.

Readers, ``check_caption_keys`` and the entry points at the end (``judge_split``,
``judge_npz``) read files; ``match_judgments`` and the metrics are pure (arrays in, numbers out).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .errors import VseError
from .metrics import CAPTIONS_PER_IMAGE, RECALL_KS, caption_image_scores, image_caption_scores

FORMATS = ("flickr8k-crowdflower", "flickr8k-expert", "csv")
# The grade at or above which people "accepted" a pair, per format (csv: for grades in [0, 1]).
DEFAULT_THRESHOLDS = {"flickr8k-crowdflower": 0.5, "flickr8k-expert": 3.0, "csv": 0.5}
EXPERT_GRADES = (1, 4)
NDCG_KS = (10,)
TAU_MIN_JUDGED = 3  # per query: at least this many judged candidates and 2 distinct grades
CSV_HEADER = ("image", "caption_key", "grade")
_PAIRWISE_ELEMENTS = 1 << 24  # queries × L × L per block of the grouped tau-b


@dataclass
class Judgments:
    """Judged pairs in file order: ``image_ids[i]`` judged against caption ``caption_keys[i]``
    with ``grades[i]`` (the file's scale), ``gains[i]`` (NDCG gain, >= 0) and ``lines[i]``."""

    path: Path
    format: str
    image_ids: list[str]
    caption_keys: list[str]
    grades: np.ndarray
    gains: np.ndarray
    lines: np.ndarray
    threshold: float

    @property
    def accepted(self) -> np.ndarray:
        return self.grades >= self.threshold

    def __len__(self) -> int:
        return len(self.image_ids)


def read_judgments(path, fmt: str = "flickr8k-crowdflower", threshold: float | None = None) -> Judgments:
    """Read a judgment file; a bad row is a one-line ``VseError`` naming the file and line."""
    path = Path(path)
    if fmt not in FORMATS:
        raise VseError(f"unknown judgments format {fmt!r} (expected {', '.join(FORMATS)})", path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise VseError("judgments file not found", path) from None
    except IsADirectoryError:
        raise VseError("is a folder, not a judgments file", path) from None
    except UnicodeDecodeError as exc:
        raise VseError(f"not UTF-8 text (byte {exc.start})", path) from None
    rows = _csv_rows(text, path) if fmt == "csv" else _tab_rows(text, fmt, path)
    if not rows:
        raise VseError("no judged pairs in the file", path)
    seen: dict[tuple[str, str], int] = {}
    for lineno, image, key, _, _ in rows:
        first = seen.setdefault((image, key), lineno)
        if first != lineno:
            raise VseError(f"line {lineno}: pair {image} / {key} is already judged on line {first}", path)
    grades = np.array([r[3] for r in rows], dtype=np.float64)
    if threshold is None:
        threshold = DEFAULT_THRESHOLDS[fmt]
        if fmt == "csv" and grades.max() > 1:
            raise VseError("grades go beyond 1: say which grade counts as accepted "
                           "(--judgments-threshold)", path)
    if not math.isfinite(threshold):
        raise VseError(f"the acceptance threshold must be a finite number, not {threshold}", path)
    return Judgments(path, fmt, [r[1] for r in rows], [r[2] for r in rows], grades,
                     np.array([r[4] for r in rows], dtype=np.float64),
                     np.array([r[0] for r in rows], dtype=np.int64), float(threshold))


def _tab_rows(text: str, fmt: str, path: Path) -> list[tuple]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 5:
            raise VseError(f"line {lineno}: expected 5 tab-separated fields "
                           f"(image, caption key, 3 numbers), found {len(fields)}", path)
        image, key = fields[0], fields[1]
        _check_pair(image, key, lineno, path)
        if fmt == "flickr8k-crowdflower":
            fraction = _number(fields[2], "fraction yes", lineno, path)
            yes, no = (_count(f, what, lineno, path) for f, what in ((fields[3], "yes"), (fields[4], "no")))
            if yes + no == 0:
                raise VseError(f"line {lineno}: no votes (0 yes, 0 no)", path)
            grade = yes / (yes + no)
            if abs(fraction - grade) > 1e-3:
                raise VseError(f"line {lineno}: fraction yes {fields[2]} disagrees with "
                               f"{yes} yes / {no} no", path)
            rows.append((lineno, image, key, grade, grade))
        else:
            marks = [_count(f, "expert grade", lineno, path) for f in fields[2:]]
            low, high = EXPERT_GRADES
            if not all(low <= g <= high for g in marks):
                raise VseError(f"line {lineno}: expert grades must be {low}-{high}, found "
                               f"{' '.join(fields[2:])}", path)
            grade = sum(marks) / 3
            rows.append((lineno, image, key, grade, (grade - low) / (high - low)))
    return rows


def _csv_rows(text: str, path: Path) -> list[tuple]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
            raise VseError(f"line 1: expected the header {','.join(CSV_HEADER)}, found "
                           f"{','.join(header or [])!r}", path)
        rows = []
        for fields in reader:
            lineno = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != 3:
                raise VseError(f"line {lineno}: expected 3 fields (image, caption_key, grade), "
                               f"found {len(fields)}", path)
            image, key = fields[0].strip(), fields[1].strip()
            _check_pair(image, key, lineno, path)
            grade = _number(fields[2], "grade", lineno, path)
            if grade < 0:
                raise VseError(f"line {lineno}: grade {fields[2].strip()} is negative (gains are >= 0)", path)
            rows.append((lineno, image, key, grade, grade))
    except csv.Error as exc:
        raise VseError(f"line {reader.line_num}: {exc}", path) from None
    return rows


def _check_pair(image: str, key: str, lineno: int, path: Path) -> None:
    name, hash_sign, number = key.rpartition("#")
    if not image:
        raise VseError(f"line {lineno}: empty image id", path)
    if not hash_sign or not name or not number.isdigit():
        raise VseError(f"line {lineno}: caption key {key!r} is not <image>#<n>", path)


def _number(text: str, what: str, lineno: int, path: Path) -> float:
    try:
        value = float(text)
    except ValueError:
        raise VseError(f"line {lineno}: {what} {text.strip()!r} is not a number", path) from None
    if not math.isfinite(value):
        raise VseError(f"line {lineno}: {what} {text.strip()!r} is not finite", path)
    return value


def _count(text: str, what: str, lineno: int, path: Path) -> int:
    text = text.strip()
    if not text.isdigit():
        raise VseError(f"line {lineno}: {what} {text!r} is not a non-negative integer", path)
    return int(text)


# ---------------------------------------------------------------------------- caption keys


@dataclass
class SplitIdentity:
    """Who the rows of an evaluated split are: image ids (N,), caption keys and texts (M,)."""

    image_ids: list[str]
    caption_keys: list[str]
    caption_texts: list[str] | None = None


def split_identity(index, image_rows, caption_rows) -> SplitIdentity:
    """Ids and keys of a split's rows of ``index`` (a ``CaptionIndex``, or what holds one:
    a FeatureCache, RC's image index)."""
    keys = getattr(index, "index", index).caption_keys
    return SplitIdentity([index.image_ids[r] for r in np.asarray(image_rows).tolist()],
                         [keys[r] for r in np.asarray(caption_rows).tolist()],
                         [index.captions[r] for r in np.asarray(caption_rows).tolist()])


def check_caption_keys(identity: SplitIdentity, token_file, keys=None) -> int:
    """Compare the reconstructed keys (all, or ``keys``) with a ``<image>#<n>\\t<caption>``
    token file: a key whose text differs means the captions are not in the file's order
    (a one-line ``VseError``). Returns how many keys were compared."""
    token_file = Path(token_file)
    wanted = set(identity.caption_keys if keys is None else keys)
    texts = dict(zip(identity.caption_keys, identity.caption_texts or []))
    found = {}
    try:
        with open(token_file, encoding="utf-8") as fh:
            for line in fh:
                key, tab, caption = line.rstrip("\r\n").partition("\t")
                if tab and key.strip() in wanted:
                    found[key.strip()] = caption.strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise VseError(f"cannot read the token file ({str(exc).splitlines()[0][:120]})", token_file) from None
    for key in sorted(wanted):
        if key in texts and found.get(key) != texts[key].strip():
            raise VseError(f"caption {key} is {found.get(key)!r} here but {texts[key]!r} in the "
                           "evaluated captions: they are not in this file's order, so caption keys "
                           "cannot be rebuilt (evaluate an npz that stores caption_keys)", token_file)
    return len(wanted & texts.keys())


# ---------------------------------------------------------------------------- matching


@dataclass
class MatchedJudgments:
    """The judged pairs inside an evaluated split (split-local indices) and what was left out."""

    image: np.ndarray       # (P,) int64
    caption: np.ndarray     # (P,) int64
    grades: np.ndarray      # (P,) float64
    gains: np.ndarray       # (P,) float64
    accepted: np.ndarray    # (P,) bool
    total: int              # judged pairs in the file
    missing_image: int      # pairs whose image is not in the split
    missing_caption: int    # pairs whose caption is not in the split
    keys: list[str] = field(default_factory=list)  # caption keys of the matched pairs

    @property
    def unmatched(self) -> int:
        return self.total - len(self.image)

    def summary(self) -> str:
        text = f"{len(self.image)} of {self.total} judged pairs in the split"
        if self.unmatched:
            text += (f"; {self.unmatched} left out ({self.missing_image} with the image, "
                     f"{self.missing_caption} with the caption outside the split)")
        return text


def match_judgments(judgments: Judgments, identity: SplitIdentity) -> MatchedJudgments:
    """Judged pairs → split-local (image, caption) indices; pairs outside the split are counted.
    A file of which no pair is in the split is a one-line ``VseError``."""
    image_index = {image_id: i for i, image_id in enumerate(identity.image_ids)}
    caption_index = {key: j for j, key in enumerate(identity.caption_keys)}
    image = np.array([image_index.get(i, -1) for i in judgments.image_ids], dtype=np.int64)
    caption = np.array([caption_index.get(k, -1) for k in judgments.caption_keys], dtype=np.int64)
    keep = (image >= 0) & (caption >= 0)
    if not keep.any():
        example = identity.image_ids[0] if identity.image_ids else "-"
        raise VseError(f"none of its {len(judgments)} judged pairs is in the evaluated split "
                       f"({len(identity.image_ids)} images, e.g. {example}; "
                       f"first pair {judgments.image_ids[0]} / {judgments.caption_keys[0]})", judgments.path)
    rows = np.flatnonzero(keep)
    return MatchedJudgments(image[rows], caption[rows], judgments.grades[rows], judgments.gains[rows],
                            judgments.accepted[rows], len(judgments), int((image < 0).sum()),
                            int((caption < 0).sum()), [judgments.caption_keys[r] for r in rows])


# ---------------------------------------------------------------------------- metrics (pure)


def grouped_kendall_tau_b(groups, x, y, min_size: int = TAU_MIN_JUDGED) -> tuple[np.ndarray, np.ndarray]:
    """Kendall's tau-b between ``x`` and ``y`` within each group: ``(group ids, tau)``, tau nan
    where the group has fewer than ``min_size`` items, fewer than 2 distinct ``y``, or is
    undefined (all ``x`` tied, as scipy). tau-b = sum_{i<j} sx sy / sqrt(sum |sx| sum |sy|)
    with sx = sign(x_i - x_j), sy = sign(y_i - y_j); sums are exact integers."""
    groups, x, y = np.asarray(groups), np.asarray(x, np.float64), np.asarray(y, np.float64)
    ids, padded_x, padded_y, valid = _pad_groups(groups, x, y)
    tau = np.full(len(ids), np.nan)
    size = padded_x.shape[1]
    step = max(1, _PAIRWISE_ELEMENTS // max(1, size * size))
    for a in range(0, len(ids), step):
        px, py, v = padded_x[a:a + step], padded_y[a:a + step], valid[a:a + step]
        both = v[:, :, None] & v[:, None, :]
        sx, sy = _signs(px, both), _signs(py, both)
        untied = (np.abs(sx).sum(axis=(1, 2), dtype=np.int64).astype(np.float64)
                  * np.abs(sy).sum(axis=(1, 2), dtype=np.int64))
        concordance = (sx * sy).sum(axis=(1, 2), dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tau[a:a + step] = np.where(untied > 0, concordance / np.sqrt(untied), np.nan)
    counts = valid.sum(axis=1)
    distinct_y = np.array([len(np.unique(row[m])) for row, m in zip(padded_y, valid)]) if len(ids) else counts
    tau[(counts < min_size) | (distinct_y < 2)] = np.nan
    return ids, tau


def _signs(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(G, L, L) int8 sign(values_i - values_j), 0 outside ``mask``."""
    a, b = values[:, :, None], values[:, None, :]
    return ((a > b).astype(np.int8) - (a < b).astype(np.int8)) * mask


def grouped_ndcg(groups, scores, gains, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NDCG@k of each group's items ranked by ``scores`` (descending; ties put the lower gain
    first, against the query): DCG@k = sum_{r=1..k} gain_r / log2(r + 1), divided by the DCG@k
    of the gains in ideal order. nan where every gain is 0."""
    ids, s, g, valid = _pad_groups(np.asarray(groups), np.asarray(scores, np.float64),
                                   np.asarray(gains, np.float64))
    s = np.where(valid, s, -np.inf)
    g = np.where(valid, g, 0.0)
    by_gain = np.argsort(g, axis=1, kind="stable")
    s1, g1 = np.take_along_axis(s, by_gain, 1), np.take_along_axis(g, by_gain, 1)
    ranked = np.take_along_axis(g1, np.argsort(-s1, axis=1, kind="stable"), 1)[:, :k]
    ideal = -np.sort(-g, axis=1)[:, :k]
    discount = 1.0 / np.log2(np.arange(2, ranked.shape[1] + 2))
    dcg, idcg = ranked @ discount, ideal @ discount
    with np.errstate(invalid="ignore", divide="ignore"):
        return ids, np.where(idcg > 0, dcg / idcg, np.nan)


def _pad_groups(groups, *values):
    """(group ids, each value as a (G, L) array padded with 0, valid mask) with items in
    their original order inside each group."""
    order = np.argsort(groups, kind="stable")
    ids, inverse, counts = np.unique(groups[order], return_inverse=True, return_counts=True)
    width = int(counts.max()) if len(counts) else 0
    position = np.arange(len(order)) - (np.cumsum(counts) - counts)[inverse]
    padded = []
    for v in values:
        out = np.zeros((len(ids), width), dtype=np.float64)
        out[inverse, position] = v[order]
        padded.append(out)
    valid = np.zeros((len(ids), width), dtype=bool)
    valid[inverse, position] = True
    return (ids, *padded, valid)


def spearman(x, y) -> float:
    """Spearman's rho: Pearson correlation of the average ranks (nan if either is constant)."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denominator if denominator > 0 else math.nan


def auc(scores, positive) -> float:
    """Area under the ROC curve of ``scores`` separating ``positive`` from the rest: the
    probability that a random positive scores above a random negative, ties counted 1/2."""
    from scipy.stats import rankdata

    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def plausible_ranks(scores: torch.Tensor, match: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query row: the 0-based rank of the best match (#non-matches scoring >= it) and the
    R-precision (fraction of matches among the top R = #matches, ties against the query)."""
    best = scores.masked_fill(~match, -torch.inf).max(dim=1, keepdim=True).values
    rank = ((scores >= best) & ~match).sum(dim=1)
    by_match = torch.sort(match.to(torch.int8), dim=1, stable=True).indices  # non-matches first
    by_score = torch.sort(scores.gather(1, by_match), dim=1, descending=True, stable=True).indices
    hits = match.gather(1, by_match.gather(1, by_score)).to(torch.int64).cumsum(dim=1)
    relevant = match.sum(dim=1)
    return rank, hits.gather(1, (relevant - 1).clamp(min=0)[:, None])[:, 0] / relevant.clamp(min=1)


def human_metrics(images, captions, caption_image, matched: MatchedJudgments, *, order: bool | str = False,
                  device=None, recall_ks=RECALL_KS, ndcg_ks=NDCG_KS, block: int = 1024) -> dict:
    """Agreement of a model's scores with the judged pairs (docs/PROTOCOL.md, "Human
    judgments"): keys ``human_{i2t,t2i}_{tau,ndcg@K,r@K,rprec}``, ``human_spearman`` and
    counts (``human_pairs``, ``human_unmatched``, ``human_{dir}_queries``, ``human_{dir}_tau_queries``)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    images = torch.as_tensor(np.asarray(images, dtype=np.float32), device=device)
    captions = torch.as_tensor(np.asarray(captions, dtype=np.float32), device=device)
    caption_image = torch.as_tensor(np.asarray(caption_image, dtype=np.int64), device=device)
    pair_scores = np.empty(len(matched.image))
    result: dict = {}
    accepted_image = torch.as_tensor(matched.image[matched.accepted], device=device)
    accepted_caption = torch.as_tensor(matched.caption[matched.accepted], device=device)
    for direction, queries in (("i2t", matched.image), ("t2i", matched.caption)):
        ids = np.unique(queries)
        acc_q, acc_c = ((accepted_image, accepted_caption) if direction == "i2t"
                        else (accepted_caption, accepted_image))
        local = torch.full((len(images) if direction == "i2t" else len(captions),), -1,
                           dtype=torch.int64, device=device)
        ranks, rprec = [], []
        for a in range(0, len(ids), block):
            q = torch.as_tensor(ids[a:a + block], device=device)
            with torch.no_grad():
                if direction == "i2t":
                    scores = image_caption_scores(images[q], captions, order).float()
                    match = caption_image[None, :] == q[:, None]
                else:
                    scores = caption_image_scores(captions[q], images, order).float()
                    match = torch.arange(len(images), device=device)[None, :] == caption_image[q][:, None]
                local.fill_(-1)
                local[q] = torch.arange(len(q), device=device)
                inside = local[acc_q] >= 0
                match[local[acc_q[inside]], acc_c[inside]] = True  # people accepted: a match too
                r, p = plausible_ranks(scores, match)
            ranks.append(r.cpu().numpy())
            rprec.append(p.cpu().numpy())
            if direction == "i2t":
                in_block = np.isin(matched.image, ids[a:a + block])
                rows = np.searchsorted(ids[a:a + block], matched.image[in_block])
                pair_scores[in_block] = scores.cpu().numpy()[rows, matched.caption[in_block]]
        ranks, rprec = np.concatenate(ranks), np.concatenate(rprec)
        for k in recall_ks:
            result[f"human_{direction}_r@{k}"] = 100.0 * float(np.mean(ranks < k))
        result[f"human_{direction}_rprec"] = 100.0 * float(np.mean(rprec))
        _, taus = grouped_kendall_tau_b(queries, pair_scores, matched.grades)
        result[f"human_{direction}_tau"] = _mean_defined(taus)
        for k in ndcg_ks:
            _, ndcg = grouped_ndcg(queries, pair_scores, matched.gains, k)
            result[f"human_{direction}_ndcg@{k}"] = _mean_defined(ndcg)
        result[f"human_{direction}_queries"] = len(ids)
        result[f"human_{direction}_tau_queries"] = int((~np.isnan(taus)).sum())
    result["human_spearman"] = spearman(pair_scores, matched.grades)
    result["human_pairs"] = len(matched.image)
    result["human_unmatched"] = matched.unmatched
    return result


def _mean_defined(values: np.ndarray) -> float:
    defined = values[~np.isnan(values)]
    return float(defined.mean()) if len(defined) else math.nan


METRIC_ORDER = ("tau", "ndcg@", "r@", "rprec")


def format_human(metrics: dict) -> str:
    """The human-judgment lines of ``vse evaluate``'s table (empty when there are none)."""
    if "human_pairs" not in metrics:
        return ""
    lines = [f"human judgments: {metrics['human_pairs']} pairs"
             + (f" ({metrics['human_unmatched']} outside the split, left out)"
                if metrics["human_unmatched"] else "")
             + f", Spearman {metrics['human_spearman']:.3f}"]
    for direction, name in (("i2t", "image→text"), ("t2i", "text→image")):
        keys = sorted((k for k in metrics
                       if k.startswith(f"human_{direction}_") and not k.endswith("queries")),
                      key=human_key_order)
        cells = [f"{k[len(f'human_{direction}_'):]} {_human_value(k, metrics[k])}" for k in keys]
        lines.append(f"  {name:11s} " + "  ".join(cells)
                     + f"  ({metrics[f'human_{direction}_queries']} queries, "
                       f"tau over {metrics[f'human_{direction}_tau_queries']})")
    return "\n".join(lines)


def human_key_order(key: str):
    """Sort key of ``human_<dir>_<metric>`` keys: tau, NDCG@K, R@K, R-precision."""
    name = key.split("_", 2)[2]
    group = next(i for i, prefix in enumerate(METRIC_ORDER) if name.startswith(prefix))
    return group, int(name.split("@")[1]) if "@" in name else 0


def _human_value(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.1f}" if ("_r@" in key or key.endswith("_rprec")) else f"{value:.3f}"


# ---------------------------------------------------------------------------- entry points


@dataclass(frozen=True)
class JudgmentOptions:
    """What the user asked for: ``--judgments FILE --judgments-format F --judgments-threshold T``."""

    path: str
    format: str = "flickr8k-crowdflower"
    threshold: float | None = None

    def load(self) -> Judgments:
        return read_judgments(self.path, self.format, self.threshold)


def token_file_near(root) -> Path | None:
    """The Flickr8k token file of a dataset folder, when there is one (to check caption keys)."""
    from .datasets import FLICKR8K_TOKEN_FILE

    if not root:
        return None
    candidate = Path(root) / FLICKR8K_TOKEN_FILE
    return candidate if candidate.is_file() else None


def match_split(emb, index, judgments: Judgments, token_file=None) -> MatchedJudgments:
    """The judged pairs of split embeddings' rows of ``index`` (rebuilt caption keys checked
    against ``token_file`` when given): the one matching step of evaluate, --runs and gallery."""
    identity = split_identity(index, emb.image_rows, emb.caption_rows)
    matched = match_judgments(judgments, identity)
    if token_file is not None:
        check_caption_keys(identity, token_file, matched.keys)
    return matched


def judge_split(emb, index, judgments: Judgments, device=None,
                token_file=None) -> tuple[dict, MatchedJudgments]:
    """Human-judgment metrics of split embeddings (``inference.SplitEmbeddings``) whose rows
    index ``index`` (a FeatureCache, CacheIndex or RC index). With ``token_file`` the rebuilt
    keys of the judged captions are checked against it first."""
    matched = match_split(emb, index, judgments, token_file)
    metrics = human_metrics(emb.images, emb.captions, emb.caption_image, matched,
                            order=emb.similarity, device=device)
    return metrics, matched


def judge_npz(path, judgments: Judgments, order: bool = False, device=None) -> tuple[dict, MatchedJudgments]:
    """Human-judgment metrics of an embeddings npz that stores ``image_ids`` (N,) and
    ``caption_keys`` (M,) string arrays beside ``images`` and ``captions``."""
    from .evaluation import load_embeddings_npz

    images, captions, caption_image = load_embeddings_npz(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("image_ids", "caption_keys") if k not in npz.files]
            if missing:
                raise VseError(f"--judgments needs the npz to name its rows: it lacks {', '.join(missing)} "
                               "(string arrays: image ids (N,), caption keys <image>#<n> (M,))", path)
            image_ids, keys = npz["image_ids"], npz["caption_keys"]
    except (OSError, ValueError) as exc:
        problem = str(exc).splitlines()[0][:120]
        raise VseError(f"cannot read image_ids / caption_keys ({problem})", path) from exc
    if image_ids.shape != (len(images),) or keys.shape != (len(captions),) or \
            image_ids.dtype.kind != "U" or keys.dtype.kind != "U":
        raise VseError(f"image_ids {image_ids.shape} {image_ids.dtype} and caption_keys {keys.shape} "
                       f"{keys.dtype} must be string arrays of {len(images)} and {len(captions)} rows", path)
    if caption_image is None:
        caption_image = np.repeat(np.arange(len(images)), CAPTIONS_PER_IMAGE)
    matched = match_judgments(judgments, SplitIdentity(image_ids.tolist(), keys.tolist()))
    return human_metrics(images, captions, caption_image, matched, order=order, device=device), matched


# ---------------------------------------------------------------------------- relevance methods


def image_caption_relevance(rel_fn, caption_image, judged_captions, block: int = 4096) -> np.ndarray:
    """(N, U) relevance of each image to each judged caption by the ladder loss's rule: the max
    over the image's own captions c of rel(c, p), leaving out c = p (a caption is not scored
    by itself). ``rel_fn(rows, cols)`` → (len(rows), len(cols)) caption–caption relevance of
    split-local caption indices; ``caption_image`` (M,) maps captions to images."""
    caption_image = np.asarray(caption_image, dtype=np.int64)
    judged = np.asarray(judged_captions, dtype=np.int64)
    out = np.full((int(caption_image.max()) + 1, len(judged)), -np.inf)
    for a in range(0, len(caption_image), block):
        rows = np.arange(a, min(a + block, len(caption_image)))
        rel = np.asarray(rel_fn(rows, judged), dtype=np.float64)
        rel[rows[:, None] == judged[None, :]] = -np.inf
        np.maximum.at(out, caption_image[rows], rel)
    return out


def relevance_agreement(pair_relevance, matched: MatchedJudgments, caption_image) -> dict:
    """How well a relevance predicts the judgments: per-image tau-b and Spearman against the
    grades, ROC AUC of accepted vs rejected pairs (all pairs, and pairs whose caption belongs
    to another image)."""
    own = np.asarray(caption_image)[matched.caption] == matched.image
    _, taus = grouped_kendall_tau_b(matched.image, pair_relevance, matched.grades)
    return {"pairs": len(matched.image), "accepted": int(matched.accepted.sum()),
            "tau": _mean_defined(taus), "tau_images": int((~np.isnan(taus)).sum()),
            "spearman": spearman(pair_relevance, matched.grades),
            "auc": auc(pair_relevance, matched.accepted),
            "other_pairs": int((~own).sum()), "other_accepted": int(matched.accepted[~own].sum()),
            "auc_other": auc(pair_relevance[~own], matched.accepted[~own])}


def format_relevance_agreement(results: dict) -> str:
    """A markdown table of ``{method: relevance_agreement(...)}``."""
    lines = ["| relevance | tau (per image) | Spearman | AUC | AUC (other images' captions) |",
             "|:---|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(_human_value("_tau", r[k]) for k in
                                                 ("tau", "spearman", "auc", "auc_other")) + " |")
    return "\n".join(lines)


def score_relevance_methods(judgments: Judgments, *, features=None, root=None, dataset_kind: str = "flickr8k",
                            split: str = "test", fit_splits=("train",), methods=(), relevance_files=(),
                            k: int = 400, cbow_threshold: float | None = None, seed: int = 0,
                            batch_size: int = 256, device="auto", out=None, echo=print,
                            command: str | None = None, dataset_options: dict | None = None) -> dict:
    """`vse relevance-human`: each relevance method (computed here on the split's captions, svd
    fitted on ``fit_splits``) and each stored relevance file of ``features``' cache, scored
    by ``relevance_agreement`` with the ladder rule. Returns (and writes to ``out``) a JSON-able
    report."""
    import time

    from .relevance import compute_relevance_vectors, read_relevance
    from .relevance.stage import DEFAULT_CBOW_THRESHOLD

    if out is not None:
        _check_report_target(out)
    index, dataset_root = _caption_index(features, dataset_kind, root, dataset_options)
    image_rows, caption_rows, caption_image = index.split_rows(split)
    identity = split_identity(index, image_rows, caption_rows)
    matched = match_judgments(judgments, identity)
    token_file = token_file_near(dataset_root)
    if token_file is not None:
        check_caption_keys(identity, token_file, matched.keys)
    echo(f"judgments: {matched.summary()}")
    judged = np.unique(matched.caption)
    column = np.searchsorted(judged, matched.caption)
    split_captions = [index.captions[r] for r in caption_rows]
    fit_rows = np.concatenate([index.split_rows(s)[1] for s in fit_splits] or [np.zeros(0, np.int64)])
    threshold = DEFAULT_CBOW_THRESHOLD if cbow_threshold is None else cbow_threshold

    def score(vectors, coarse=None, gate=None) -> dict:
        rel_fn = _relevance_fn(vectors, coarse, gate)
        pair = image_caption_relevance(rel_fn, caption_image, judged)[matched.image, column]
        return relevance_agreement(pair, matched, caption_image)

    results, seconds = {}, {}
    for method in methods:
        start = time.perf_counter()
        captions, fit = split_captions, np.zeros(0, dtype=np.int64)
        if method == "svd":
            captions = split_captions + [index.captions[r] for r in fit_rows]
            fit = np.arange(len(split_captions), len(captions))
        rv, _ = compute_relevance_vectors(captions, fit, method, k=k, seed=seed, device=device,
                                          batch_size=batch_size, cbow_threshold=threshold)
        n = len(split_captions)
        coarse = None if rv.coarse_vectors is None else rv.coarse_vectors[:n]
        results[method] = score(rv.vectors[:n], coarse, rv.cbow_threshold)
        seconds[method] = round(time.perf_counter() - start, 2)
        echo(f"{method}: tau {results[method]['tau']:.3f}, AUC {results[method]['auc']:.3f} "
             f"({seconds[method]} s)")
    for path in relevance_files:
        stored = read_relevance(path)
        stored_digest = stored.attrs.get("caption_fingerprint")
        if stored.num_captions != len(index.captions) or (
                stored_digest is not None and stored_digest != index.fingerprint):
            raise VseError(f"relevance file was made for other captions ({stored.num_captions} captions, "
                           f"the cache has {len(index.captions)})", path)
        name = f"{stored.method} ({Path(path).name})"
        results[name] = score(stored.vectors[caption_rows],
                              None if stored.coarse_vectors is None else stored.coarse_vectors[caption_rows],
                              stored.cbow_threshold)
    report = {"kind": REPORT_KIND, "command": command, "judgments": str(judgments.path),
              "format": judgments.format,
              "threshold": judgments.threshold, "source": str(features or root), "split": split,
              "fit_splits": list(fit_splits), "pairs": len(matched.image), "unmatched": matched.unmatched,
              "rule": "relevance(image q, caption p) = max over q's captions c != p of rel(c, p)",
              "methods": results, "seconds": seconds}
    if out is not None:
        import json

        from .fsutil import atomic_path

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            Path(tmp).write_text(json.dumps(report, indent=1, allow_nan=False, default=str) + "\n",
                                 encoding="utf-8")
    return report


REPORT_KIND = "vse relevance-human"


def _check_report_target(out) -> None:
    """Never overwrite a file this command did not make."""
    import json

    out = Path(out)
    if not out.exists():
        return
    try:
        made_here = json.loads(out.read_text(encoding="utf-8")).get("kind") == REPORT_KIND
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        made_here = False
    if not made_here:
        raise VseError("exists and is not a `vse relevance-human` report: not overwritten", out)


def _relevance_fn(vectors, coarse=None, threshold=None):
    from .relevance import relevance_matrix

    table = torch.from_numpy(np.asarray(vectors, dtype=np.float32))
    gate = None if coarse is None else torch.from_numpy(np.asarray(coarse, dtype=np.float32))

    def rel(rows, cols):
        rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
        return relevance_matrix(table[rows], table[cols], None if gate is None else gate[rows],
                                None if gate is None else gate[cols], threshold).numpy()

    return rel


def _caption_index(features, dataset_kind: str, root, dataset_options: dict | None = None):
    """The caption index of a feature cache, or of the cache `vse extract` would write for a
    dataset; and the dataset folder (where a token file may be)."""
    if features:
        from .cache import FeatureCache

        with FeatureCache(features) as cache:
            return cache.index, cache.attrs.get("dataset_root")
    from .datasets import load_dataset

    dataset = load_dataset(dataset_kind, root, **(dataset_options or {}))
    return dataset.select()[1], str(dataset.root)
