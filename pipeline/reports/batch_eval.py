"""Evaluating many runs in one call: one results row per run (`vse evaluate --runs`).

Each feature cache is opened once and its captions are tokenised once per vocabulary (or
their cached caption features read once), so a sweep of runs trained on one cache costs one
cache read plus one forward pass per run.
A run whose checkpoint is missing or unusable is reported and skipped; the others go on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.core import code_identity, precision
from pipeline.core.errors import VseError
from pipeline.core.fsutil import file_sha256
from pipeline.core.plugin_import import user_code_error
from pipeline.data.cache import FeatureCache
from pipeline.data.captions import CaptionEncoder, caption_key
from pipeline.evaluation.evaluate import evaluate_split_embeddings
from pipeline.evaluation.inference import (
    LoadedModel,
    check_features_match,
    encode_split,
    ensemble_size,
    load_model,
    member_network,
    model_from_state,
)
from pipeline.evaluation.metrics import metric_keys
from pipeline.training.run_folder import (
    best_record,
    config_id,
    epochs_to_best,
    is_run_dir,
    read_code_identity,
    read_config,
    read_validation_log,
    run_names,
)

ENSEMBLE = "ensemble"  # how many networks' scores a row averages (docs/PROTOCOL.md, "Ensemble size")
MEMBER = "member"      # a co-trained run's network evaluated alone (--member): its index; empty otherwise
# Columns describing a run, in the order results.csv lists them (metrics follow).
RUN_COLUMNS = ("run", "loss", "margin", "negative_set_size", "loss_options", "batch_size", "seed",
               "epochs", "backbone", "crops", "train_set", "features", "split", "protocol", "images",
               "checkpoint", "checkpoint_iteration", "epochs_to_best", "best_val_mrecall", "config_id",
               code_identity.COLUMN, "noise_true_rate", "checkpoint_sha256", "evaluation_id",
               precision.COLUMN, "rescore", ENSEMBLE, MEMBER)
# "rescore": a re-scored row's correction (pipeline.evaluation.rescore.RescorePlan.label; empty: the raw
# scores), part of report's configuration key: a corrected row is never pooled with the raw one


@dataclass
class Skipped:
    run_dir: Path
    reason: str


@dataclass
class BatchResult:
    rows: list[dict] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    kept: int = 0            # rows kept from an earlier table (``evaluate_runs``'s ``kept``)


class RunEvaluator:
    """Evaluates checkpoints one after another, sharing open caches, tokenised captions and
    relevance tables between them. Use as a context manager (closes the caches)."""

    def __init__(self, device: torch.device, split: str = "test", protocol: str = "single",
                 features=None, relevance=None, cs_ks=(), judgments=None, text_features=None, rescore=None):
        self.device, self.split, self.protocol = device, split, protocol
        self.rescore = rescore  # pipeline.evaluation.rescore.RescorePlan: each run's re-scored rows too
        self.judgments = judgments  # pipeline.evaluation.judgments.Judgments: adds the human_* columns
        self._fingerprints: dict[Path, str | None] = {}  # each input file's, computed once (``fingerprint``)
        self._matched: dict[Path, object] = {}
        self.features, self.text_features = features, text_features
        self.relevance_path, self.cs_ks = relevance, tuple(cs_ks)
        self._caches: dict[Path, FeatureCache] = {}
        self._captions: dict[tuple, CaptionEncoder] = {}
        self._relevance: dict[Path, object] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for cache in self._caches.values():
            cache.close()
        self._caches.clear()

    def cache(self, path) -> FeatureCache:
        key = Path(path).resolve()
        if key not in self._caches:
            self._caches[key] = FeatureCache(path)
        return self._caches[key]

    def captions(self, cache: FeatureCache, loaded: LoadedModel, checkpoint) -> CaptionEncoder:
        """The model's caption side on ``cache``, shared by runs with the same vocabulary (or
        the same caption features and model)."""
        key = (cache.path.resolve(), caption_key(loaded.state, self.text_features))
        if key not in self._captions:
            self._captions[key] = loaded.captions(cache, self.text_features, checkpoint)
        return self._captions[key]

    def relevance(self, cache: FeatureCache):
        from pipeline.evaluation.evaluate import relevance_for_cache

        key = cache.path.resolve()
        if key not in self._relevance:
            self._relevance[key] = relevance_for_cache(self.relevance_path, cache)
        return self._relevance[key]

    def judge(self, cache: FeatureCache, emb) -> dict:
        """Human-judgment metrics of split embeddings (``matched``'s pairs)."""
        from pipeline.evaluation.judgments import human_metrics

        return human_metrics(emb.images, emb.captions, emb.caption_image, self.matched(cache, emb),
                             similarity=emb.similarity, device=self.device)

    def matched(self, cache: FeatureCache, emb):
        """The judged pairs matched to a cache's split (``MatchedJudgments``), once per cache."""
        from pipeline.evaluation.judgments import match_split, token_file_near

        key = cache.path.resolve()
        if key not in self._matched:
            token_file = token_file_near(cache.attrs.get("dataset_root"))
            self._matched[key] = match_split(emb, cache, self.judgments, token_file)
        return self._matched[key]

    def fingerprint(self, path) -> str | None:
        """The identity of an input file's content, computed once per evaluator (``input_fingerprint``)."""
        if not path:
            return None
        key = Path(path).resolve()
        if key not in self._fingerprints:
            self._fingerprints[key] = input_fingerprint(key)
        return self._fingerprints[key]

    def evaluation_id(self, checkpoint: str, features=None, text_features=None,
                      member: int | None = None) -> str:
        """A digest of how this evaluator evaluates a run: split, protocol, CS@K, the judgments'
        format and threshold, the checkpoint name, and every input file by path and content
        (``input_fingerprint``): the feature cache and caption-feature file the run is evaluated on
        (``features``, ``text_features``: the evaluator's, else the run's own), the relevance file,
        the judgments and the token file they are matched with; a file by its content alone, so the
        same file named by another path is the same input; a network of co-trained ones evaluated
        alone (``member``) is another evaluation. Two rows with equal ids and equal checkpoint bytes
        hold the same numbers (``evaluate_runs``'s ``kept``)."""
        import hashlib

        features, text_features = self.features or features, self.text_features or text_features
        files = [features, text_features, self.relevance_path]
        judged = None
        if self.judgments is not None:
            judged = [self.judgments.format, self.judgments.threshold]
            files += [self.judgments.path, self._token_file(features)]
        settings = [self.split, self.protocol, list(self.cs_ks), judged, checkpoint,
                    [self.fingerprint(f) or str(f or "") for f in files]]  # a missing file: its name
        if member is not None:  # only then: the ids of whole evaluations stay what they were
            settings.append(["member", member])
        return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:12]

    def run_evaluation_id(self, run_dir, checkpoint: str, member: int | None = None) -> str:
        """``evaluation_id`` of a run before it is evaluated: its inputs from its config.json."""
        config = read_config(run_dir)
        return self.evaluation_id(checkpoint, config.get("features"), config.get("text_features"), member)

    def _token_file(self, features):
        """The Flickr8k token file the judgments are matched with (``judge``), or None."""
        from pipeline.evaluation.judgments import token_file_near

        if not features or not Path(features).is_file():
            return None
        return token_file_near(self.cache(features).attrs.get("dataset_root"))

    def fresh_metric_keys(self, images) -> list[str]:
        """The metric columns a fresh evaluation by this evaluator writes for a split of ``images``:
        retrieval, CS@K (the K the split allows) and the human-judgment ones."""
        from pipeline.evaluation.evaluate import usable_cs_ks
        from pipeline.evaluation.judgments.metrics import NDCG_KS
        from pipeline.evaluation.metrics import METRIC_KEYS, METRICS, RECALL_KS

        keys = list(METRIC_KEYS)
        if self.relevance_path and self.cs_ks and isinstance(images, int):
            ks, _ = usable_cs_ks(self.cs_ks, images)
            keys += [m.key.format(k=k) for m in METRICS if m.group == "cs" for k in ks]
        if self.judgments is not None:
            family_ks = {"ndcg@{k}": NDCG_KS, "r@{k}": RECALL_KS}  # human_metrics' defaults
            for m in METRICS:
                if m.group in ("human", "count") and m.key.startswith("human_"):
                    ks = next((v for end, v in family_ks.items() if m.key.endswith(end)), (None,))
                    keys += [m.key.format(k=k) for k in ks]
        return keys

    def embed(self, run_dir, checkpoint: str = "best.pt", state: dict | None = None,
              member: int | None = None):
        """(split embeddings, loaded model, checkpoint path, feature cache path) of one run;
        ``state``: the checkpoint already read by the caller (``load_checkpoint``), not read again;
        ``member``: a co-trained run's network of that index alone (``inference.member_network``)."""
        run_dir = Path(run_dir)
        checkpoint_path = run_dir / checkpoint
        if state is None and not checkpoint_path.is_file():
            raise VseError(f"no {checkpoint} (not trained up to a validation yet?)", run_dir)
        loaded = (load_model(checkpoint_path, self.device) if state is None
                  else model_from_state(state, checkpoint_path, self.device))
        train_config = loaded.train_config
        features = self.features or train_config.get("features")
        if not features:
            raise VseError("checkpoint names no feature cache: give --features", checkpoint_path)
        cache = self.cache(features)
        check_features_match(cache, loaded.model, loaded.state.get("feature_source", {}),
                             checkpoint_path)
        captions = self.captions(cache, loaded, checkpoint_path)
        network = loaded.model if member is None else member_network(loaded, member, checkpoint_path)
        embeddings = encode_split(network, cache, captions, self.split, self.device)
        return embeddings, loaded, checkpoint_path, features

    def metrics(self, emb, features) -> dict:
        """Retrieval metrics of split embeddings (or scores), with CS@K and the human columns
        when this evaluator was given a relevance file and judgments."""
        cache = self.cache(features)
        relevance = self.relevance(cache) if self.relevance_path and self.cs_ks else None
        metrics = evaluate_split_embeddings(emb, self.protocol, self.device, relevance,
                                            self.cs_ks if relevance is not None else ())
        metrics.pop("folds", None)
        if self.protocol != "5fold":
            from pipeline.evaluation.metrics import hubness_metrics
            from pipeline.evaluation.rescore import split_scores

            metrics.update(hubness_metrics(split_scores(emb)))
        if self.judgments is not None:
            metrics.update(self.judge(cache, emb))
        return metrics

    def rescored_rows(self, embedded, row: dict) -> list[dict]:
        """One row per correction of ``self.rescore`` (``embed``'s four values and the run's raw
        row): named ``RUN + METHOD``, its ``rescore`` column saying what it saw, the run's columns,
        the retrieval metrics, hubness and (with judgments) the human-judgment metrics of the
        re-scored scores, each direction's from its corrected matrix (``command.rescored_metrics``);
        the raw row's CS@K is the raw scores' and is not carried over."""
        from pipeline.evaluation.command import checkpoint_banks, rescored_metrics
        from pipeline.evaluation.metrics import is_metric, metric_of
        from pipeline.evaluation.rescore import split_scores

        emb, loaded, checkpoint_path, features = embedded
        plan, cache = self.rescore, self.cache(features)
        bank_images = plan.check_bank(len(cache.split_rows(plan.bank_split)[0]))
        banks = None
        if plan.uses_bank:
            captions = self.captions(cache, loaded, checkpoint_path)
            banks = checkpoint_banks(checkpoint_path, cache, emb, plan, self.device, loaded=loaded,
                                     captions=captions).__getitem__
        described = {k: v for k, v in row.items() if not is_metric(k) or metric_of(k).group == "training"}
        scores = split_scores(emb)
        matched = self.matched(cache, emb) if self.judgments is not None else None
        rows = []
        for method in plan.methods:
            metrics, _ = rescored_metrics(scores, emb.caption_image, method, banks, matched, self.device)
            rows.append({**described, "run": f"{row['run']} {plan.row_name(method)}",
                         "rescore": plan.label(method, bank_images),
                         **{k: float(v) for k, v in metrics.items()}})
        return rows

    def row(self, run_dir, emb, loaded, checkpoint_path, features, member: int | None = None) -> dict:
        """The results row of one run from its split embeddings (``embed``'s four values; ``member``:
        as given to ``embed``)."""
        run_dir = Path(run_dir)
        train_config = loaded.train_config
        metrics = self.metrics(emb, features)
        records = read_validation_log(run_dir)
        best = best_record(records)
        source = loaded.state.get("feature_source") or {}
        dataset = source.get("dataset") or Path(str(train_config.get("features", ""))).stem
        return {
            **describe_config(train_config, code_identity.of_state(loaded.state)),
            "backbone": source.get("backbone"), "crops": source.get("crops"),
            "train_set": f"{dataset}:{train_config.get('train_split', 'train')}",
            "features": str(features), "split": self.split, "protocol": self.protocol,
            "images": len(emb.images), "checkpoint": str(checkpoint_path),
            "checkpoint_iteration": loaded.state.get("iteration"),
            precision.COLUMN: precision.label_of(loaded.state),  # network/loss/evaluation (fp32 here)
            ENSEMBLE: 1 if member is not None else ensemble_size(loaded.state),
            **({MEMBER: member} if member is not None else {}),
            "epochs_to_best": epochs_to_best(records),
            "best_val_mrecall": None if best is None else best["mrecall"],
            **{k: float(v) for k, v in metrics.items()},
            **_noise_columns(best),
            "checkpoint_sha256": file_sha256(checkpoint_path),
            "evaluation_id": self.evaluation_id(Path(checkpoint_path).name, features,
                                                train_config.get("text_features"), member),
        }


