import json

import numpy as np
import pytest

from pipeline.core.errors import VseError
from pipeline.text.vocabulary import SPECIALS, TokenizedCaptions, Vocabulary, tokenize


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("A Dog, running!  On the 2 beaches.") == ["a", "dog", "running", "on", "the", "2",
                                                               "beaches"]


def test_vocabulary_counts_threshold_and_specials():
    vocab = Vocabulary.build(["a dog", "a dog runs", "a cat", "a dog"], min_count=2)
    assert vocab.words == [*SPECIALS, "a", "dog"]
    assert vocab.encode("A dog sleeps") == [1, 4, 5, 3, 2]  # <start> a dog <unk> <end>


def test_vocabulary_round_trips_as_json_not_pickle(tmp_path):
    vocab = Vocabulary.build(["red ball", "red car"], min_count=1)
    path = tmp_path / "vocab.json"
    vocab.save(path)
    payload = json.loads(path.read_text())
    assert payload["format"] == "vse-vocab"
    assert Vocabulary.load(path).words == vocab.words


def test_vocabulary_rejects_foreign_json(tmp_path):
    path = tmp_path / "v.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(VseError, match="not a vse vocabulary"):
        Vocabulary.load(path)


def test_tokenized_batch_pads_and_reports_lengths():
    vocab = Vocabulary.build(["a b c", "a b", "a"], min_count=1)
    tok = TokenizedCaptions.encode(vocab, ["a b c", "a", "b c"])
    tokens, lengths = tok.batch([2, 0, 1])
    assert lengths.tolist() == [4, 5, 3]
    expected = [vocab.encode("b c") + [0], vocab.encode("a b c"), vocab.encode("a") + [0, 0]]
    assert tokens.tolist() == expected


def test_long_captions_are_truncated_keeping_the_end_token():
    vocab = Vocabulary.build(["w"], min_count=1)
    tok = TokenizedCaptions.encode(vocab, [" ".join(["w"] * 5000)], max_len=10)
    tokens, lengths = tok.batch(np.array([0]))
    assert lengths.tolist() == [10]
    assert tokens[0, 0].item() == 1 and tokens[0, -1].item() == 2
