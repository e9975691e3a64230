"""Human relevance judgments: readers, caption keys, matching, metrics checked against scipy
and by hand, and the CLI (`vse evaluate --judgments`, `vse report --columns human`,
`vse gallery --judgments`, `vse relevance-human`)."""

import math

import numpy as np
import pytest
from conftest import DEMO_DATA, SHARED_FLICKR8K, vse
from scipy.stats import kendalltau, spearmanr

from pipeline.core.errors import VseError
from pipeline.data.caption_index import caption_keys
from pipeline.evaluation.judgments import (
    SplitIdentity,
    auc,
    check_caption_keys,
    grouped_kendall_tau_b,
    grouped_ndcg,
    human_metrics,
    match_judgments,
    read_judgments,
)

IDS = ["a.jpg", "b.jpg", "c.jpg"]
KEYS = [f"{i}#{n}" for i in IDS for n in range(5)]
# (image, caption key, yes, no): a.jpg judged against 5 captions, b.jpg against 4, c.jpg against 2
VOTES = [("a.jpg", "a.jpg#1", 3, 0), ("a.jpg", "b.jpg#0", 2, 1), ("a.jpg", "c.jpg#3", 0, 3),
         ("a.jpg", "b.jpg#2", 1, 2), ("a.jpg", "c.jpg#0", 2, 1),
         ("b.jpg", "a.jpg#1", 0, 3), ("b.jpg", "b.jpg#0", 2, 2), ("b.jpg", "c.jpg#3", 1, 3),
         ("b.jpg", "a.jpg#4", 3, 1),
         ("c.jpg", "a.jpg#1", 0, 3), ("c.jpg", "b.jpg#0", 3, 0)]
EXPERT = [(img, key, min(4, 1 + yes), min(4, 1 + yes), max(1, yes)) for img, key, yes, no in VOTES]


def crowdflower_text(votes=VOTES):
    return "".join(f"{i}\t{k}\t{y / (y + n):.15g}\t{y}\t{n}\n" for i, k, y, n in votes)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def judgment_files(tmp_path):
    """The same pairs in the three formats."""
    return {
        "flickr8k-crowdflower": write(tmp_path, "cf.txt", crowdflower_text()),
        "flickr8k-expert": write(tmp_path, "expert.txt",
                                 "".join(f"{i}\t{k}\t{a}\t{b}\t{c}\n" for i, k, a, b, c in EXPERT)),
        "csv": write(tmp_path, "j.csv", "image,caption_key,grade\n"
                     + "".join(f"{i},{k},{y / (y + n)}\n" for i, k, y, n in VOTES)),
    }


# ---------------------------------------------------------------------------- readers


def test_the_three_formats_read_the_same_pairs(judgment_files):
    cf = read_judgments(judgment_files["flickr8k-crowdflower"], "flickr8k-crowdflower")
    expert = read_judgments(judgment_files["flickr8k-expert"], "flickr8k-expert")
    table = read_judgments(judgment_files["csv"], "csv")
    for j in (cf, expert, table):
        assert j.image_ids == [v[0] for v in VOTES] and j.caption_keys == [v[1] for v in VOTES]
    fractions = np.array([y / (y + n) for _, _, y, n in VOTES])
    assert np.array_equal(cf.grades, fractions) and np.array_equal(cf.gains, fractions)
    assert np.allclose(table.grades, fractions, rtol=0, atol=1e-15)
    # crowdflower: accepted at fraction yes >= 0.5 (2 yes of 4 counts as accepted)
    assert cf.accepted.tolist() == [True, True, False, False, True, False, True, False, True, False, True]
    assert table.accepted.tolist() == cf.accepted.tolist()
    marks = np.array([e[2:] for e in EXPERT], dtype=float)
    assert np.allclose(expert.grades, marks.mean(axis=1))
    assert np.allclose(expert.gains, (marks.mean(axis=1) - 1) / 3)
    assert expert.accepted.tolist() == (marks.mean(axis=1) >= 3).tolist()
    assert read_judgments(judgment_files["flickr8k-crowdflower"], threshold=0.7).accepted.sum() == 3
    assert cf.lines.tolist() == list(range(1, 12)) and table.lines.tolist() == list(range(2, 13))


