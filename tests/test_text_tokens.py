"""Token-level caption features: `vse encode-text --tokens` (minilm, cbow; resumable), the
ragged file and its reader ``CaptionTokenFeatures`` (padded batches by index arithmetic), and
the refusals that keep token files and one-vector files apart."""

import json

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import demo_captions, write_feature_cache

from cli.main import cli
from pipeline.core.errors import VseError
from pipeline.data.cache import FeatureCache
from pipeline.data.caption_features import (
    CaptionFeatures,
    CaptionTokenFeatures,
    caption_features_layout,
    encode_text,
    parts_dir,
)
from pipeline.data.caption_index import caption_fingerprint
from pipeline.text.encoders import TOKEN_DEFINITIONS
from pipeline.text.vectors import ragged_rows

FLOAT16_HALF_ULP = 2.0 ** -11  # relative rounding of a value stored as float16


@pytest.fixture(scope="session")
def minilm_files(tmp_path_factory):
    """20 real demo captions (4 images) encoded by MiniLM both ways: (captions, tokens, vectors)."""
    folder = tmp_path_factory.mktemp("minilm")
    ids, captions = demo_captions(4)
    cache = write_feature_cache(folder / "c.h5", np.zeros((4, 4)), captions, np.repeat(np.arange(4), 5),
                                {"test": np.arange(4)}, image_ids=ids)
    encode_text(cache, "minilm", folder / "tokens.h5", tokens=True, device="cpu", batch_size=8)
    encode_text(cache, "minilm", folder / "vectors.h5", device="cpu")
    return captions, folder / "tokens.h5", folder / "vectors.h5"


