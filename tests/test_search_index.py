"""`vse index` and `vse search`: the index folder, its recall, its refusals, queries by the CLI."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from search_fakes import (
    StandInEmbedder,
    clustered_unit_vectors,
    demo_embeddings,
    demo_items,
    png_bytes,
    unit_rows,
    write_embeddings,
)

from cli.main import cli
from pipeline.core.errors import VseError
from pipeline.core.fsutil import file_sha256, output_format
from pipeline.search import searcher as search_module
from pipeline.search.embeddings_file import EmbeddingsFile
from pipeline.search.index_build import ExactTopK, IndexOptions, build_index, recall_at
from pipeline.search.index_reader import FAISS_FILE, ITEMS_FILE, SearchIndex


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result


def one_line_error(result, *words):
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]  # after progress lines, if any
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in result.output, result.output
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.fixture()
def checkpoint(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"a stand-in checkpoint: its sha256 is the model's identity")
    return path


@pytest.fixture()
def demo(tmp_path, checkpoint):
    path, embedder = demo_embeddings(tmp_path / "demo.h5", checkpoint, n=12)
    return path, embedder


@pytest.fixture()
def standin(monkeypatch):
    """`load_embedder` returns the stand-in of the checkpoint (the seam the real one fills)."""
    made = []

    def load(checkpoint, device="auto", digest=None):
        made.append(str(checkpoint))
        return StandInEmbedder.for_checkpoint(checkpoint)

    monkeypatch.setattr(search_module, "load_embedder", load)
    return made


def clustered_file(path, checkpoint, n=3000, queries=300, dim=32, **kwargs):
    x = clustered_unit_vectors(n, dim, seed=0)
    q = clustered_unit_vectors(queries, dim, seed=1) if queries else None
    write_embeddings(path, checkpoint_sha256=file_sha256(checkpoint), checkpoint=checkpoint,
                     images=(x, [f"img{i}" for i in range(n)], [f"photos/{i}.jpg" for i in range(n)]),
                     captions=None if q is None else (q, [f"c{i}" for i in range(len(q))],
                                                      [f"caption {i}" for i in range(len(q))]), **kwargs)
    return x, q


def exact_top(vectors, queries, k):
    return np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :k]


# ---------------------------------------------------------------------------- building


def test_flat_index_records_its_source_and_finds_the_exact_neighbours(tmp_path, demo):
    embeddings, embedder = demo
    out = tmp_path / "idx"
    result = run("index", embeddings, "--out", out)
    assert result.exit_code == 0, result.output
    assert "12 images x 32, flat" in result.output and "exact" in result.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "vse-index" and output_format(out) == "vse-index"
    assert (meta["kind"], meta["kind_requested"], meta["of"], meta["count"], meta["dim"]) == \
        ("flat", "auto", "images", 12, 32)
    assert meta["checkpoint_sha256"] == embedder.checkpoint_sha256
    assert meta["embeddings"]["sha256"] == file_sha256(embeddings)
    assert meta["embeddings"]["image_pipeline"]["backbone"] == "stand-in"
    assert meta["files"][FAISS_FILE]["sha256"] == file_sha256(out / FAISS_FILE)
    assert meta["files"][ITEMS_FILE]["sha256"] == file_sha256(out / ITEMS_FILE)
    assert meta["recall"] == {"at": 10, "value": 1.0, "exact": True}
    assert meta["options"]["exact_below"] == 100_000

    index = SearchIndex(out)
    source = EmbeddingsFile(embeddings)
    vectors = np.concatenate([c for _, c in source.chunks("images")])
    queries = next(source.chunks("captions"))[1][:20]
    scores, rows = index.search(queries, 5)
    np.testing.assert_array_equal(rows, exact_top(vectors, queries, 5))
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ vectors.T, rows, axis=1), atol=1e-5)
    names, _ = demo_items(12)
    hits = index.hits(scores[0], rows[0])
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert hits[0]["id"] == names[rows[0, 0]] and hits[0]["path"] == names[rows[0, 0]]


def test_auto_builds_hnsw_from_exact_below_and_records_the_recall_it_reaches(tmp_path, checkpoint):
    x, q = clustered_file(tmp_path / "e.h5", checkpoint)
    out = tmp_path / "idx"
    result = run("index", tmp_path / "e.h5", "--out", out, "--exact-below", 1000)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kind"] == "hnsw" and meta["params"]["M"] == 32 and meta["params"]["ef_construction"] == 80
    recall = meta["recall"]
    # every caption was a query (300 < --recall-queries): the recorded value is recomputable
    assert recall["queries"] == 300 and recall["queries_from"] == "captions" and recall["tuned"]
    assert recall["value"] >= 0.95 and recall["target_met"]
    ef = meta["params"]["ef_search"]
    steps = {int(k): v for k, v in recall["by_ef_search"].items()}
    assert max(steps) == ef and all(v < 0.95 for s, v in steps.items() if s < ef)
    index = SearchIndex(out)
    assert index.index.hnsw.efSearch == ef
    _, rows = index.search(q, 10)
    assert recall_at(rows, exact_top(x, q, 10)) == pytest.approx(recall["value"], abs=1e-9)


def test_a_fixed_ef_search_is_measured_not_tuned(tmp_path, checkpoint):
    clustered_file(tmp_path / "e.h5", checkpoint, n=2000)
    result = run("index", tmp_path / "e.h5", "--out", tmp_path / "idx", "--kind", "hnsw", "--ef-search", 16,
                 "--hnsw-m", 8)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["params"] == {"M": 8, "ef_construction": 80, "ef_search": 16}
    assert list(meta["recall"]["by_ef_search"]) == ["16"] and not meta["recall"]["tuned"]
    if not meta["recall"]["target_met"]:
        assert "note: recall@10" in result.output and "below the target" in result.output


def test_without_the_other_group_the_queries_are_indexed_rows_that_skip_themselves(tmp_path, checkpoint):
    x, _ = clustered_file(tmp_path / "e.h5", checkpoint, n=1500, queries=0)
    build = build_index(tmp_path / "e.h5", tmp_path / "idx", IndexOptions(kind="hnsw", recall_queries=200))
    recall = build.meta["recall"]
    assert recall["queries"] == 200 and "own row excluded" in recall["queries_from"]
    assert recall["value"] >= 0.95
    # the same measurement by hand, on a different sample: each query's 10 nearest others
    rng = np.random.default_rng(5)
    own = rng.choice(len(x), 100, replace=False)
    index = SearchIndex(tmp_path / "idx")
    _, rows = index.search(x[own], 11)
    exact = exact_top(x, x[own], 11)
    strip = [lambda r, o=o: r[r != o][:10] for o in own]
    approx = np.stack([f(r) for f, r in zip(strip, rows)])
    truth = np.stack([f(r) for f, r in zip(strip, exact)])
    assert recall_at(approx, truth) >= 0.9


def test_ivfpq_trains_tunes_nprobe_and_says_when_the_target_is_out_of_reach(tmp_path, checkpoint):
    x, q = clustered_file(tmp_path / "e.h5", checkpoint, n=3000, dim=32)
    result = run("index", tmp_path / "e.h5", "--out", tmp_path / "idx", "--kind", "ivfpq", "--nlist", 16,
                 "--pq-m", 8)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    params = meta["params"]
    assert (params["nlist"], params["m"], params["nbits"], params["train_size"]) == (16, 8, 8, 3000)
    by = {int(k): v for k, v in meta["recall"]["by_nprobe"].items()}
    assert params["nprobe"] in by and max(by) <= 16
    index = SearchIndex(tmp_path / "idx")
    assert index.index.nprobe == params["nprobe"]
    _, rows = index.search(q, 10)
    assert recall_at(rows, exact_top(x, q, 10)) == pytest.approx(meta["recall"]["value"], abs=1e-9)
    if meta["recall"]["target_met"]:
        assert "below the target" not in result.output
    else:
        assert "note: recall@10" in result.output and "--kind hnsw" in result.output


def test_ivfpq_defaults_follow_the_data(tmp_path, checkpoint):
    from pipeline.search.index_build import resolved_params

    params = resolved_params("ivfpq", IndexOptions(), 1_000_000, 1024)
    assert (params["nlist"], params["m"], params["nbits"]) == (4096, 64, 8)
    assert params["train_size"] == 200_000
    assert resolved_params("ivfpq", IndexOptions(), 1_000_000, 1000)["m"] == 50  # a divisor of 1000
    with pytest.raises(VseError, match="needs at least 256 items"):
        resolved_params("ivfpq", IndexOptions(), 100, 64)
    with pytest.raises(VseError, match="does not divide"):
        resolved_params("ivfpq", IndexOptions(pq_m=7), 5000, 64)


def test_exact_top_k_in_chunks_equals_one_pass():
    rng = np.random.default_rng(0)
    x, q = unit_rows(rng.standard_normal((1000, 16))), unit_rows(rng.standard_normal((30, 16)))
    top = ExactTopK(q, 7)
    for start in range(0, 1000, 128):
        top.update(start, x[start:start + 128])
    np.testing.assert_array_equal(top.result(), exact_top(x, q, 7))
    assert recall_at(top.result(), exact_top(x, q, 7)) == 1.0
    assert recall_at(top.result()[:, ::-1], exact_top(x, q, 7)) == 1.0  # a set, not an order
    shifted = np.concatenate([top.result()[:, 1:], np.full((30, 1), -1)], axis=1)
    assert recall_at(shifted, exact_top(x, q, 7)) == pytest.approx(6 / 7)


def test_rows_are_read_in_the_order_asked_across_chunks(tmp_path, checkpoint, monkeypatch):
    import pipeline.search.embeddings_file as ef

    x, _ = clustered_file(tmp_path / "e.h5", checkpoint, n=50, queries=0)
    monkeypatch.setattr(ef, "CHUNK_ROWS", 7)
    source = EmbeddingsFile(tmp_path / "e.h5")
    assert [start for start, _ in source.chunks("images")] == list(range(0, 50, 7))
    wanted = [49, 3, 21, 20, 3, 0, 34]
    np.testing.assert_array_equal(source.rows("images", wanted), x[wanted])


def test_captions_can_be_indexed(tmp_path, demo):
    embeddings, _ = demo
    result = run("index", embeddings, "--out", tmp_path / "idx", "--of", "captions")
    assert result.exit_code == 0, result.output
    index = SearchIndex(tmp_path / "idx")
    _, captions = demo_items(12)
    assert index.of == "captions" and index.count == sum(len(c) for c in captions)
    hit = index.hits(*[a[0] for a in index.search(EmbeddingsFile(embeddings).rows("captions", [4]), 1)])[0]
    texts = [c for cs in captions for c in cs]
    assert hit["text"] == texts[4] and hit["score"] == pytest.approx(1, abs=1e-5)


def test_search_prints_the_captions_of_a_caption_index(tmp_path, demo, standin):
    embeddings, _ = demo
    assert run("index", embeddings, "--out", tmp_path / "idx", "--of", "captions").exit_code == 0
    _, captions = demo_items(12)
    result = run("search", tmp_path / "idx", "--text", captions[2][1], "-k", 3)
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0].split(maxsplit=3)
    assert first[:2] == ["1", "1.0000"] and first[3] == captions[2][1]
    assert len(result.output.splitlines()) == 3


def test_an_index_of_relative_paths_with_no_folder_known_says_so(tmp_path, demo):
    embeddings, _ = demo  # made without `vse embed`: no image_root recorded, paths relative
    result = run("index", embeddings, "--out", tmp_path / "idx")
    assert result.exit_code == 0, result.output
    assert "note: the image paths are relative and no folder is known" in result.output
    quiet = run("index", embeddings, "--out", tmp_path / "idx2", "--image-root", tmp_path)
    assert quiet.exit_code == 0 and "note:" not in quiet.output


def test_a_query_of_undecodable_bytes_is_one_line(tmp_path, demo, standin):
    """`vse search --text $'dog \\xff beach'`: the shell's byte arrives as a lone surrogate."""
    embeddings, _ = demo
    assert run("index", embeddings, "--out", tmp_path / "idx", "--of", "captions").exit_code == 0
    one_line_error(run("search", tmp_path / "idx", "--text", "dog \udcff beach"), "not valid Unicode")
    one_line_error(run("search", tmp_path / "idx", "--text", "dog", "-k", 0), "k must be at least 1, not 0")
    assert standin == []  # refused before the model was loaded