@pytest.mark.parametrize("fmt, text, problem", [
    ("flickr8k-crowdflower", "a.jpg\ta.jpg#1\t1\t3\n", "line 1: expected 5 tab-separated fields"),
    ("flickr8k-crowdflower", "a.jpg\ta.jpg#1\t1\t3\t0\nb.jpg\tb.jpg#x\t1\t3\t0\n",
     "line 2: caption key 'b.jpg#x'"),
    ("flickr8k-crowdflower", "\na.jpg\ta.jpg#1\t0.5\t3\t0\n",
     "line 2: fraction yes 0.5 disagrees with 3 yes / 0 no"),
    ("flickr8k-crowdflower", "a.jpg\ta.jpg#1\tnan\t3\t0\n", "line 1: fraction yes 'nan' is not finite"),
    ("flickr8k-crowdflower", "a.jpg\ta.jpg#1\t1\t-3\t0\n", "line 1: yes '-3' is not a non-negative integer"),
    ("flickr8k-crowdflower", "a.jpg\ta.jpg#1\t0\t0\t0\n", "line 1: no votes"),
    ("flickr8k-crowdflower", "a.jpg\ta.jpg#1\t1\t3\t0\na.jpg\ta.jpg#1\t1\t3\t0\n",
     "line 2: pair a.jpg / a.jpg#1 is already judged on line 1"),
    ("flickr8k-expert", "a.jpg\ta.jpg#1\t4\t5\t4\n", "line 1: expert grades must be 1-4"),
    ("flickr8k-expert", "a.jpg\ta.jpg#1\t4\t4\n", "line 1: expected 5 tab-separated fields"),
    ("csv", "image,caption,grade\na.jpg,a.jpg#1,1\n", "line 1: expected the header image,caption_key,grade"),
    ("csv", "image,caption_key,grade\na.jpg,a.jpg#1,1\n,a.jpg#2,1\n", "line 3: empty image id"),
    ("csv", "image,caption_key,grade\na.jpg,a.jpg#1,high\n", "line 2: grade 'high' is not a number"),
    ("csv", "image,caption_key,grade\na.jpg,a.jpg#1,-1\n", "line 2: grade -1 is negative"),
    ("csv", "image,caption_key,grade\na.jpg,a.jpg#1,1,2\n", "line 2: expected 3 fields"),
    ("csv", "image,caption_key,grade\na.jpg,a.jpg#1,3\n", "grades go beyond 1: say which grade"),
    ("csv", "image,caption_key,grade\n", "no judged pairs"),
])
def test_bad_rows_are_one_line_errors_naming_file_and_line(tmp_path, fmt, text, problem):
    path = write(tmp_path, "bad.txt", text)
    with pytest.raises(VseError) as err:
        read_judgments(path, fmt)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message


