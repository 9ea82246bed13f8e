"""Opening the database: SQLite in WAL mode, the schema version checked against the migrations; the daemon's hold
on a store (one `tuner run` per store)."""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from threading import Lock
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DatabaseError, OperationalError

from tuner.errors import SchemaOutdatedError, StoreBusyError, StoreError

__all__ = [
    "Tx",
    "redact_url",
    "open_engine",
    "incremental_vacuum",
    "give_back_space",
    "upgrade",
    "current_revision",
    "head_revision",
    "check_schema",
    "migrations_dir",
    "daemon_lock",
]


def migrations_dir() -> Path:
    """``migrations/`` beside the package (editable install / checkout), or $TUNER_MIGRATIONS."""
    override = os.environ.get("TUNER_MIGRATIONS")
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").exists():
        raise StoreError(
            f"migrations not found at {path}; install tuner from its checkout "
            "(pip install -e .) or set TUNER_MIGRATIONS"
        )
    return path


WAL_SIZE_LIMIT = 16 << 20  # bytes of -wal file kept after a checkpoint (4x SQLite's 1,000-page autocheckpoint)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # A new database frees pages on request (give_back_space): set before its first table. An older one keeps
    # its mode until one VACUUM converts it (incremental_vacuum()).
    cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
    # WAL: readers (CLI, exporter) never block the scraper's writes; NORMAL is durable at checkpoints.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    # The WAL file keeps the size of the largest transaction written since (a retention run's deletes: 41 MB in
    # bench/soak.py) unless this caps what is left of it once a checkpoint has written it back.
    cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


def redact_url(url: str) -> str:
    """``store.url`` as it may be shown: a password in it replaced by ``***`` (the URL as written otherwise)."""
    return _PASSWORD.sub(r"\1***@", url)


def open_engine(url: str) -> Engine:
    shown = redact_url(url)
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        parent = Path(url[len("sqlite:///") :]).parent
        if not parent.exists():
            raise StoreError(f"store.url {shown}: directory {parent} does not exist; create it or change store.url")
    try:
        engine = create_engine(url)
    except Exception as exc:  # bad URL or missing driver (the driver's message may quote the URL: redacted too)
        raise StoreError(f"store.url {shown!r}: {str(exc).replace(url, shown)}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


class Tx:
    """``engine.begin()`` whose storage errors become a StoreError naming the database.

    ``on_rollback`` runs when the transaction did not commit (the store drops ids it cached from inside it)."""

    def __init__(self, engine: Engine, on_rollback: Callable[[], None] | None = None) -> None:
        self.engine, self.ctx, self.on_rollback = engine, engine.begin(), on_rollback

    def __enter__(self):
        try:
            return self.ctx.__enter__()
        except OperationalError as exc:
            raise StoreError(f"{self.engine.url}: {exc.orig}") from None

    def __exit__(self, et, ev, tb):
        try:
            result = self.ctx.__exit__(et, ev, tb)
        except OperationalError as exc:
            self._rolled_back()
            raise StoreError(f"{self.engine.url}: {exc.orig}") from None
        if et is not None:
            self._rolled_back()
            if issubclass(et, OperationalError):
                raise StoreError(f"{self.engine.url}: {ev.orig}") from None
        return result

    def _rolled_back(self) -> None:
        if self.on_rollback is not None:
            self.on_rollback()


def _alembic_config(engine: Engine) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return cfg


def head_revision() -> str:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None, "migrations/ has no revisions"
    return head


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except (OperationalError, DatabaseError) as exc:
        raise StoreError(f"cannot open {engine.url}: {exc.orig}") from None


def check_schema(engine: Engine) -> None:
    """Raise SchemaOutdatedError (which says to run `tuner db upgrade`) unless the schema is at head."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaOutdatedError(str(engine.url), current, head)


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Migrate to ``revision`` (and convert a store made before incremental vacuum: incremental_vacuum());
    returns (before, after)."""
    before = current_revision(engine)
    cfg = _alembic_config(engine)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except (OperationalError, DatabaseError) as exc:
        raise StoreError(f"migrating {engine.url} failed: {exc.orig}") from None
    incremental_vacuum(engine)
    return before, current_revision(engine) or ""


def _lock_path(engine: Engine) -> Path | None:
    """``<database file>.daemon.lock`` beside a SQLite file; None for a database in memory (one process only)."""
    db = engine.url.database if engine.dialect.name == "sqlite" else None
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    path = Path(db).resolve()
    return path.with_name(path.name + ".daemon.lock")


@contextmanager
def daemon_lock(engine: Engine) -> Iterator[Path | None]:
    """Hold the store for this daemon while the block runs: an exclusive flock on ``<db>.daemon.lock`` beside the
    SQLite file, which says the holder's pid. A second holder gets StoreBusyError naming that pid, at once. The
    kernel drops the lock with the process, however it ends (kill -9 too): never a stale lock to clean up. The file
    stays (removing it would let a third process lock a file the second still has open)."""
    path = _lock_path(engine)
    if path is None:
        yield None
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot open the daemon lock {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise StoreBusyError(engine.url.render_as_string(hide_password=True), path, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
_PAGES_AT_ONCE = 2048  # pages freed per hold of the write lock (8 MiB at SQLite's 4 KiB page)


def incremental_vacuum(engine: Engine) -> bool:
    """Make the store one whose free pages can go back to the file system: a database made before tuner set
    ``auto_vacuum=INCREMENTAL`` needs one VACUUM for it (it rewrites the file: seconds per 100 MB, with as much
    free disk again). False when it was so already (or is not SQLite). `tuner db upgrade` and `tuner run` at its
    start call it, before any scrape is written."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return False
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if cur.execute("PRAGMA auto_vacuum").fetchone()[0] == _INCREMENTAL:
            return False
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        _sqlite(raw).executescript("VACUUM;")  # outside any transaction; applies the mode
        return True
    except (OperationalError, DatabaseError, sqlite3.DatabaseError) as exc:
        raise StoreError(f"{engine.url}: converting to incremental vacuum failed: {exc}") from None
    finally:
        raw.close()


def _sqlite(raw: Any) -> sqlite3.Connection:
    driver = raw.driver_connection
    assert isinstance(driver, sqlite3.Connection), "tuner's store is SQLite"
    return driver


def give_back_space(engine: Engine, *, lock: Lock | None = None) -> int:
    """Return the store's free pages (what retention deleted) to the file system, a few thousand at a time under
    ``lock`` (the store's write lock: a scrape waits for one step, never for the whole); the pages freed. Nothing
    on a store not yet converted (incremental_vacuum)."""
    if engine.dialect.name != "sqlite":
        return 0
    freed = 0
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if cur.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
            return 0
        free = cur.execute("PRAGMA freelist_count").fetchone()[0]
        while free > 0:
            with lock or nullcontext():
                # executescript steps the pragma to the end (a cursor's execute frees one page)
                _sqlite(raw).executescript(f"PRAGMA incremental_vacuum({_PAGES_AT_ONCE});")
            left = cur.execute("PRAGMA freelist_count").fetchone()[0]
            if left >= free:  # nothing moved (cannot happen; never loop on it)
                break
            freed, free = freed + free - left, left
        cur.execute("PRAGMA wal_checkpoint(PASSIVE)")  # the file shrinks when the WAL is written back
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{engine.url}: giving freed pages back failed: {exc}") from None
    finally:
        raw.close()
    return freed