# ---------------------------------------------------------------------------- refusals at build


@pytest.mark.parametrize("change, words", [
    ({"similarity": "order"}, ["'order'", "order-embedding model cannot be indexed"]),
    ({"complete": False}, ["not complete"]),
    ({"format": "vse-features"}, ["not a vse embeddings file"]),
    ({"format_version": 2}, ["format_version"]),
    ({"dim": 16}, ["/images/vectors has shape", "dim"]),
])
def test_a_wrong_embeddings_file_is_refused_in_one_line(tmp_path, checkpoint, change, words):
    clustered_file(tmp_path / "e.h5", checkpoint, n=50, queries=5)
    with h5py.File(tmp_path / "e.h5", "a") as f:
        f.attrs.update(change)
    out = tmp_path / "idx"
    one_line_error(run("index", tmp_path / "e.h5", "--out", out), *words)
    assert not out.exists()


def test_vectors_that_are_not_unit_rows_or_ids_that_repeat_are_refused(tmp_path, checkpoint):
    sha = file_sha256(checkpoint)
    x = unit_rows(np.random.default_rng(0).standard_normal((20, 8)))
    x[7] *= 1.5
    write_embeddings(tmp_path / "a.h5", checkpoint_sha256=sha,
                     images=(x, [str(i) for i in range(20)], ["p"] * 20))
    one_line_error(run("index", tmp_path / "a.h5", "--out", tmp_path / "i1"), "row 7", "norm 1.5000",
                   "cosine")
    x[7] /= 1.5
    write_embeddings(tmp_path / "b.h5", checkpoint_sha256=sha, images=(x, ["same"] * 20, ["p"] * 20))
    one_line_error(run("index", tmp_path / "b.h5", "--out", tmp_path / "i2"), "ids are not unique")
    one_line_error(run("index", tmp_path / "b.h5", "--out", tmp_path / "i3", "--of", "captions"),
                   "has no captions group")
    one_line_error(run("index", tmp_path / "absent.h5", "--out", tmp_path / "i4"), "not found")
    one_line_error(run("index", tmp_path / "b.h5", "--out", tmp_path / "i5", "--hnsw-m", 0), "--hnsw-m")


