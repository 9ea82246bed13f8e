"""Opening the database: SQLite in WAL mode, the schema version checked against the migrations."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DatabaseError, OperationalError

from tuner.errors import SchemaOutdatedError, StoreError

__all__ = ["Tx", "redact_url", "open_engine", "upgrade", "current_revision", "head_revision", "check_schema", "migrations_dir"]


def migrations_dir() -> Path:
    """``migrations/`` beside the package (editable install / checkout), or $TUNER_MIGRATIONS."""
    override = os.environ.get("TUNER_MIGRATIONS")
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").exists():
        raise StoreError(f"migrations not found at {path}; install tuner from its checkout "
                         "(pip install -e .) or set TUNER_MIGRATIONS")
    return path


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL: readers (CLI, exporter) never block the scraper's writes; NORMAL is durable at checkpoints.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
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
        parent = Path(url[len("sqlite:///"):]).parent
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
    """Migrate to ``revision``; returns (before, after)."""
    before = current_revision(engine)
    cfg = _alembic_config(engine)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except (OperationalError, DatabaseError) as exc:
        raise StoreError(f"migrating {engine.url} failed: {exc.orig}") from None
    return before, current_revision(engine) or ""
