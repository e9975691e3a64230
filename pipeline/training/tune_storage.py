"""The storage of a `vse tune` study: TUNE/study.db (SQLite, the default), an RDB URL (``--storage
sqlite:///FILE``, ``postgresql://``, ``mysql://``...) or a journal file (``--storage PATH``).

``check_storage`` looks at what the user named before Optuna or SQLAlchemy opens it, reading only:
a directory, an unreadable file, a file that is no SQLite database or journal, another program's
database, a schema of another Optuna version (never upgraded here), another tune's study.db, a bad
URL or a missing driver is one ``VseError`` naming the storage, and nothing is created or changed in
it. ``storage_errors`` turns what the storage layer raises later (a server gone, a lock held past
the timeout, a file broken in between) into the same one line; anything else passes unchanged.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from pipeline.core.errors import VseError

STUDY_FILE = "study.db"
SQLITE_TIMEOUT_S = 120         # an SQLite study waits this long for another process's write
HEARTBEAT_S = 60               # --storage: a trial beats this often; stale after 5 missed beats
GRACE_BEATS = 5
# the driver a bare scheme gets: psycopg (3), the cluster extra's, for postgresql:// (SQLAlchemy's own
# default, psycopg2, is not installed by vse)
DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg"}
DRIVER_EXTRA = {"postgresql": "pip install 'vse[cluster]'"}
SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = ("studies", "version_info")
# the storage layer's modules: an exception that passed through one of them is the storage's
STORAGE_MODULES = ("optuna.storages", "sqlalchemy", "alembic", "sqlite3", "psycopg", "pymysql", "MySQLdb")


def engine_url(url: str) -> str:
    """The SQLAlchemy URL of an RDB storage URL, with the driver vse installs for a bare scheme
    (``DEFAULT_DRIVERS``: postgresql:// through psycopg); an unparsable URL as it is."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return url
    driver = DEFAULT_DRIVERS.get(parsed.drivername)
    return parsed.set(drivername=driver).render_as_string(hide_password=False) if driver else url


def storage_url(root: Path, storage: str | None) -> str:
    return storage or f"sqlite:///{Path(root).resolve() / STUDY_FILE}"  # the file itself as named


def is_journal(url: str) -> bool:
    return "://" not in url


def storage_label(url: str) -> str:
    """How an error names the storage: the file of a journal or an SQLite URL, else the URL
    without its password."""
    if is_journal(url):
        return url
    try:
        import sqlalchemy

        parsed = sqlalchemy.engine.make_url(url)
    except Exception:  # noqa: BLE001 - an unparsable URL is named as given
        return url
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return parsed.database
    return parsed.render_as_string(hide_password=True)


@contextlib.contextmanager
def storage_errors(url: str):
    """One line naming the storage for an exception raised inside the storage layer (Optuna's
    storages, SQLAlchemy, the database drivers); other exceptions pass unchanged."""
    try:
        yield
    except VseError:
        raise
    except Exception as exc:
        if not raised_by_storage(exc):
            raise
        raise VseError(_problem(exc), storage_label(url)) from None


def raised_by_storage(exc: BaseException) -> bool:
    """Whether the storage layer raised ``exc`` or passed it on (a journal's JSON error is raised by
    the json module inside Optuna's journal reader): a frame of its traceback is the storage's."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if any(module == name or module.startswith(name + ".") for name in STORAGE_MODULES):
            return True
        tb = tb.tb_next
    return False


def _problem(exc: BaseException) -> str:
    """The first line of what the database said (not SQLAlchemy's SQL and background link)."""
    seen = exc
    while getattr(seen, "orig", None) is None and seen.__cause__ is not None:
        seen = seen.__cause__
    inner = getattr(seen, "orig", None) or seen
    text = (str(inner).strip().splitlines() or [""])[0][:200]
    kind = type(inner).__name__
    return f"the study storage failed: {text or kind}" if text else f"the study storage failed ({kind})"


# ---------------------------------------------------------------------------- before opening
def check_storage(url: str, study: str, own_file: bool = False) -> None:
    """VseError (naming the storage) unless ``url`` is a storage a study can be made or reopened in.
    ``own_file``: the tune folder's study.db, which holds this tune's study or none."""
    with storage_errors(url):
        if is_journal(url):
            check_journal(Path(url))
        else:
            check_rdb(url, study if own_file else None)


def _check_file(path: Path, label, what: str, folder_made: bool = False) -> bytes:
    """The first bytes of an existing file (b"" when there is none yet); VseError for a directory,
    a missing folder (unless ``folder_made``: the tune folder's own file) or a file that cannot be
    read."""
    if path.is_dir():
        raise VseError(f"a directory, not {what}", label)
    if not path.parent.is_dir():
        if folder_made:  # the tune folder, made with the study: nothing in its way
            for folder in path.parents:
                if folder.exists() or folder.is_symlink():
                    if not folder.is_dir():
                        raise VseError(f"{folder} is a file, not a folder: the tune folder cannot be made "
                                       "there", label)
                    break
            return b""
        raise VseError(f"its folder {path.parent} does not exist", label)
    if not path.exists() and not path.is_symlink():
        return b""
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise VseError(f"cannot read it ({exc.strerror})", label) from None


def check_journal(path: Path) -> None:
    """A journal file: none yet, or Optuna's lines of JSON operations, every line complete (Optuna
    would append after a cut last line and break the study for good)."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", str(path)):
        raise VseError("neither a database URL (sqlite:///FILE, postgresql://HOST/DB: a scheme, then //) nor "
                       "a journal file path", path)
    head = _check_file(path, path, "a journal file")
    if not head:
        return
    if head == SQLITE_HEADER:
        raise VseError(f"an SQLite database, not a journal file: give it as --storage sqlite:///{path}", path)
    from optuna.storages.journal import JournalFileSymlinkLock
    from optuna.storages.journal._file import get_lock_file

    with get_lock_file(JournalFileSymlinkLock(str(path))):  # no writer is half-way through a line
        data = path.read_bytes()
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        if not line.endswith(b"\n"):
            raise VseError(f"line {number} is cut short (a writer stopped mid-line?): not an intact "
                           "Optuna journal; Optuna would write after it and lose the study", path)
        try:
            entry = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("op_code"), int):
            raise VseError(f"line {number} is not an Optuna journal entry: not a journal file", path)


def check_rdb(url: str, own_study: str | None = None) -> None:
    """An RDB URL whose database is empty or Optuna's, of this Optuna's schema; with ``own_study``
    (the tune folder's study.db) it holds that study or none."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise VseError("not a database URL (sqlite:///FILE, postgresql://HOST/DB, ...) nor a journal file "
                       "path", url) from None
    label = storage_label(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        head = _check_file(Path(parsed.database), label, "an SQLite database file", own_study is not None)
        if not head:
            return  # none yet, or empty: a new study's (connecting would create the file)
        if head != SQLITE_HEADER:
            raise VseError("not an SQLite database (nor empty): not a study's storage", label)
    connect = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if parsed.get_backend_name() == "sqlite" else {}
    try:
        engine = sqlalchemy.create_engine(engine_url(url), **connect)
    except sqlalchemy.exc.NoSuchModuleError:
        raise VseError(f"unknown database kind {parsed.drivername!r} in the --storage URL", label) from None
    except ImportError as exc:
        hint = DRIVER_EXTRA.get(parsed.get_backend_name())
        raise VseError(f"the database driver for {parsed.drivername}:// is not installed "
                       f"({exc.name or exc})" + (f": {hint}" if hint else ""), label) from None
    try:
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names())
            if tables and not set(OPTUNA_TABLES) <= tables:
                listed = ", ".join(sorted(tables)[:4])
                raise VseError(f"holds another program's tables ({listed}), not an Optuna study's: name an "
                               "empty database or an Optuna storage", label)
            if tables:
                _check_schema(connection, label)
            if tables and own_study is not None:
                query = sqlalchemy.text("SELECT study_name FROM studies")
                names = [row[0] for row in connection.execute(query)]
                if names and own_study not in names:
                    raise VseError(f"holds the study {names[0]!r} of another tune, not {own_study!r}: a "
                                   "study.db belongs to the tune folder of its study", label)
    finally:
        engine.dispose()


def _check_schema(connection, label) -> None:
    """The database's Optuna schema (its alembic revision) is this Optuna's: RDBStorage would add
    tables to an older one, and refuse it only after that."""
    import optuna
    from alembic.runtime.migration import MigrationContext

    head = _alembic_head()
    current = MigrationContext.configure(connection).get_current_revision()
    if head is None or current in (None, head):
        return
    raise VseError(f"an Optuna storage of schema {current}, this Optuna ({optuna.__version__}) uses {head}: "
                   "open it with the Optuna that made it, or upgrade a copy (`optuna storage upgrade "
                   "--storage URL`)", label)


def _alembic_head() -> str | None:
    """The schema revision of the installed Optuna (None when it cannot be told)."""
    try:
        import optuna.storages._rdb as rdb
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        folder = Path(rdb.__file__).parent
        config = Config(str(folder / "alembic.ini"))
        config.set_main_option("script_location", str(folder / "alembic"))
        return ScriptDirectory.from_config(config).get_current_head()
    except Exception:  # noqa: BLE001 - Optuna's own check still runs when its storage opens
        return None


def open_storage(url: str, stale_trial=None, heartbeat: int = HEARTBEAT_S):
    """Optuna's storage of ``url`` (checked by ``check_storage`` first): an RDB URL (Optuna's
    distributed mode), else a journal file path. ``stale_trial`` (a database server shared by
    machines): each running trial beats every ``heartbeat`` seconds, and any worker fails a trial whose
    beat stopped ``GRACE_BEATS`` beats ago (another machine's, killed) and calls ``stale_trial(study,
    frozen_trial)`` (``tune.queue_again``: what Optuna's RetryFailedTrialCallback(max_retry=1) does)."""
    import inspect
    import warnings

    import optuna

    with storage_errors(url):
        if is_journal(url):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(url))
        engine = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else None
        beat = {}
        if stale_trial is not None:  # the callback's keyword was renamed in Optuna 4.9
            name = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback"
                    in inspect.signature(optuna.storages.RDBStorage).parameters else "failed_trial_callback")
            beat = {"heartbeat_interval": heartbeat, "grace_period": GRACE_BEATS * heartbeat,
                    name: stale_trial}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(engine_url(url), engine_kwargs=engine, **beat)
