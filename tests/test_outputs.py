"""No command destroys or silently mixes data: --out refuses a file the command did not
write (unless --overwrite), files made for other captions are refused, and the outputs of
a failed run leave nothing behind. Driven through the `vse` command line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train, vse
from test_bad_inputs import assert_one_error_line, extract, flickr8k_layout

from pipeline.core.fsutil import output_format

REFUSED = "--overwrite replaces it"


@pytest.fixture(scope="module")
def f8k(tmp_path_factory) -> Path:
    return flickr8k_layout(tmp_path_factory.mktemp("f8k"), 6)


@pytest.fixture
def run_dir(sh_run) -> Path:
    return sh_run


def _relevance(cache, out, *extra):
    return vse("relevance", "--features", cache, "--method", "svd", "--k", 8, "--out", out, *extra)


# ---------------------------------------------------------------------------- --out guards


def test_extract_refuses_to_replace_a_caption_file_or_a_checkpoint(f8k, tmp_path, run_dir):
    captions = tmp_path / "Flickr8k.token.txt"
    captions.write_bytes((f8k / "Flickr8k.token.txt").read_bytes())
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes((run_dir / "best.pt").read_bytes())
    for victim in (captions, checkpoint):
        before = victim.read_bytes()
        assert_one_error_line(extract(f8k, victim), victim,
                              f"exists and is not a vse feature cache (a file vse did not write); {REFUSED}")
        assert victim.read_bytes() == before
        assert not Path(f"{victim}.shards").exists()  # refused before any work


def test_extract_overwrite_replaces_a_foreign_file_only_when_complete(f8k, tmp_path):
    victim = tmp_path / "notes.h5"
    victim.write_text("my notes")
    result = extract(f8k, victim, "--overwrite")
    assert result.exit_code == 0, result.output
    assert output_format(victim) == "vse-features"
    assert vse("info", victim).exit_code == 0


def test_extract_resumes_and_rewrites_its_own_cache(f8k, tmp_path):
    out = tmp_path / "f.h5"
    assert extract(f8k, out).exit_code == 0
    again = extract(f8k, out)  # its own output: resumed, no --overwrite needed
    assert again.exit_code == 0, again.output
    assert "0 computed here" in again.output


def test_extract_refuses_foreign_files_among_its_shards(f8k, tmp_path):
    out = tmp_path / "f.h5"
    shards = Path(f"{out}.shards")
    shards.mkdir()
    foreign = shards / "shard-00000.h5"
    foreign.write_text("not a shard")
    assert_one_error_line(extract(f8k, out), foreign,
                          f"exists and is not a vse feature shard (a file vse did not write); {REFUSED}")
    assert foreign.read_text() == "not a shard"
    assert extract(f8k, out, "--overwrite").exit_code == 0
    assert output_format(foreign) == "vse-features-shard"

    blocked = tmp_path / "g.h5"
    Path(f"{blocked}.shards").write_text("a file where the shard folder goes")
    assert_one_error_line(extract(f8k, blocked, "--overwrite"), f"{blocked}.shards",
                          "exists and is not a folder (the cache's shards go there): move it away")


def test_relevance_refuses_to_replace_another_cache(tiny_cache, tmp_path):
    other = tmp_path / "other.h5"
    other.write_bytes(tiny_cache.read_bytes())  # a feature cache (its shards stay where they are)
    before = other.read_bytes()
    assert_one_error_line(_relevance(tiny_cache, other), other,
                          f"exists and is not a vse relevance file (format 'vse-features'); {REFUSED}")
    assert other.read_bytes() == before and not Path(f"{other}.svd.joblib").exists()

    out = tmp_path / "rel.h5"
    assert _relevance(tiny_cache, out).exit_code == 0
    assert output_format(f"{out}.svd.joblib") == "vse-relevance-svd"
    again = _relevance(tiny_cache, out)  # its own file and model: rebuilt
    assert again.exit_code == 0, again.output


def test_relevance_refuses_a_foreign_svd_model_file(tiny_cache, tmp_path):
    out = tmp_path / "rel.h5"
    model = Path(f"{out}.svd.joblib")
    torch.save({"weights": torch.zeros(2)}, model)  # someone's file under the model's name
    assert_one_error_line(_relevance(tiny_cache, out), model,
                          "exists and is not a vse SVD relevance model (a file vse did not write); "
                          f"{REFUSED}")
    assert not out.exists()
    foreign = model.read_bytes()
    assert vse("relevance", "--features", tiny_cache, "--method", "cbow", "--out", out).exit_code == 0
    assert model.read_bytes() == foreign  # not its model: left alone
    assert _relevance(tiny_cache, out, "--overwrite").exit_code == 0
    assert output_format(model) == "vse-relevance-svd"
    assert vse("relevance", "--features", tiny_cache, "--method", "cbow", "--out", out).exit_code == 0
    assert not model.exists()  # the model of the svd file just replaced goes with it


def test_evaluate_runs_out_refuses_before_evaluating(run_dir, tmp_path):
    victim = tmp_path / "paper.tex"
    victim.write_text("\\section{Results}\n")
    result = vse("evaluate", "--runs", run_dir, "--out", victim, "--device", "cpu")
    assert_one_error_line(result, victim, "exists and is not a vse results table (a file vse did not "
                                          f"write); {REFUSED}")
    assert "evaluated" not in result.output and victim.read_text() == "\\section{Results}\n"

    out = tmp_path / "results.csv"
    for _ in range(2):  # written, then its own file replaced
        result = vse("evaluate", "--runs", run_dir, "--out", out, "--device", "cpu")
        assert result.exit_code == 0, result.output
    assert output_format(out) == "vse-results"
    overwritten = vse("evaluate", "--runs", run_dir, "--out", victim, "--device", "cpu", "--overwrite")
    assert overwritten.exit_code == 0, overwritten.output
    assert output_format(victim) == "vse-results"


def test_gallery_out_refuses_a_foreign_page(run_dir, tiny_cache, tmp_path):
    victim = tmp_path / "index.html"
    victim.write_text("<html>my home page</html>")
    args = ["gallery", "--checkpoint", run_dir / "best.pt", "--features", tiny_cache, "--n", 2,
            "--device", "cpu", "--out", victim]
    assert_one_error_line(vse(*args), victim,
                          f"exists and is not a vse gallery page (a file vse did not write); {REFUSED}")
    assert victim.read_text() == "<html>my home page</html>"
    assert vse(*args, "--overwrite").exit_code == 0
    assert output_format(victim) == "vse-gallery"
    assert vse(*args).exit_code == 0  # now its own page


def test_plot_out_refuses_foreign_figures(run_dir, tmp_path):
    from PIL import Image

    out = tmp_path / "figures"
    out.mkdir()
    photo = out / "validation_curves.png"
    Image.new("RGB", (4, 4)).save(photo)
    before = photo.read_bytes()
    assert_one_error_line(vse("plot", "--runs", run_dir, "--out", out), photo,
                          f"exists and is not a vse figure (a file vse did not write); {REFUSED}")
    assert photo.read_bytes() == before and sorted(p.name for p in out.iterdir()) == [photo.name]
    assert vse("plot", "--runs", run_dir, "--out", out, "--overwrite").exit_code == 0
    for name in ("validation_curves.png", "validation_curves.pdf"):
        assert output_format(out / name) == "vse-plot", name
    again = vse("plot", "--runs", run_dir, "--out", out)
    assert again.exit_code == 0, again.output


def test_output_format_reads_tags_without_running_anything(tmp_path, tiny_cache):
    import pickle

    from pipeline.relevance.svd import SvdModel

    model = SvdModel(k=2).fit(["a red dog runs", "two black cats sleep", "a dog and a cat"])
    assert output_format(model.save(tmp_path / "m.joblib")) == "vse-relevance-svd"
    assert output_format(tiny_cache) == "vse-features"
    marker = tmp_path / "ran"
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"format": "x", "code": _RunsCode(marker)}))
    assert output_format(tmp_path / "evil.pkl") == "x" and not marker.exists()
    for name, data in {"empty": b"", "text.txt": b"hello", "trunc.h5": tiny_cache.read_bytes()[:100],
                       "csv.csv": b"a,b\n1,2\n"}.items():
        (tmp_path / name).write_bytes(data)
        assert output_format(tmp_path / name) is None, name
    assert output_format(tmp_path / "absent") is None


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))



# ---------------------------------------------------------------------------- caption fingerprints


def _same_count_other_captions(tiny_cache, path) -> Path:
    """A cache like ``tiny_cache`` whose 200 captions are the same texts in another order."""
    from conftest import write_feature_cache

    from pipeline.data.cache import FeatureCache

    with FeatureCache(tiny_cache) as cache:
        features, captions = cache.read(np.arange(cache.num_images)), cache.captions
        caption_image, ids = cache.caption_image, cache.image_ids
        splits = {name: cache.split(name) for name in cache.split_names}
    return write_feature_cache(path, features, captions[5:] + captions[:5], caption_image, splits,
                               image_ids=ids)


def test_caches_and_relevance_files_carry_the_caption_fingerprint(tiny_cache, tmp_path):
    import h5py

    from pipeline.data.cache import FeatureCache
    from pipeline.data.caption_index import caption_fingerprint

    with FeatureCache(tiny_cache) as cache:
        expected = caption_fingerprint(cache.captions)
        assert cache.attrs["caption_fingerprint"] == cache.caption_fingerprint == expected
    out = tmp_path / "rel.h5"
    assert _relevance(tiny_cache, out).exit_code == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["caption_fingerprint"] == expected
    old = tmp_path / "old.h5"  # a cache written before vse stored the fingerprint
    old.write_bytes(tiny_cache.read_bytes())
    shutil.copytree(f"{tiny_cache}.shards", tmp_path / f"{tiny_cache.name}.shards")  # its shards
    with h5py.File(old, "a") as f:
        del f.attrs["caption_fingerprint"]
    with FeatureCache(old) as cache:
        assert cache.caption_fingerprint == expected


def test_a_relevance_file_of_other_captions_with_the_same_count_is_refused(tiny_cache, run_dir, tmp_path):
    other = _same_count_other_captions(tiny_cache, tmp_path / "other.h5")
    relevance = tmp_path / "other-rel.h5"
    assert _relevance(other, relevance).exit_code == 0
    problem = (f"relevance file was made for other captions (from {other.resolve()}) than those of "
               f"{tiny_cache}; rebuild it from {tiny_cache}")
    for loss in ("lseh", "ladder"):
        assert_one_error_line(train(tiny_cache, tmp_path / loss, "--loss", loss, "--relevance", relevance),
                              relevance, problem)
        assert not (tmp_path / loss / "last.pt").exists()
    assert_one_error_line(vse("evaluate", "--checkpoint", run_dir / "best.pt", "--features", tiny_cache,
                              "--relevance", relevance, "--cs", 2, "--device", "cpu"), relevance, problem)
    runs = vse("evaluate", "--runs", run_dir, "--features", tiny_cache, "--relevance", relevance,
               "--cs", 2, "--device", "cpu")
    assert runs.exit_code == 1 and problem in runs.stderr  # the run is skipped, saying why

    own = tmp_path / "own-rel.h5"
    assert _relevance(tiny_cache, own).exit_code == 0
    ok = vse("evaluate", "--checkpoint", run_dir / "best.pt", "--features", tiny_cache,
             "--relevance", own, "--cs", 2, "--device", "cpu")
    assert ok.exit_code == 0 and "i2t_cs@2" in ok.output, ok.output


def test_a_relevance_file_without_a_fingerprint_is_refused(tiny_cache, tmp_path):
    import h5py

    relevance = tmp_path / "old-rel.h5"
    assert _relevance(tiny_cache, relevance).exit_code == 0
    with h5py.File(relevance, "a") as f:  # as an older vse wrote it
        del f.attrs["caption_fingerprint"]
    assert_one_error_line(train(tiny_cache, tmp_path / "run", "--loss", "lseh", "--relevance", relevance),
                          relevance, f"relevance file has no caption fingerprint (made by an older vse), so "
                                     f"it cannot be checked against the captions of {tiny_cache}; rebuild it")


# ---------------------------------------------------------------------------- CS@K on small splits


def test_cs_at_k_beyond_the_split_size_is_left_out_and_named(tiny_cache, run_dir, tmp_path):
    import json

    relevance = tmp_path / "rel.h5"
    assert _relevance(tiny_cache, relevance).exit_code == 0
    base = ["evaluate", "--checkpoint", run_dir / "best.pt", "--features", tiny_cache,
            "--relevance", relevance, "--device", "cpu"]
    default = vse(*base, "--json")  # --cs 100,1000 on the 8 test images: was `max() arg is an empty sequence`
    assert default.exit_code == 0, default.output
    assert default.stderr.splitlines() == [
        "note: CS@100, CS@1000 left out: the test split has only 8 images (CS@K needs K <= that)"]
    assert not any("_cs@" in key for key in json.loads(default.stdout))
    some = vse(*base, "--cs", "4,8,100")
    assert some.exit_code == 0, some.output
    assert "i2t_cs@4" in some.stdout and "t2i_cs@8" in some.stdout and "cs@100" not in some.stdout
    assert "note: CS@100 left out: the test split has only 8 images" in some.stderr
    runs = vse("evaluate", "--runs", run_dir, "--relevance", relevance, "--cs", "4,100", "--device", "cpu")
    assert runs.exit_code == 0, runs.output
    assert "note: CS@100 left out: the test split has only 8 images" in runs.stderr


# ---------------------------------------------------------------------------- files given in the wrong place


def test_a_truncated_or_corrupt_embeddings_file_is_one_line(tmp_path):
    rng = np.random.default_rng(0)
    whole = tmp_path / "emb.npz"
    np.savez_compressed(whole, images=rng.random((4, 3)), captions=rng.random((20, 3)))
    assert vse("evaluate", "--embeddings", whole).exit_code == 0
    data = whole.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_error_line(vse("evaluate", "--embeddings", cut), cut,
                          "cannot read embeddings: truncated or not an npz (File is not a zip file)")
    flipped = tmp_path / "flipped.npz"  # one byte changed inside the compressed images array
    flipped.write_bytes(data[:60] + bytes([data[60] ^ 0xFF]) + data[61:])
    assert_one_error_line(vse("evaluate", "--embeddings", flipped), flipped, "cannot read embeddings")
    assert_one_error_line(vse("evaluate", "--embeddings", tmp_path / "absent.npz"), tmp_path / "absent.npz",
                          "embeddings file not found")


def test_a_file_given_as_checkpoint_is_named_for_what_it_is(tiny_cache, tmp_path):
    relevance = tmp_path / "rel.h5"
    assert _relevance(tiny_cache, relevance).exit_code == 0
    embeddings = tmp_path / "emb.npz"
    np.savez(embeddings, images=np.zeros((2, 3)), captions=np.zeros((10, 3)))
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    cases = {tiny_cache: "is a vse feature cache, not a checkpoint; give it as --features",
             relevance: "is a vse relevance file, not a checkpoint; give it as --relevance",
             embeddings: "is an npz of arrays, not a checkpoint (saved embeddings go to --embeddings)",
             text: "is not a PyTorch checkpoint file"}
    for path, problem in cases.items():
        result = vse("evaluate", "--checkpoint", path, "--features", tiny_cache, "--device", "cpu")
        assert_one_error_line(result, path, problem)
        assert "other than tensors" not in result.stderr
    assert_one_error_line(train(tiny_cache, tmp_path / "run", "--init-from", tiny_cache), tiny_cache,
                          cases[tiny_cache])


def test_a_broken_shard_is_recomputed_not_refused(f8k, tmp_path):
    out = tmp_path / "f.h5"
    assert extract(f8k, out).exit_code == 0
    shard = Path(f"{out}.shards") / "shard-00000.h5"
    shard.write_bytes(shard.read_bytes()[:64])  # an HDF5 file cut short: vse's own, broken
    result = extract(f8k, out)
    assert result.exit_code == 0, result.output
    assert "1 computed here" in result.output and output_format(shard) == "vse-features-shard"