@pytest.fixture(scope="session")
def cbow_tokens(tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens") / "cbow_tokens.h5"
    encode_text(tiny_cache, "cbow", out, tokens=True)
    return out


def _arrays(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f}, {k: f.attrs[k] for k in f.attrs if k != "created"}


# ------------------------------------------------------------------------------ what is stored


def test_minilm_tokens_are_what_its_mean_pooling_averages(minilm_files):
    from pipeline.text.bert import load_bert

    captions, tokens_path, vectors_path = minilm_files
    file = CaptionTokenFeatures(tokens_path, captions)
    assert (file.num_captions, file.dim, file.model, file.layout) == (20, 384, "minilm", "tokens")
    assert file.attrs["tokens"] == TOKEN_DEFINITIONS["minilm"]
    model = load_bert(torch.device("cpu"))
    # every token of the attention mask, [CLS] and [SEP] included, no padding
    assert file.lengths.tolist() == [len(model.tokenizer(c)["input_ids"]) for c in captions]
    assert file.attrs["max_tokens"] == file.lengths.max() and file.num_tokens == file.lengths.sum()
    assert file.attrs["mean_tokens"] == pytest.approx(file.lengths.mean())

    stored = [file.tokens[a:b].astype(np.float32) for a, b in zip(file.offsets[:-1], file.offsets[1:])]
    reference = model.encode(captions, output_value="token_embeddings")  # sentence-transformers' own
    for mine, theirs in zip(stored, reference):
        theirs = theirs.numpy()
        assert mine.shape == theirs.shape
        assert np.abs(mine - theirs).max() <= FLOAT16_HALF_ULP * np.abs(theirs).max() + 1e-5

    features = model.preprocess(captions)
    with torch.inference_mode():  # Transformer then Pooling (mean), before Normalize
        pooled = model[1](model[0](dict(features)))["sentence_embedding"].numpy()
    means = np.stack([s.mean(axis=0) for s in stored])
    bound = FLOAT16_HALF_ULP * np.array([np.abs(s).max() for s in stored])[:, None] + 1e-5
    assert (np.abs(means - pooled) <= bound).all()  # mean of float16 rows: within their rounding

    vectors = CaptionFeatures(vectors_path).vectors()  # the pooled file of `vse encode-text`
    cosine = (means / np.linalg.norm(means, axis=1, keepdims=True) * vectors).sum(axis=1)
    assert cosine.min() > 0.999


def test_cbow_tokens_are_the_glove_vectors_of_known_words(tiny_cache, cbow_tokens):
    from pipeline.text.cbow import cbow_vectors
    from pipeline.text.glove import load_glove
    from pipeline.text.vocabulary import tokenize

    with FeatureCache(tiny_cache) as cache:
        captions = cache.captions
    file = CaptionTokenFeatures(cbow_tokens, captions, tiny_cache)
    index, table = load_glove()
    for j in (0, 7, 199):
        words = [w for w in tokenize(captions[j]) if w in index]
        rows = file.tokens[file.offsets[j]:file.offsets[j + 1]]
        assert np.array_equal(rows, np.asarray(table[[index[w] for w in words]]).astype(np.float16))
    means = np.stack([file.tokens[a:b].astype(np.float32).mean(0)
                      for a, b in zip(file.offsets[:-1], file.offsets[1:])])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    pooled, _ = cbow_vectors(captions)
    assert np.abs(means - pooled).max() < 1e-3  # the same direction, but for float16


def test_a_caption_without_known_words_gets_one_zero_token(tmp_path):
    from pipeline.text.cbow import cbow_token_vectors

    vectors, lengths, empty = cbow_token_vectors(["a dog", "zzqxv qqzzx", "the cat sat"])
    assert lengths.tolist() == [2, 1, 3] and empty == 1 and vectors.shape == (6, 50)
    assert not vectors[2].any() and vectors[[0, 1, 3, 4, 5]].any(axis=1).all()


def test_ragged_rows_are_the_items_rows_in_order():
    offsets = np.array([0, 3, 4, 4, 9])
    rows, lengths = ragged_rows(offsets, [3, 0, 1, 0])
    assert rows.tolist() == [4, 5, 6, 7, 8, 0, 1, 2, 3, 0, 1, 2] and lengths.tolist() == [5, 3, 1, 3]


# ------------------------------------------------------------------------------ reading


def test_batch_equals_a_per_caption_loop(cbow_tokens):
    file = CaptionTokenFeatures(cbow_tokens)
    arrays, _ = _arrays(cbow_tokens)
    rng = np.random.default_rng(0)
    for ids in (rng.integers(0, 200, 64), np.array([5]), np.array([3, 3, 199, 0])):
        padded, lengths = file.batch(ids)
        assert padded.dtype == torch.float32 and lengths.dtype == torch.int64
        expected_lengths = [int(arrays["offsets"][j + 1] - arrays["offsets"][j]) for j in ids]
        assert lengths.tolist() == expected_lengths and padded.shape == (len(ids), max(expected_lengths), 50)
        for b, j in enumerate(ids):  # the naive gather, one caption at a time
            rows = arrays["tokens"][arrays["offsets"][j]:arrays["offsets"][j + 1]].astype(np.float32)
            assert np.array_equal(padded[b, :len(rows)].numpy(), rows)
            assert not padded[b, len(rows):].any()
    with pytest.raises(IndexError):
        file.batch([200])


def test_round_trip_of_the_ragged_file(tiny_cache, cbow_tokens):
    arrays, attrs = _arrays(cbow_tokens)
    assert set(arrays) == {"tokens", "offsets"}
    assert arrays["tokens"].dtype == np.float16 and arrays["offsets"].dtype == np.int64
    assert arrays["offsets"][0] == 0 and arrays["offsets"][-1] == len(arrays["tokens"]) == attrs["num_tokens"]
    assert attrs["layout"] == "tokens" and attrs["complete"] and attrs["features_file"] == str(tiny_cache)
    assert attrs["max_tokens"] == np.diff(arrays["offsets"]).max() and attrs["num_captions"] == 200
    assert json.loads(attrs["counts"]) == {"captions_without_known_words": 0}
    file = CaptionTokenFeatures(cbow_tokens)
    assert np.array_equal(file.tokens, arrays["tokens"]) and np.array_equal(file.offsets, arrays["offsets"])
    assert file.entry()["layout"] == "tokens" and caption_features_layout(cbow_tokens) == "tokens"


def test_encode_text_tokens_resumes_a_killed_run_with_the_same_arrays(tiny_cache, cbow_tokens, tmp_path,
                                                                      monkeypatch):
    from pipeline.text import encoders

    out = tmp_path / "tokens.h5"
    real, calls = encoders.encode_caption_tokens, []

    def dies_on_third_part(captions, *args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the process died here
        calls.append(len(captions))
        return real(captions, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(encoders, "encode_caption_tokens", dies_on_third_part)
        with pytest.raises(KeyboardInterrupt):
            encode_text(tiny_cache, "cbow", out, tokens=True, part_size=64)
    assert not out.exists() and len(list(parts_dir(out).glob("part-*.h5"))) == 2
    result = encode_text(tiny_cache, "cbow", out, tokens=True, part_size=64)
    assert (result.parts, result.parts_computed, result.layout) == (4, 2, "tokens")
    assert not parts_dir(out).exists()

    uninterrupted = tmp_path / "whole.h5"
    encode_text(tiny_cache, "cbow", uninterrupted, tokens=True, part_size=64)
    (resumed, resumed_attrs), (whole, whole_attrs) = _arrays(out), _arrays(uninterrupted)
    assert resumed_attrs == whole_attrs  # every attribute but the creation time
    for name in ("tokens", "offsets"):
        assert resumed[name].tobytes() == whole[name].tobytes()
        assert resumed[name].tobytes() == _arrays(cbow_tokens)[0][name].tobytes()  # part size is no matter
    again = encode_text(tiny_cache, "cbow", out, tokens=True, part_size=64)
    assert again.up_to_date and again.parts_computed == 0


def test_cli_encode_text_tokens_prints_what_it_wrote(minilm_files, tmp_path):
    captions, tokens_path, _ = minilm_files
    cache = tokens_path.parent / "c.h5"
    out = tmp_path / "t.h5"
    result = CliRunner().invoke(cli, ["encode-text", "--features", str(cache), "--model", "cbow", "--tokens",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "20 captions, layout tokens, model cbow" in result.output
    assert f"tokens: {CaptionTokenFeatures(out).num_tokens} x 50 float16" in result.output
    assert "[CLS]" not in result.output and "GloVe 6B-50d vector of each word" in result.output


# ------------------------------------------------------------------------------ refusals


def _edited(source, path, edit):
    path.write_bytes(source.read_bytes())
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def test_token_files_and_vector_files_refuse_each_other_in_one_line(tiny_cache, cbow_tokens, tmp_path):
    vectors = tmp_path / "vectors.h5"
    encode_text(tiny_cache, "cbow", vectors)
    assert caption_features_layout(vectors) == "vectors" and CaptionFeatures(vectors).num_captions == 200
    with pytest.raises(VseError, match=r"holds one vector per caption .*token vectors per caption .* "
                                       r"are needed here") as error:
        CaptionTokenFeatures(vectors)
    assert "\n" not in str(error.value) and "--tokens" in str(error.value)
    with pytest.raises(VseError, match=r"holds token vectors per caption .* one vector per caption"):
        CaptionFeatures(cbow_tokens)

    runner = CliRunner()  # --out of the other layout is never replaced
    for out, flags in ((vectors, ["--tokens"]), (cbow_tokens, [])):
        before = out.read_bytes()
        result = runner.invoke(cli, ["encode-text", "--features", str(tiny_cache), "--model", "cbow",
                                     "--out", str(out), *flags])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert "refusing to replace it" in result.output and out.read_bytes() == before


def test_a_token_file_of_other_captions_is_refused(cbow_tokens):
    ids, captions = demo_captions(40)
    with pytest.raises(VseError, match="made for other captions"):
        CaptionTokenFeatures(cbow_tokens, captions[5:] + captions[:5])
    assert CaptionTokenFeatures(cbow_tokens, captions).caption_fingerprint == caption_fingerprint(captions)


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.attrs.__setitem__("complete", False), "not complete"),
    (lambda f: f.__delitem__("offsets"), "not complete"),
    (lambda f: f.attrs.__setitem__("format_version", 2), "unsupported format_version 2"),
    (lambda f: f.attrs.__setitem__("layout", "regions"), "unknown caption-feature layout 'regions'"),
    (lambda f: f["offsets"].__setitem__(3, f["offsets"][2]), "offsets must rise from 0"),
    (lambda f: f["offsets"].__setitem__(200, 10 ** 6), "offsets must rise from 0"),
    (lambda f: f["tokens"].__setitem__(5, np.full(50, np.nan, dtype=np.float16)), "NaN or Inf"),
    (lambda f: f.attrs.__setitem__("num_tokens", 1), "inconsistent caption-feature file"),
])
def test_a_broken_token_file_is_refused_in_one_line(cbow_tokens, tmp_path, edit, message):
    broken = _edited(cbow_tokens, tmp_path / "broken.h5", edit)
    with pytest.raises(VseError, match=message) as error:
        CaptionTokenFeatures(broken)
    assert "\n" not in str(error.value) and error.value.path == str(broken)