def test_one_item_is_indexed_exactly_only(tmp_path, checkpoint):
    one = unit_rows(np.ones((1, 8)))
    write_embeddings(tmp_path / "e.h5", checkpoint_sha256=file_sha256(checkpoint),
                     images=(one, ["a"], ["a.jpg"]))
    one_line_error(run("index", tmp_path / "e.h5", "--out", tmp_path / "i", "--kind", "hnsw"), "--kind flat")
    assert run("index", tmp_path / "e.h5", "--out", tmp_path / "i").exit_code == 0
    index = SearchIndex(tmp_path / "i")
    assert [h["id"] for h in index.hits(*[a[0] for a in index.search(one, 5)])] == ["a"]


def test_out_is_guarded_and_replaced_only_when_complete(tmp_path, demo, monkeypatch):
    embeddings, _ = demo
    foreign = tmp_path / "notes.txt"
    foreign.write_text("mine")
    one_line_error(run("index", embeddings, "--out", foreign), "not a vse search index", "--overwrite")
    assert foreign.read_text() == "mine"
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "keep.jpg").write_bytes(b"x")
    for extra in ([], ["--overwrite"]):  # a folder vse did not make is never replaced
        one_line_error(run("index", embeddings, "--out", folder, *extra), "is a folder")
        assert (folder / "keep.jpg").read_bytes() == b"x"
    assert run("index", embeddings, "--out", foreign, "--overwrite").exit_code == 0
    assert SearchIndex(foreign).count == 12

    out = tmp_path / "idx"
    assert run("index", embeddings, "--out", out).exit_code == 0
    before = (out / "meta.json").read_text()
    import pipeline.search.index_build as ib

    def broken(index, path):
        path.write_bytes(b"half")
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(ib, "write_faiss", broken)
    one_line_error(run("index", embeddings, "--out", out, "--of", "captions"), "cannot write the FAISS index")
    assert (out / "meta.json").read_text() == before and SearchIndex(out).of == "images"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".idx")] == []
    monkeypatch.undo()
    assert run("index", embeddings, "--out", out, "--of", "captions").exit_code == 0  # its own: replaced
    assert SearchIndex(out).of == "captions"


