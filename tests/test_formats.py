"""`core.formats.FileFormat.open`: the one opener of vse's HDF5 files, and its five refusals."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from pipeline.core.errors import VseError
from pipeline.core.formats import CAPTION_FEATURES, EMBEDDINGS, FEATURES, RELEVANCE, FileFormat

FMT = FileFormat("vse-thing", 3, "a vse thing file", "`vse make-thing`", completes=True)


def write(path, **attrs):
    with h5py.File(path, "w") as f:
        f["rows"] = np.arange(4)
        f.attrs.update(attrs)
    return path


def refused(path, fmt=FMT) -> str:
    with pytest.raises(VseError) as info:
        fmt.open(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def test_a_file_of_the_format_opens_read_only(tmp_path):
    path = write(tmp_path / "ok.h5", format="vse-thing", format_version=3, complete=True)
    with FMT.open(path) as f:
        assert f.mode == "r" and f["rows"][()].tolist() == [0, 1, 2, 3]
    link = tmp_path / "link.h5"
    link.symlink_to(path)
    with FMT.open(link) as f:  # opened at its target: files beside it are found there
        assert f.filename == str(path.resolve())


def test_not_found(tmp_path):
    assert refused(tmp_path / "absent.h5") == "thing file not found (`vse make-thing` makes them)"
    assert refused(tmp_path) == "thing file not found (`vse make-thing` makes them)"  # a folder


@pytest.mark.parametrize("content", [b"rows: 0 1 2 3\n", b"\x89HDF\r\n\x1a\n" + bytes(200), b""])
def test_not_hdf5(tmp_path, content):
    path = tmp_path / "thing.h5"
    path.write_bytes(content)
    assert refused(path) == "not a readable HDF5 file (truncated or another format)"


def test_a_cut_off_file_is_not_hdf5(tmp_path):
    whole = write(tmp_path / "whole.h5", format="vse-thing", format_version=3, complete=True)
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole.read_bytes()[:1000])
    assert refused(cut) == "not a readable HDF5 file (truncated or another format)"


@pytest.mark.parametrize("attrs, found", [({}, "None"),
                                          ({"format": "vse-features", "format_version": 1}, "'vse-features'"),
                                          ({"format": np.bytes_(b"vse-other")}, "'vse-other'")])
def test_a_foreign_file_names_its_format_tag(tmp_path, attrs, found):
    path = write(tmp_path / "foreign.h5", **attrs)
    assert refused(path) == f"not a vse thing file (format attribute {found}; `vse make-thing` makes them)"


@pytest.mark.parametrize("version", [2, 4, "3", np.int64(9)])
def test_another_version(tmp_path, version):
    path = write(tmp_path / "old.h5", format="vse-thing", format_version=version, complete=True)
    plain = version.item() if isinstance(version, np.generic) else version
    assert refused(path) == f"unsupported format_version {plain!r} of a vse thing file (this vse reads 3)"


@pytest.mark.parametrize("complete", [False, None])
def test_a_half_written_file(tmp_path, complete):
    attrs = {"format": "vse-thing", "format_version": 3}
    if complete is not None:
        attrs["complete"] = complete
    path = write(tmp_path / "half.h5", **attrs)
    assert refused(path) == "thing file is not complete (`vse make-thing` did not finish it)"
    # a format whose files are written whole (no ``complete`` attribute) does not ask for it
    plain = FileFormat("vse-thing", 3, "a vse thing file", "`vse make-thing`")
    with plain.open(path) as f:
        assert "rows" in f


def test_a_refused_file_is_closed_again(tmp_path):
    path = write(tmp_path / "old.h5", format="vse-thing", format_version=2)
    refused(path)
    write(path, format="vse-thing", format_version=3, complete=True)  # rewriting needs it closed
    FMT.open(path).close()


def test_the_four_readers_open_through_it(tmp_path):
    """The feature cache, caption features, the relevance file and the embeddings file each say
    the same five things in the same words (their nouns and commands differ)."""
    from pipeline.data.cache import FeatureCache
    from pipeline.data.caption_features import CaptionFeatures
    from pipeline.relevance.store import read_relevance
    from pipeline.search.embeddings_file import EmbeddingsFile

    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    for fmt, reader in ((FEATURES, FeatureCache), (CAPTION_FEATURES, CaptionFeatures),
                        (RELEVANCE, read_relevance), (EMBEDDINGS, EmbeddingsFile)):
        cases = {tmp_path / "absent.h5": f"{fmt.name} not found ({fmt.made_by} makes them)",
                 text: "not a readable HDF5 file (truncated or another format)",
                 write(tmp_path / "foreign.h5", format="vse-index", format_version=1):
                     f"not {fmt.noun} (format attribute 'vse-index'; {fmt.made_by} makes them)",
                 write(tmp_path / f"v-{fmt.tag}.h5", format=fmt.tag, format_version=fmt.version + 1):
                     f"unsupported format_version {fmt.version + 1} of {fmt.noun} "
                     f"(this vse reads {fmt.version})"}
        if fmt.completes:
            cases[write(tmp_path / f"c-{fmt.tag}.h5", format=fmt.tag, format_version=fmt.version)] = \
                f"{fmt.name} is not complete ({fmt.made_by} did not finish it)"
        for path, message in cases.items():
            with pytest.raises(VseError) as info:
                reader(path)
            assert str(info.value) == f"{path}: {message}", reader
    assert not RELEVANCE.completes  # written whole by fsutil.atomic_h5: it has no half-written state