def describe_config(config: dict, code: dict | None = None) -> dict:
    """The run-describing columns that come from a training config: the loss, its effective
    margin (the loss's default when the config leaves it unset), negative set size, seed; with the
    run's ``code`` identity (its checkpoint's or code.json's; None before vse recorded it) its
    config_id counts its plug-ins' sha256, and ``code_id`` is its code's (empty when unrecorded)."""
    from pipeline.losses.base import build_loss

    options = dict(config.get("loss_options") or {})
    margin = config.get("margin")
    if margin is None:
        try:
            margin = getattr(build_loss(config.get("loss", "mh"), **options), "margin", None)
        except (TypeError, ValueError):
            margin = None
    return {"loss": config.get("loss"), "margin": margin,
            "negative_set_size": options.get("negative_set_size"),
            "loss_options": json.dumps(options, sort_keys=True) if options else "",
            "batch_size": config.get("batch_size"), "seed": config.get("seed"),
            "epochs": config.get("epochs"), "config_id": config_id(config, code) if config else None,
            code_identity.COLUMN: code_identity.id_of(code)}


def evaluate_runs(run_dirs, *, device: torch.device, split: str = "test", protocol: str = "single",
                  features=None, relevance=None, cs_ks=(), checkpoint: str = "best.pt",
                  echo=print, judgments=None, text_features=None, average_with=(), kept=(),
                  rescore=None, member: int | None = None) -> BatchResult:
    """One row per run (``run`` = its short name); unusable runs are echoed and skipped.

    ``kept``: rows of an earlier results table (``vse evaluate --keep-evaluated``). A run whose row
    there has the same checkpoint bytes (``checkpoint_sha256``) and the same ``evaluation_id`` keeps
    that row's numbers and is not evaluated again; its configuration columns (``config_id`` ...)
    are read again from its config, so a row written by an older version groups with new ones.

    ``average_with``: folders of other runs (e.g. a sweep of SAF beside one of SGR). Each run is
    then averaged with the run of the same folder name in each of them, as SGRAF averages an SGR
    and an SAF checkpoint's scores: the partner's own row follows the run's, then the averaged
    row, named ``A + B``, with the members' loss, seed and options and a config id of its own
    (``averaged_config_id``), so that report groups the seeds of one pairing. The two networks'
    scores are computed once for the three rows.

    ``rescore`` (``rescore.RescorePlan``): each evaluated run's row is followed by one row per
    correction (``RunEvaluator.rescored_rows``: ``RUN + METHOD``); not with ``kept`` or ``average_with``.

    ``member``: each run of networks trained together (its row's ``ensemble`` over 1) is followed by
    the row of its network ``member`` alone, named ``RUN,member=K`` (ensemble 1, the ``member``
    column K; kept as any row when unchanged); a run of one network has its own row only."""
    result = BatchResult()
    run_dirs = [Path(p) for p in run_dirs]
    if kept and average_with:
        raise VseError("keeping evaluated rows does not go with averaging runs: evaluate the pairs again")
    if rescore and (kept or average_with):
        raise VseError("re-scoring (--rescore) does not go with kept rows or averaged runs")
    if member is not None and (average_with or rescore):
        raise VseError("one network of co-trained ones (--member) goes without averaged or re-scored runs")
    kept = {row.get("run"): row for row in kept}
    partners = {run_dir: [Path(d) / run_dir.name for d in average_with] for run_dir in run_dirs}
    members = list(dict.fromkeys([*run_dirs, *(p for ps in partners.values() for p in ps)]))
    names = dict(zip(members, run_names(members))) if members else {}
    with RunEvaluator(device, split, protocol, features, relevance, cs_ks, judgments,
                      text_features, rescore) as evaluator:

        def evaluated(run_dir, i, member=None):
            name = names[run_dir] + ("" if member is None else f",{MEMBER}={member}")
            earlier = kept.get(name)
            if earlier is not None and _unchanged(earlier, evaluator, run_dir, checkpoint, member):
                row = {**earlier, **describe_config(read_config(run_dir), read_code_identity(run_dir)),
                       "epochs_to_best": epochs_to_best(read_validation_log(run_dir))}
                result.rows.append(row)
                result.kept += 1
                echo(f"[{i}/{len(run_dirs)}] {row['run']}: rsum {row['rsum']:.1f} (kept: checkpoint and "
                     "evaluation unchanged)")
                return None
            try:
                embedded = evaluator.embed(run_dir, checkpoint, member=member)
                row = {"run": name, **evaluator.row(run_dir, *embedded, member=member)}
            except Exception as exc:  # a VseError or a user's network's: skipped; a bug of vse: raised
                error = user_code_error(exc)
                if error is None:
                    raise
                result.skipped.append(Skipped(run_dir, str(error)))
                echo(f"[{i}/{len(run_dirs)}] skipped {name}: {error}")
                return None
            result.rows.append(row)
            echo(f"[{i}/{len(run_dirs)}] {row['run']}: rsum {row['rsum']:.1f}")
            if evaluator.rescore:  # a refusal of the plan (a bank larger than the split) stops the command
                for rescored in evaluator.rescored_rows(embedded, row):
                    result.rows.append(rescored)
                    echo(f"[{i}/{len(run_dirs)}] {rescored['run']}: rsum {rescored['rsum']:.1f}")
            return embedded, row

        for i, run_dir in enumerate(run_dirs, 1):
            before = len(result.rows)
            own = evaluated(run_dir, i)
            if member is not None:  # its network alone beside it, when it holds several
                if len(result.rows) > before and (result.rows[before].get(ENSEMBLE) or 1) > 1:
                    evaluated(run_dir, i, member)
                continue
            if own is None or not partners[run_dir]:
                continue
            group = [own]
            for partner in partners[run_dir]:
                if not is_run_dir(partner):
                    reason = f"no run {run_dir.name} in {partner.parent} to average with"
                    result.skipped.append(Skipped(run_dir, reason))
                    echo(f"[{i}/{len(run_dirs)}] skipped the average of {names[run_dir]}: {reason}")
                    break
                group.append(evaluated(partner, i))
                if group[-1] is None:
                    break
            else:
                try:
                    row = averaged_row(evaluator, group)
                except VseError as exc:
                    result.skipped.append(Skipped(run_dir, str(exc)))
                    echo(f"[{i}/{len(run_dirs)}] skipped the average of {names[run_dir]}: {exc}")
                    continue
                result.rows.append(row)
                echo(f"[{i}/{len(run_dirs)}] {row['run']}: rsum {row['rsum']:.1f}")
    return result