def test_a_killed_build_leaves_only_a_hidden_folder_that_the_next_build_removes(tmp_path, demo):
    from pipeline.core.fsutil import atomic_dir

    embeddings, _ = demo
    out = tmp_path / "idx"
    with pytest.raises(KeyboardInterrupt), atomic_dir(out) as tmp:
        (tmp / FAISS_FILE).write_bytes(b"half")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.h5", "model.pt"]
    stale, running = tmp_path / ".idx.999999999.tmp", tmp_path / ".idx.1.tmp"  # no such process; init
    for folder in (stale, running):
        folder.mkdir()
        (folder / FAISS_FILE).write_bytes(b"half")
    assert run("index", embeddings, "--out", out).exit_code == 0
    assert not stale.exists() and running.exists() and SearchIndex(out).count == 12


# ---------------------------------------------------------------------------- refusals at load


@pytest.fixture()
def built(tmp_path, demo):
    out = tmp_path / "idx"
    assert run("index", demo[0], "--out", out).exit_code == 0
    return out


def edit_meta(index, **change):
    meta = json.loads((index / "meta.json").read_text())
    meta.update(change)
    (index / "meta.json").write_text(json.dumps(meta))


def test_an_altered_index_is_refused_in_one_line(built, standin):
    for change, words in (({"count": 11}, ["says 11 items", "holds 12"]), ({"dim": 64}, ["32-d", "64"]),
                          ({"kind": "hnsw"}, ["not the inner-product hnsw index"]),
                          ({"format_version": 9}, ["format_version"]), ({"complete": False}, ["incomplete"]),
                          ({"of": "captions"}, ["says it holds captions", "holds images"]),
                          ({"checkpoint": 123}, ["checkpoint is 123, not str or null"]),
                          ({"count": "12"}, ["count is '12', not int"]), ({"dim": True}, ["dim is True"]),
                          ({"recall": [1]}, ["recall is [1]"]), ({"files": {}},
                                                                 ["files.index.faiss.sha256"])):
        saved = (built / "meta.json").read_text()
        edit_meta(built, **change)
        one_line_error(run("search", built, "--text", "a dog"), *words)
        (built / "meta.json").write_text(saved)
    data = bytearray((built / FAISS_FILE).read_bytes())
    data[-5] ^= 0xFF
    (built / FAISS_FILE).write_bytes(bytes(data))
    one_line_error(run("search", built, "--text", "a dog"), "index.faiss", "altered")
    (built / "meta.json").unlink()
    one_line_error(run("search", built, "--text", "a dog"), "no meta.json")
    assert standin == []  # no model was loaded for a broken index


