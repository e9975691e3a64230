"""`vse tune`'s study storage (issue 49): every storage a user can name that is not what a study
needs (the default TUNE/study.db, an RDB URL, a journal file) is one line `error: STORAGE: problem`,
exit 1, and is left as it was; a storage that breaks during the study is one line too."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import vse

optuna = pytest.importorskip("optuna")

import pipeline.training.tune as tune_module  # noqa: E402
import pipeline.training.tune_storage as tune_storage  # noqa: E402

TINY = {"embed_dim": 8, "word_dim": 8, "batch_size": 16, "min_word_count": 1, "workers": 0, "device": "cpu",
        "val_every": 0}


def _tune_file(tmp_path: Path, cache, name="tune") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "runs_dir": str(tmp_path / "runs"),
                                    "base": {"features": str(cache), **TINY},
                                    "search": {"lr": {"log_uniform": [1e-3, 2e-2]}}}))
    return path


def _state(path: Path) -> str:
    """What a storage is now: its bytes (a file), its listing (a folder), or absent."""
    if path.is_symlink() and not path.exists():
        return f"link {os.readlink(path)}"
    if path.is_dir():
        return "dir " + " ".join(sorted(p.name for p in path.iterdir()))
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


def _optuna_db(path: Path, study="other", attrs=True, trials=1) -> Path:
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    made = optuna.create_study(study_name=study, storage=storage, direction="maximize")
    if attrs:
        made.set_user_attr("fingerprint", "x")
    for value in range(trials):
        made.add_trial(optuna.trial.create_trial(value=float(value), params={}, distributions={}))
    storage.engine.dispose()
    return path


def _refused(result, label, problem: str) -> None:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {label}: "), lines[0]
    assert problem in lines[0], lines[0]


# ---------------------------------------------------------------------------- the default study.db
def _text(path):
    path.write_text("hello, not a database\n")


def _folder(path):
    path.mkdir()


def _foreign(path):
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE foo (x INTEGER)")


def _truncated(path):
    _optuna_db(path, "tune", trials=5)
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 3])


def _another_tune(path):
    _optuna_db(path, "other")


def _old_schema(path):
    _optuna_db(path, "tune")
    with sqlite3.connect(path) as con:
        con.execute("UPDATE alembic_version SET version_num = 'v1.3.0.a'")


def _loop(path):
    path.symlink_to(path)  # opening it: too many levels of symbolic links


@pytest.mark.parametrize("make, problem", [
    (_text, "not an SQLite database"),
    (_folder, "a directory, not an SQLite database file"),
    (_foreign, "holds another program's tables (foo), not an Optuna study's"),
    (_truncated, "database disk image is malformed"),
    (_another_tune, "holds the study 'other' of another tune, not 'tune'"),
    (_old_schema, "an Optuna storage of schema v1.3.0.a, this Optuna"),
    (_loop, "cannot read it (Too many levels of symbolic links)"),
], ids=["text", "folder", "foreign", "truncated", "another-tune", "old-schema", "unreadable"])
def test_a_wrong_study_db_is_refused_in_one_line_and_left_as_it_was(tmp_path, tiny_cache, make, problem):
    db = tmp_path / "runs" / "tune" / "study.db"
    db.parent.mkdir(parents=True)
    make(db)
    before = _state(db)
    _refused(vse("tune", _tune_file(tmp_path, tiny_cache), "--budget", "1x1"), db, problem)
    assert _state(db) == before
    assert sorted(p.name for p in db.parent.iterdir()) == ["study.db"]  # no trial, no lock file


@pytest.mark.parametrize("file", ["tune", "."], ids=["tune-folder", "runs-dir"])
def test_a_file_where_the_tune_folder_goes_is_refused_in_one_line(tmp_path, tiny_cache, file):
    runs = tmp_path / "runs"
    if file == ".":
        runs.write_text("a file where the runs folder goes\n")
        blocked = runs
    else:
        runs.mkdir()
        blocked = runs / file
        blocked.write_text("a file where the tune folder goes\n")
    before = _state(blocked)
    _refused(vse("tune", _tune_file(tmp_path, tiny_cache), "--budget", "1x1"), runs / "tune" / "study.db",
             f"{blocked} is a file, not a folder")
    assert _state(blocked) == before


# ---------------------------------------------------------------------------- --storage
def _journal_cut(path):
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    optuna.create_study(study_name="other", storage=storage)
    path.write_bytes(path.read_bytes()[:-10])


def _journal_sqlite(path):
    _optuna_db(path, "other")


def _not_ours(path):  # a study named as the tune, with a trial, that vse tune did not make
    _optuna_db(path, "tune", attrs=False)


@pytest.mark.parametrize("storage, make, label, problem", [
    ("foo://bar", None, "foo://bar", "unknown database kind 'foo'"),
    ("postgresql://u:secret@127.0.0.1:1/db", None, "postgresql://u:***@127.0.0.1:1/db", ""),
    ("sqlite:///{tmp}/no/such/x.db", None, "{tmp}/no/such/x.db", "its folder {tmp}/no/such does not exist"),
    ("sqlite:{tmp}/x.db", None, "sqlite:{tmp}/x.db", "neither a database URL"),
    ("sqlite:///{tmp}/x.db", _text, "{tmp}/x.db", "not an SQLite database"),
    ("sqlite:///{tmp}/x.db", _foreign, "{tmp}/x.db", "holds another program's tables (foo)"),
    ("sqlite:///{tmp}/x.db", _not_ours, "{tmp}/x.db",
     "holds a study named 'tune' with 1 trial(s) that `vse tune` did not make"),
    ("{tmp}/journal", _folder, "{tmp}/journal", "a directory, not a journal file"),
    ("{tmp}/no/journal", None, "{tmp}/no/journal", "its folder {tmp}/no does not exist"),
    ("{tmp}/journal", _text, "{tmp}/journal", "line 1 is not an Optuna journal entry"),
    ("{tmp}/journal", _journal_sqlite, "{tmp}/journal", "an SQLite database, not a journal file: give it as "
                                                        "--storage sqlite:///{tmp}/journal"),
    ("{tmp}/journal", _journal_cut, "{tmp}/journal", "is cut short (a writer stopped mid-line?)"),
    ("{tmp}/journal", _loop, "{tmp}/journal", "cannot read it"),
], ids=["dialect", "driver-or-server", "sqlite-no-folder", "not-a-url", "sqlite-text", "sqlite-foreign",
        "study-not-ours", "journal-folder", "journal-no-folder", "journal-text", "journal-sqlite",
        "journal-cut", "journal-unreadable"])
def test_a_wrong_storage_is_refused_in_one_line_and_left_as_it_was(tmp_path, tiny_cache, storage, make, label,
                                                                   problem):
    tmp = tmp_path / "store"
    tmp.mkdir()
    storage, label, problem = (s.replace("{tmp}", str(tmp)) for s in (storage, label, problem))
    target = Path(label) if make is not None else None
    if make is not None:
        make(target)
    before = _state(target) if target is not None else None
    _refused(vse("tune", _tune_file(tmp_path, tiny_cache), "--budget", "1x1", "--storage", storage), label,
             problem)
    assert "secret" not in label
    if target is not None:
        assert _state(target) == before
    made = sorted(p.name for p in (tmp_path / "runs" / "tune").glob("*"))
    assert made == [] if make is not _not_ours else made == [".tune.lock"]  # no trial (nor tune folder)


def test_a_locked_study_db_is_one_line_after_the_timeout(tmp_path, tiny_cache, monkeypatch):
    db = tmp_path / "runs" / "tune" / "study.db"
    db.parent.mkdir(parents=True)
    _optuna_db(db, "tune")
    monkeypatch.setattr(tune_storage, "SQLITE_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another program holds the database
    try:
        _refused(vse("tune", _tune_file(tmp_path, tiny_cache), "--budget", "1x1"), db, "database is locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_storage_broken_during_the_study_is_one_line(tmp_path, tiny_cache, monkeypatch):
    journal = tmp_path / "journal"
    opened = tune_module.open_study

    def open_then_break(*args, **kwargs):
        study, settings = opened(*args, **kwargs)
        with open(journal, "a") as f:  # another program writes into the journal meanwhile
            f.write("not json\n{\"op_code\": 0}\n")
        return study, settings

    monkeypatch.setattr(tune_module, "open_study", open_then_break)
    result = vse("tune", _tune_file(tmp_path, tiny_cache), "--budget", "1x1", "--storage", journal)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith(f"error: {journal}: the study storage failed: "), \
        result.output
    assert len([line for line in lines if not line.startswith("tune tune:")]) == 1, result.output