# the columns of a fresh row that a kept row must hold a value in (besides the metrics): what the
# model and its cache said, which a kept row does not read again
KEPT_COLUMNS = ("train_set", "features", "split", "protocol", "images", "checkpoint", "checkpoint_iteration",
                "checkpoint_sha256", "evaluation_id", precision.COLUMN, ENSEMBLE)


def _unchanged(row: dict, evaluator: RunEvaluator, run_dir: Path, checkpoint: str,
               member: int | None = None) -> bool:
    """An earlier row still holds this checkpoint's numbers under this evaluation, complete: every
    column a fresh evaluation writes is there with a value (a row with a metric removed or emptied
    is evaluated again), the checkpoint's bytes and the evaluation (its inputs' contents included)
    are the same."""
    checkpoint_path = run_dir / checkpoint
    needed = (*KEPT_COLUMNS, *evaluator.fresh_metric_keys(row.get("images")))
    complete = all(row.get(key) is not None for key in needed)
    return (complete and row.get("checkpoint") == str(checkpoint_path) and checkpoint_path.is_file()
            and row.get("evaluation_id") == evaluator.run_evaluation_id(run_dir, checkpoint, member)
            and row.get("checkpoint_sha256") == file_sha256(checkpoint_path))


def input_fingerprint(path) -> str | None:
    """The identity of an input file's content (None: no such file). A file whose format stores one
    (feature caches and caption-feature files: ``config_fingerprint``, what they were computed from,
    and ``created``; an imported cache also its arrays' ``external_identity``) is known by its stored
    attributes, read in a moment whatever its size; any other file (relevance files, judgments, a
    token file) by the sha256 of its bytes."""
    path = Path(path)
    if not path.is_file():
        return None
    stored = _stored_identity(path)
    return stored if stored is not None else file_sha256(path)