def test_altered_items_or_a_missing_file_are_refused(built):
    with h5py.File(built / ITEMS_FILE, "a") as f:
        f.attrs["count"] = 99
    with pytest.raises(VseError, match="items.h5: differs from the one recorded"):
        SearchIndex(built)
    (built / ITEMS_FILE).unlink()
    with pytest.raises(VseError, match="missing items.h5"):
        SearchIndex(built)


def test_ids_count_not_ntotal_is_refused(tmp_path, built):
    """An items file with one id fewer, its digest updated too: the counts still disagree."""
    from pipeline.search.index_build import _write_items

    index = SearchIndex(built)
    _write_items(built / ITEMS_FILE, "images", index.ids[:-1], index.shown[:-1])
    meta = json.loads((built / "meta.json").read_text())
    meta["files"][ITEMS_FILE]["sha256"] = file_sha256(built / ITEMS_FILE)
    (built / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(VseError, match="says 12 items, items.h5 holds 11"):
        SearchIndex(built)
    meta["count"] = 11
    (built / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(VseError, match="the FAISS index holds 12 vectors for 11 ids"):
        SearchIndex(built)


# ---------------------------------------------------------------------------- vse search


def test_search_embeds_the_query_with_the_index_model(built, demo, standin):
    names, captions = demo_items(12)
    result = run("search", built, "--text", captions[5][0], "-k", 3, "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["k"] == 3 and answer["of"] == "images" and len(answer["results"]) == 3
    top = answer["results"][0]
    assert top["id"] == names[5] and top["path"] == names[5] and top["score"] == pytest.approx(1, abs=1e-5)
    assert answer["results"][1]["score"] < 0.9 and answer["results"][1]["rank"] == 2
    assert standin == [json.loads((built / "meta.json").read_text())["checkpoint"]]

    text = run("search", built, "--text", captions[5][0], "-k", 2)
    assert text.exit_code == 0 and text.output.splitlines()[0].split() == ["1", "1.0000", names[5]]
    assert len(text.output.splitlines()) == 2


def test_search_by_image(tmp_path, built, standin):
    photo = tmp_path / "query.png"
    photo.write_bytes(png_bytes())
    result = run("search", built, "--image", photo, "--json", "-k", 4)
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["results"]
    # the stand-in's vector of this image, searched by hand
    query = StandInEmbedder.for_checkpoint(tmp_path / "model.pt").embed_images([photo])
    index = SearchIndex(built)
    assert [h["id"] for h in hits] == [h["id"] for h in index.hits(*[a[0] for a in index.search(query, 4)])]
    (tmp_path / "fake.jpg").write_text("not an image")
    one_line_error(run("search", built, "--image", tmp_path / "fake.jpg"), "fake.jpg", "not an image")


def test_search_refuses_another_model_and_says_where_the_model_is(tmp_path, built, standin):
    other = tmp_path / "other.pt"
    other.write_bytes(b"another model")
    one_line_error(run("search", built, "--text", "a dog", "--checkpoint", other), "other.pt",
                   "another model", "than the one the index was made with")
    moved = tmp_path / "moved.pt"
    (tmp_path / "model.pt").rename(moved)
    one_line_error(run("search", built, "--text", "a dog"), "model.pt is not there", "--checkpoint")
    assert run("search", built, "--text", "a dog", "--checkpoint", moved).exit_code == 0
    one_line_error(run("search", built), "give one query")
    one_line_error(run("search", built, "--text", "a", "--image", moved), "give one query")
    one_line_error(run("search", built, "--text", "   ", "--checkpoint", moved), "empty")
    one_line_error(run("search", built, "--text", "x" * 1001, "--checkpoint", moved), "1001 characters")
    one_line_error(run("search", built, "--text", "a", "-k", 0, "--checkpoint", moved), "k must be")
    assert standin == [str(moved)]  # the model is loaded once the query is known to be good


def test_an_index_of_another_model_is_refused_with_the_model(tmp_path, demo, standin):
    """The model is checked after loading too: its own digest, its dimension, its similarity."""
    from pipeline.search.searcher import check_embedder

    out = tmp_path / "idx"
    assert run("index", demo[0], "--out", out).exit_code == 0
    index = SearchIndex(out)
    good = StandInEmbedder(index.checkpoint_sha256, 32)
    check_embedder(good, index, "m.pt")
    for bad, words in ((StandInEmbedder("0" * 64, 32), "reports sha256"),
                       (StandInEmbedder(index.checkpoint_sha256, 16), "16-d"),
                       (StandInEmbedder(index.checkpoint_sha256, 32, "order"), "'order'")):
        with pytest.raises(VseError, match=words):
            check_embedder(bad, index, "m.pt")


def test_the_index_folder_copes_with_ids_that_are_paths(tmp_path, checkpoint):
    sha = file_sha256(checkpoint)
    ids = ["a/b/ç 1.jpg", "../x.jpg", "plain.jpg"]
    write_embeddings(tmp_path / "e.h5", checkpoint_sha256=sha,
                     images=(unit_rows(np.eye(3, 4) + 0.1), ids, ids))
    build_index(tmp_path / "e.h5", tmp_path / "idx")
    index = SearchIndex(tmp_path / "idx")
    assert [index.row(i) for i in ids] == [0, 1, 2] and index.row("nope") is None


def test_the_old_module_still_gives_every_name_it_had():
    """pipeline.search.faiss_index was split in three (the embeddings file, the build, the reader);
    its names still import from it, as the very objects of the new modules."""
    from pipeline.search import embeddings_file, faiss_index, index_build, index_reader

    old_names = """FORMAT ITEMS_FORMAT FAISS_FILE ITEMS_FILE GROUPS GROUP_FIELD KINDS RECALL_AT
        EF_SEARCH_STEPS NPROBE_STEPS UNIT_TOLERANCE CHUNK_ROWS TRAIN_SAMPLE_MAX IndexOptions option_default
        choose_kind resolved_params new_index SEARCH_PARAM set_search_params write_faiss read_faiss
        EmbeddingsFile ExactTopK drop_self recall_at tune BuildResult build_index SearchIndex
        _write_items""".split()
    for name in old_names:
        homes = [m for m in (embeddings_file, index_build, index_reader) if name in vars(m)]
        assert homes and getattr(faiss_index, name) is getattr(homes[0], name), name