def test_unreadable_files_are_one_line_errors(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("a.jpg\t\xe9#1\t1\t3\t0\n".encode("latin-1"))
    for path, problem in ((tmp_path / "absent.txt", "not found"), (tmp_path, "is a folder"),
                          (tmp_path / "latin1.txt", "not UTF-8")):
        with pytest.raises(VseError, match=problem):
            read_judgments(path)
    with pytest.raises(VseError, match="unknown judgments format"):
        read_judgments(tmp_path / "latin1.txt", "tsv")
    assert read_judgments(write(tmp_path, "ok.csv", "image,caption_key,grade\na,a#0,3\n"), "csv",
                          threshold=2).accepted.tolist() == [True]


# ---------------------------------------------------------------------------- caption keys


def test_caption_keys_rebuild_the_token_file_of_the_demo_data():
    from pipeline.data.readers import load_dataset

    ds = load_dataset("flickr8k", DEMO_DATA)
    keys = caption_keys(ds.image_ids, ds.caption_image)
    file_keys = [line.split("\t")[0] for line in
                 (DEMO_DATA / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()]
    assert keys == file_keys  # the subset's rows are the official rows, in the official order
    identity = SplitIdentity(ds.image_ids, keys, ds.captions)
    assert check_caption_keys(identity, DEMO_DATA / "Flickr8k.token.txt") == 5000


@pytest.mark.skipif(not SHARED_FLICKR8K.is_dir(), reason="full Flickr8k not present")
def test_caption_keys_rebuild_the_full_token_file_and_every_crowdflower_pair_matches():
    from pipeline.data.readers import load_dataset

    ds = load_dataset("flickr8k", SHARED_FLICKR8K)
    keys = caption_keys(ds.image_ids, ds.caption_image)
    file_keys = [line.split("\t")[0] for line in
                 (SHARED_FLICKR8K / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()]
    assert keys == [k for k in file_keys if not k.startswith("2258277193_586949ec62.jpg.1#")]
    test = ds.subset("test")
    identity = SplitIdentity(test.image_ids, caption_keys(test.image_ids, test.caption_image), test.captions)
    judgments = read_judgments(SHARED_FLICKR8K / "CrowdFlowerAnnotations.txt")
    matched = match_judgments(judgments, identity)
    assert (len(judgments), len(matched.image), matched.unmatched) == (47830, 47830, 0)
    assert check_caption_keys(identity, SHARED_FLICKR8K / "Flickr8k.token.txt", matched.keys) == 1000
    assert int(matched.accepted.sum()) == 2731  # fraction yes >= 0.5


def test_keys_follow_each_images_captions_in_list_order_and_a_reordering_is_caught(tmp_path):
    assert caption_keys(["x", "y"], [1, 0, 1, 0, 1]) == ["y#0", "x#0", "y#1", "x#1", "y#2"]
    token = write(tmp_path, "token.txt", "x#0\tone\nx#1\ttwo\ny#0\tthree\n")
    in_order = SplitIdentity(["x", "y"], ["x#0", "x#1", "y#0"], ["one", "two", "three"])
    assert check_caption_keys(in_order, token) == 3
    swapped = SplitIdentity(["x", "y"], ["x#0", "x#1", "y#0"], ["two", "one", "three"])
    with pytest.raises(VseError, match="caption x#0 is 'one' here but 'two'"):
        check_caption_keys(swapped, token)


def test_pairs_outside_the_split_are_counted_and_a_file_matching_nothing_is_an_error(judgment_files):
    judgments = read_judgments(judgment_files["flickr8k-crowdflower"])
    # the split holds a.jpg and b.jpg only
    identity = SplitIdentity(IDS[:2], KEYS[:10])
    matched = match_judgments(judgments, identity)
    assert len(matched.image) == 6 and matched.unmatched == 5
    assert (matched.missing_image, matched.missing_caption) == (2, 3)  # c.jpg judging; c.jpg captions judged
    assert "6 of 11 judged pairs in the split; 5 left out" in matched.summary()
    with pytest.raises(VseError, match="none of its 11 judged pairs is in the evaluated split"):
        match_judgments(judgments, SplitIdentity(["z.jpg"], ["z.jpg#0"]))


# ---------------------------------------------------------------------------- metrics


def test_grouped_tau_b_agrees_with_scipy_on_ties_and_leaves_out_small_or_flat_groups():
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 30, 400)
    x = rng.integers(0, 6, 400).astype(float)  # many ties in the scores
    y = rng.integers(0, 4, 400) / 3
    groups[:2], y[groups == 7] = 99, 0.5  # group 99: 2 items; group 7: one grade only
    ids, tau = grouped_kendall_tau_b(groups, x, y)
    for g, t in zip(ids, tau):
        m = groups == g
        if g in (7, 99):
            assert math.isnan(t)
        else:
            assert t == pytest.approx(kendalltau(x[m], y[m]).statistic, abs=1e-12)
    flat = grouped_kendall_tau_b(np.zeros(4), np.ones(4), np.arange(4))[1]
    assert math.isnan(flat[0]) and math.isnan(kendalltau(np.ones(4), np.arange(4)).statistic)


def test_ndcg_by_hand_with_ties_against_the_query():
    # one query, four judged candidates: scores 3, 2, 2, 1 and gains 0, 1, 1/3, 1/3
    ids, ndcg = grouped_ndcg([0, 0, 0, 0], [3, 2, 2, 1], [0, 1, 1 / 3, 1 / 3], k=3)
    # ranked (ties: lower gain first): 0, 1/3, 1 ; ideal: 1, 1/3, 1/3
    dcg = 0 + (1 / 3) / math.log2(3) + 1 / math.log2(4)
    idcg = 1 + (1 / 3) / math.log2(3) + (1 / 3) / math.log2(4)
    assert ndcg[0] == pytest.approx(dcg / idcg, abs=1e-12)
    ids, ndcg = grouped_ndcg([5, 5, 6], [1, 2, 3], [0, 0, 2], k=10)
    assert ids.tolist() == [5, 6] and math.isnan(ndcg[0]) and ndcg[1] == 1.0


def test_map_at_r_by_hand():
    """Musgrave et al.'s mAP@R: matches at ranks 1 and 3 of R = 2 → (1/1 + 0) / 2; R-precision 1/2.
    A tie puts the match after the non-match (against the query)."""
    import torch

    from pipeline.evaluation.judgments.metrics import plausible_ranks

    scores = torch.tensor([[0.9, 0.8, 0.7], [0.5, 0.5, 0.1], [0.3, 0.2, 0.1]])
    match = torch.tensor([[True, False, True], [True, False, False], [False, True, True]])
    rank, rprec, map_r = plausible_ranks(scores, match)
    assert rank.tolist() == [0, 1, 1]
    assert rprec.tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert map_r.tolist() == pytest.approx([0.5, 0.0, 0.25])  # row 3: a match at 2 of R = 2 → (1/2) / 2


@pytest.mark.filterwarnings("ignore:failed to import `ujson`")  # eccv_caption's import, harmless
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_at_r_and_r_precision_match_eccv_caption(seed):
    """Golden: ECCV Caption's own functions (eccv-caption 0.1.0, ``compute_eccv_metrics``) on the
    same rankings — random scores without ties, 1 to 12 positives per query over a gallery of 60."""
    import torch
    from eccv_caption._metrics import compute_eccv_metrics

    from pipeline.evaluation.judgments.metrics import plausible_ranks

    gen = torch.Generator().manual_seed(seed)
    queries, gallery = 40, 60
    scores = torch.randperm(queries * gallery, generator=gen).reshape(queries, gallery).double()  # no ties
    counts = torch.randint(1, 13, (queries,), generator=gen)
    match = torch.zeros(queries, gallery, dtype=torch.bool)
    for q in range(queries):
        match[q, torch.randperm(gallery, generator=gen)[:counts[q]]] = True
    _, rprec, map_r = plausible_ranks(scores, match)
    ranked = {q: torch.argsort(scores[q], descending=True).tolist() for q in range(queries)}
    positives = {q: torch.nonzero(match[q])[:, 0].tolist() for q in range(queries)}
    theirs = compute_eccv_metrics(ranked, positives)
    # ours divides in torch's default float32; theirs in float64: equal to float32's precision
    assert float(map_r.mean()) == pytest.approx(theirs["eccv_map_at_r"], rel=1e-6)
    assert float(rprec.mean()) == pytest.approx(theirs["eccv_rprecision"], rel=1e-6)


def test_auc_is_the_mann_whitney_probability():
    scores, positive = [0.9, 0.5, 0.5, 0.1, 0.7], [True, True, False, False, False]
    # pairs (pos, neg): 0.9 beats all 3; 0.5 ties 0.5 (1/2), beats 0.1, loses to 0.7
    assert auc(scores, positive) == pytest.approx((3 + 1.5) / 6)
    assert math.isnan(auc([1, 2], [True, True]))


def embeddings():
    """3 images, 15 captions with small integer coordinates: every score is exact."""
    rng = np.random.default_rng(0)
    images = rng.integers(-2, 3, (3, 4)).astype(np.float32)
    captions = rng.integers(-2, 3, (15, 4)).astype(np.float32)
    return images, captions, np.repeat(np.arange(3), 5)


def brute_force(scores, matches):
    """Rank of the best match and R-precision, one query, by sorting (ties against the query)."""
    order = sorted(range(len(scores)), key=lambda c: (-scores[c], c in matches))
    rank = min(order.index(m) for m in matches)
    best = max(scores[m] for m in matches)
    rank = sum(1 for c in order[:rank + 1] if c not in matches and scores[c] >= best)
    top = order[:len(matches)]
    hits = np.cumsum([c in matches for c in top])
    map_r = sum(hits[i] / (i + 1) for i, c in enumerate(top) if c in matches) / len(matches)
    return rank, sum(c in matches for c in top) / len(matches), map_r


def test_human_metrics_against_scipy_and_brute_force(judgment_files):
    images, captions, caption_image = embeddings()
    judgments = read_judgments(judgment_files["flickr8k-crowdflower"])
    matched = match_judgments(judgments, SplitIdentity(IDS, KEYS))
    got = human_metrics(images, captions, caption_image, matched, ndcg_ks=(2, 10))
    scores = images.astype(np.float64) @ captions.T.astype(np.float64)
    pair = scores[matched.image, matched.caption]
    assert got["human_spearman"] == pytest.approx(spearmanr(pair, matched.grades).statistic, abs=1e-12)
    accepted = set(zip(matched.image[matched.accepted].tolist(), matched.caption[matched.accepted].tolist()))
    for direction, queries, table in (("i2t", matched.image, scores), ("t2i", matched.caption, scores.T)):
        taus, ranks, rprecs, ndcgs, maps = [], [], [], [], []
        for q in np.unique(queries):
            m = queries == q
            grades = matched.grades[m]
            if m.sum() >= 3 and len(set(grades)) >= 2:
                taus.append(kendalltau(pair[m], grades).statistic)
            if direction == "i2t":
                gt = {c for c in range(15) if caption_image[c] == q} | {c for i, c in accepted if i == q}
            else:
                gt = {caption_image[q]} | {i for i, c in accepted if c == q}
            rank, rprec, map_r = brute_force(list(table[q]), gt)
            ranks.append(rank)
            rprecs.append(rprec)
            maps.append(map_r)
            gains = matched.gains[m][np.lexsort((matched.gains[m], -pair[m]))][:2]
            ideal = np.sort(matched.gains[m])[::-1][:2]
            discount = 1 / np.log2(np.arange(2, len(gains) + 2))
            if ideal.sum() > 0:
                ndcgs.append(gains @ discount / (ideal @ discount))
        assert got[f"human_{direction}_tau"] == pytest.approx(np.mean(taus), abs=1e-12)
        assert got[f"human_{direction}_tau_queries"] == len(taus)
        assert got[f"human_{direction}_ndcg@2"] == pytest.approx(np.mean(ndcgs), abs=1e-12)
        for k in (1, 5, 10):
            assert got[f"human_{direction}_r@{k}"] == pytest.approx(100 * np.mean(np.array(ranks) < k))
        assert got[f"human_{direction}_rprec"] == pytest.approx(100 * np.mean(rprecs))
        assert got[f"human_{direction}_map@r"] == pytest.approx(100 * np.mean(maps))
    assert got["human_i2t_queries"] == 3 and got["human_t2i_queries"] == 6
    assert got["human_i2t_tau_queries"] == 2  # c.jpg has only 2 judged captions
    assert got["human_pairs"] == 11 and got["human_unmatched"] == 0
    # blocks of one query give the same numbers
    assert human_metrics(images, captions, caption_image, matched, ndcg_ks=(2, 10), block=1) == \
        pytest.approx(got, nan_ok=True)


def test_a_constant_model_gets_no_plausible_recall(judgment_files):
    matched = match_judgments(read_judgments(judgment_files["csv"], "csv"), SplitIdentity(IDS, KEYS))
    got = human_metrics(np.ones((3, 2)), np.ones((15, 2)), np.repeat(np.arange(3), 5), matched)
    assert got["human_i2t_r@1"] == 0
    # of the 6 judged captions only b.jpg#0 has no non-match: all 3 images accepted it (or own it)
    assert got["human_t2i_r@1"] == pytest.approx(100 / 6)
    assert math.isnan(got["human_i2t_tau"]) and math.isnan(got["human_spearman"])


# ---------------------------------------------------------------------------- commands


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory):
    """A tiny mh run on 40 real demo images (dataset_root = data/, so caption keys are checked
    against its token file) and a csv of judgments: test-image pairs plus 3 pairs outside."""
    from conftest import demo_captions, learnable_features, write_feature_cache

    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    root = tmp_path_factory.mktemp("judged")
    ids, captions = demo_captions(40)
    caption_image = np.repeat(np.arange(40), 5)
    cache = write_feature_cache(root / "tiny.h5", learnable_features(captions, caption_image, 40), captions,
                                caption_image, {"train": np.arange(24), "dev": np.arange(24, 32),
                                                "test": np.arange(32, 40)},
                                image_ids=ids, dataset_root=str(DEMO_DATA))
    config = TrainConfig(features=str(cache), run_dir=str(root / "runs" / "mh"), loss="mh", epochs=1,
                         embed_dim=16, word_dim=8, batch_size=16, lr=5e-3, min_word_count=1, val_every=0)
    build_trainer(config, echo=lambda *a: None).fit()
    rng = np.random.default_rng(1)
    lines = ["image,caption_key,grade"]
    for q in range(32, 40):
        for c in rng.choice(np.arange(32, 40), 5, replace=False):
            lines.append(f"{ids[q]},{ids[c]}#{rng.integers(5)},{rng.integers(4) / 3:.4f}")
    lines += [f"{ids[0]},{ids[33]}#0,1", f"{ids[33]},{ids[1]}#2,0", f"{ids[2]},{ids[3]}#0,1"]
    judgments = write(root, "judged.csv", "\n".join(dict.fromkeys(lines)) + "\n")
    return root / "runs" / "mh" / "best.pt", cache, judgments


def test_evaluate_checkpoint_and_npz_and_runs_give_the_same_human_columns(judged_run, tmp_path):
    import json

    from pipeline.core.runtime import resolve_device
    from pipeline.evaluation.evaluate import embed_checkpoint
    from pipeline.reports.report import read_results

    checkpoint, cache, judgments = judged_run
    common = ["--judgments", judgments, "--judgments-format", "csv", "--device", "cpu"]
    single = vse("evaluate", "--checkpoint", checkpoint, "--features", cache, "--json", *common)
    assert single.exit_code == 0, single.output
    got = json.loads(single.stdout)
    total = len(judgments.read_text().splitlines()) - 1
    assert got["human_pairs"] == total - 3 and got["human_unmatched"] == 3
    assert f"judgments: {total - 3} of {total} judged pairs in the split; 3 left out" in single.stderr
    # the npz route (rows named by image_ids / caption_keys) gives the same numbers
    emb = embed_checkpoint(checkpoint, cache, "test", resolve_device("cpu"))
    from pipeline.data.cache import FeatureCache

    with FeatureCache(cache) as c:
        keys = caption_keys(c.image_ids, c.caption_image)
        npz = tmp_path / "emb.npz"
        np.savez(npz, images=emb.images, captions=emb.captions,
                 image_ids=np.array([c.image_ids[r] for r in emb.image_rows]),
                 caption_keys=np.array([keys[r] for r in emb.caption_rows]))
    from_npz = vse("evaluate", "--embeddings", npz, "--json", *common)
    assert from_npz.exit_code == 0, from_npz.output
    ensemble = got.pop("ensemble")  # an npz does not say how many networks made it
    assert ensemble == 1 and json.loads(from_npz.stdout) == pytest.approx(got, abs=1e-6, nan_ok=True)
    table = vse("evaluate", "--embeddings", npz, *common)
    assert "human judgments:" in table.stdout and "image→text  tau" in table.stdout
    # batch evaluation: the same human_* columns in results.csv, and `vse report --columns human`
    out = tmp_path / "results.csv"
    batch = vse("evaluate", "--runs", checkpoint.parent, "--out", out, *common)
    assert batch.exit_code == 0, batch.output
    row = read_results(out)[0]
    assert {k: v for k, v in row.items() if k.startswith("human_")} == \
        pytest.approx({k: v for k, v in got.items() if k.startswith("human_")}, abs=1e-6, nan_ok=True)
    report = vse("report", out, "--columns", "human")
    assert report.exit_code == 0, report.output
    header = report.stdout.splitlines()[0]
    for column in ("Caption (human) tau", "Caption (human) NDCG@10", "Image (human) R@5", "Image (human) R-P",
                   "Spearman", "rsum"):
        assert column in header
    assert f"{row['human_i2t_tau']:.3f}" in report.stdout and f"{row['human_t2i_r@10']:.1f}" in report.stdout


def test_judgment_errors_are_one_line(judged_run, tmp_path):
    checkpoint, cache, _ = judged_run
    elsewhere = write(tmp_path, "elsewhere.txt", "x.jpg\tx.jpg#0\t1\t3\t0\n")
    result = vse("evaluate", "--checkpoint", checkpoint, "--features", cache, "--judgments", elsewhere)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: {elsewhere}: none of its 1 judged pairs is in the evaluated split (8 images, e.g. "
        f"{demo_ids()[32]}; first pair x.jpg / x.jpg#0)"]
    bare = tmp_path / "bare.npz"
    np.savez(bare, images=np.eye(2, 4), captions=np.ones((10, 4)))
    result = vse("evaluate", "--embeddings", bare, "--judgments", elsewhere)
    assert result.exit_code == 1 and "lacks image_ids, caption_keys" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = vse("evaluate", "--embeddings", bare, "--judgments-threshold", "2")
    assert result.exit_code == 2 and "--judgments-threshold goes with --judgments" in result.output


def demo_ids():
    from conftest import demo_captions

    return demo_captions(40)[0]


@pytest.mark.slow
def test_evaluate_an_rc_checkpoint_on_images_with_judgments(tmp_path):
    import json

    from rc_data import make_flickr8k

    from pipeline.core.config import TrainConfig
    from pipeline.data.readers import load_dataset
    from pipeline.training.build import build_trainer

    root = make_flickr8k(tmp_path / "f8k", sizes=(("train", 4), ("dev", 1), ("test", 3)))
    build_trainer(TrainConfig(rc=True, root=str(root), backbone="tiny", run_dir=str(tmp_path / "rc"),
                                    epochs=1,
                        embed_dim=16, word_dim=8, batch_size=4, min_word_count=1, val_every=0, workers=0),
            echo=lambda *a: None).fit()
    test = load_dataset("flickr8k", root).subset("test").image_ids
    rows = [(q, f"{c}#{n}", (q == c) + n % 2) for q in test for c in test for n in (0, 3)]
    judgments = write(tmp_path, "j.csv",
                      "image,caption_key,grade\n" + "".join(f"{q},{k},{g}\n" for q, k, g in rows))
    result = vse("evaluate", "--checkpoint", tmp_path / "rc" / "best.pt", "--root", root, "--json",
                  "--judgments", judgments, "--judgments-format", "csv", "--judgments-threshold", "1",
                  "--device", "cpu")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["human_pairs"] == 18 and got["human_unmatched"] == 0
    assert got["human_i2t_queries"] == 3 and got["human_t2i_queries"] == 6
    assert -1 <= got["human_i2t_tau"] <= 1 and 0 <= got["human_i2t_rprec"] <= 100


def test_gallery_marks_the_captions_people_accepted(judged_run, tmp_path):
    checkpoint, cache, judgments = judged_run
    out = tmp_path / "gallery.html"
    # every test image and caption as a query, every candidate shown: each accepted pair appears
    # once among an image's captions and once among a caption's images
    result = vse("gallery", "--checkpoint", checkpoint, "--features", cache, "--n", 40, "--k", 40,
                  "--judgments", judgments, "--judgments-format", "csv", "--device", "cpu", "--out", out)
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    read = read_judgments(judgments, "csv")
    ids = demo_ids()
    test_ids = set(ids[32:40])
    accepted_other = sum(1 for i, k, yes in zip(read.image_ids, read.caption_keys, read.accepted)
                         if yes and i in test_ids and k.split("#")[0] in test_ids and k.split("#")[0] != i)
    assert accepted_other > 0
    assert page.count('<li class="human">') == accepted_other
    assert page.count('class="result human"') == accepted_other
    assert "accepted by people" in page and "li.human, span.human {" in page
    plain = vse("gallery", "--checkpoint", checkpoint, "--features", cache, "--device", "cpu",
                 "--out", tmp_path / "plain.html")
    assert plain.exit_code == 0 and 'class="human"' not in (tmp_path / "plain.html").read_text()


def test_relevance_methods_scored_by_people_follow_the_ladder_rule(judged_run, tmp_path):
    import json

    from sklearn.metrics import roc_auc_score

    from pipeline.data.cache import FeatureCache
    from pipeline.relevance import build_relevance, read_relevance

    _, cache, judgments = judged_run
    stored = tmp_path / "cbow.h5"
    build_relevance(cache, "cbow", stored, device="cpu")
    out = tmp_path / "human_relevance.json"
    result = vse("relevance-human", "--features", cache, "--method", "cbow", "--method", "svd", "--k", 20,
                  "--relevance", stored, "--judgments", judgments, "--judgments-format", "csv", "--json",
                  "--out", out, "--device", "cpu")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert json.loads(out.read_text()) == report and report["unmatched"] == 3
    methods = report["methods"]
    assert set(methods) == {"cbow", "svd", "cbow (cbow.h5)"}
    assert methods["cbow (cbow.h5)"] == pytest.approx(methods["cbow"], abs=1e-6, nan_ok=True)
    # by hand: relevance(q, p) = max over q's captions c != p of cos(v_c, v_p), from the stored vectors
    vectors = read_relevance(stored).vectors.astype(np.float64)
    with FeatureCache(cache) as c:
        keys = caption_keys(c.image_ids, c.caption_image)
        image_of = dict(zip(c.image_ids, range(len(c.image_ids))))
        caption_of = dict(zip(keys, range(len(keys))))
        own = {i: np.flatnonzero(c.caption_image == i) for i in range(len(c.image_ids))}
        test = set(c.split("test").tolist())
    read = read_judgments(judgments, "csv")
    rel, grades, accepted, images, other = [], [], [], [], []
    for image, key, grade, yes in zip(read.image_ids, read.caption_keys, read.grades, read.accepted):
        q, p = image_of[image], caption_of[key]
        if q not in test or c.caption_image[p] not in test:
            continue
        rel.append(max(vectors[cc] @ vectors[p] for cc in own[q] if cc != p))
        grades.append(grade), accepted.append(yes), images.append(q), other.append(c.caption_image[p] != q)
    rel, grades, accepted, images, other = map(np.array, (rel, grades, accepted, images, other))
    assert methods["cbow"]["pairs"] == len(rel)
    assert methods["cbow"]["auc"] == pytest.approx(roc_auc_score(accepted, rel), abs=1e-6)
    assert methods["cbow"]["auc_other"] == pytest.approx(roc_auc_score(accepted[other], rel[other]), abs=1e-6)
    assert methods["cbow"]["spearman"] == pytest.approx(spearmanr(rel, grades).statistic, abs=1e-6)
    taus = [kendalltau(rel[images == q], grades[images == q]).statistic for q in np.unique(images)
            if (images == q).sum() >= 3 and len(set(grades[images == q])) >= 2]
    assert methods["cbow"]["tau"] == pytest.approx(np.nanmean(taus), abs=1e-6)
    table = vse("relevance-human", "--features", cache, "--method", "cbow", "--judgments", judgments,
                 "--judgments-format", "csv", "--out", out, "--device", "cpu")
    assert table.exit_code == 0 and "| cbow |" in table.stdout
    foreign = write(tmp_path, "notes.json", "{}")
    refused = vse("relevance-human", "--features", cache, "--method", "cbow", "--judgments", judgments,
                   "--judgments-format", "csv", "--out", foreign)
    assert refused.exit_code == 1 and "--overwrite replaces it" in refused.output
    assert foreign.read_text() == "{}"


def test_relevance_human_out_refuses_a_foreign_file_and_replaces_its_own_report(judged_run, tmp_path):
    import json

    from pipeline.core.fsutil import output_format
    from pipeline.evaluation.relevance_human import REPORT_FORMAT
    from pipeline.relevance import build_relevance

    _, cache, judgments = judged_run
    stored = tmp_path / "cbow.h5"
    build_relevance(cache, "cbow", stored, device="cpu")
    out = tmp_path / "report.json"
    common = ["relevance-human", "--features", cache, "--judgments", judgments, "--judgments-format", "csv",
              "--device", "cpu", "--out", out]
    first = vse(*common, "--relevance", stored)
    assert first.exit_code == 0, first.output
    assert output_format(out) == REPORT_FORMAT
    report = json.loads(out.read_text())
    assert list(report)[:2] == ["format", "command"] and report["judgments_format"] == "csv"
    # its own earlier report is replaced
    again = vse(*common, "--relevance", stored, "--judgments-threshold", "0.9")
    assert again.exit_code == 0, again.output
    assert json.loads(out.read_text())["threshold"] == 0.9 and report["threshold"] == 0.5
    # anything else is refused, untouched, before any work; --overwrite replaces it
    for text in ("{}", '{"format": "vse-results"}\n', "notes\n"):
        out.write_text(text)
        refused = vse(*common, "--relevance", stored)
        assert refused.exit_code == 1 and out.read_text() == text
        kind = "format 'vse-results'" if "vse-results" in text else "a file vse did not write"
        assert refused.output.splitlines() == [
            f"error: {out}: exists and is not a vse relevance-human report ({kind}); --overwrite replaces it"]
    replaced = vse(*common, "--relevance", stored, "--overwrite")
    assert replaced.exit_code == 0 and json.loads(out.read_text())["format"] == REPORT_FORMAT