def _stored_identity(path: Path) -> str | None:
    import hashlib

    import h5py

    try:
        with h5py.File(path, "r") as f:
            attrs = {key: str(value) for key, value in f.attrs.items()}
    except OSError:  # not HDF5
        return None
    if "config_fingerprint" not in attrs or "created" not in attrs:
        return None
    return "stored:" + hashlib.sha256(json.dumps(attrs, sort_keys=True).encode()).hexdigest()


def averaged_config_id(config_ids) -> str:
    """The config id of an average of runs: equal for the seeds of one pairing of configurations."""
    import hashlib

    return hashlib.sha256(json.dumps(["averaged", *config_ids]).encode()).hexdigest()[:12]


def averaged_row(evaluator: RunEvaluator, group) -> dict:
    """The results row of the mean of several runs' split scores. ``group``: (``embed``'s values,
    row) of each run, the first one's features and description kept; its ensemble is the sum of the
    runs' (each one's networks, e.g. SGRAF: an SGR and an SAF network, 2)."""
    from pipeline.evaluation.evaluate import average_scores

    (first_embedded, first_row) = group[0]
    checkpoints = [embedded[2] for embedded, _ in group]
    emb = average_scores([embedded[0] for embedded, _ in group], checkpoints)
    metrics = evaluator.metrics(emb, first_embedded[3])
    described = {key: first_row.get(key) for key in RUN_COLUMNS
                 if key not in ("run", "checkpoint", "checkpoint_iteration", "epochs_to_best",
                                "best_val_mrecall", "config_id", code_identity.COLUMN, "noise_true_rate",
                                "checkpoint_sha256", ENSEMBLE, MEMBER)}
    return {"run": " + ".join(row["run"] for _, row in group), **described,
            "checkpoint": " + ".join(map(str, checkpoints)), "images": len(emb.images),
            "config_id": averaged_config_id([row.get("config_id") for _, row in group]),
            # the members' code: one code_id, or each one's ("a+b": other code than either alone)
            code_identity.COLUMN: "+".join(dict.fromkeys(str(row.get(code_identity.COLUMN) or "")
                                                         for _, row in group)),
            ENSEMBLE: sum(row.get(ENSEMBLE) or 1 for _, row in group),  # each member's networks
            **{k: float(v) for k, v in metrics.items()}}


def validation_rows(run_dirs) -> list[dict]:
    """Rows like results.csv's but from training alone: each run's config and its best
    validation record (runs with neither are left out). For plots without a test pass."""
    from pipeline.training.run_folder import read_config

    run_dirs = [Path(p) for p in run_dirs]
    rows = []
    for name, run_dir in zip(run_names(run_dirs) if run_dirs else [], run_dirs):
        config, records = read_config(run_dir), read_validation_log(run_dir)
        if not config and not records:
            continue
        best = best_record(records) or {}
        rows.append({"run": name, **describe_config(config, read_code_identity(run_dir)),
                     "epochs_to_best": epochs_to_best(records),
                     **{k: best.get(k) for k in metric_keys("recall", "sum")}})
    return rows


def _noise_columns(best: dict | None) -> dict:
    """A run on noisy pairs: its true noise rate, and the division at the best epoch (the one its
    best.pt holds), when its method divides."""
    if best is None or "noise_true_rate" not in best:
        return {}
    keys = ("noise_true_rate", "division_auc", "division_precision", "division_recall")
    return {key: best[key] for key in keys if best.get(key) is not None}
