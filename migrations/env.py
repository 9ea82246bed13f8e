"""Alembic environment: run by `tuner db upgrade` (which passes the connection) or by `alembic` itself."""

from alembic import context
from sqlalchemy import engine_from_config, pool

import tuner.store.alerts  # noqa: F401  (registers its tables on Base)
import tuner.store.journal  # noqa: F401
import tuner.store.recommendations  # noqa: F401
import tuner.store.tuning  # noqa: F401
from tuner.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(config.get_section(config.config_ini_section) or {},
                                prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
