"""one open apply per target and per replica group, by a unique index; tuning runs record their tuner

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:00:00

applies.holds is what an open apply holds: ``group:NAME`` for a replica of a group (one change at a time per group),
``target:NAME`` otherwise (tuner/store/journal.py, hold_key). A partial unique index over it where the apply is not
done makes "one open apply per target and per group" the database's rule: two processes that opened an apply at the
same instant both got one before (the journal read, then inserted). Rows written before this revision hold their
target (the migration does not know the groups); if a target has several open ones already (that race), the oldest
holds it and the others get a key of their own, so the index can be built and `tuner reconcile` closes them.

tune_runs.owner_pid / owner_start: the tuner running it (pid + kernel start time), so a second `tuner tune` stops
only the trial servers of runs whose tuner is gone. NULL (runs from before): unknown, treated as gone, as before.
"""
import sqlalchemy as sa
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE applies ADD COLUMN holds VARCHAR(72) NOT NULL DEFAULT ''")
    op.execute("UPDATE applies SET holds = 'target:' || target")
    op.execute("UPDATE applies SET holds = holds || '#' || id WHERE state != 'done' AND id NOT IN "
               "(SELECT MIN(id) FROM applies WHERE state != 'done' GROUP BY target)")
    op.create_index('ux_applies_open_holds', 'applies', ['holds'], unique=True,
                    sqlite_where=sa.text("state != 'done'"), postgresql_where=sa.text("state != 'done'"))
    op.execute("ALTER TABLE tune_runs ADD COLUMN owner_pid INTEGER")
    op.execute("ALTER TABLE tune_runs ADD COLUMN owner_start INTEGER")


def downgrade() -> None:
    op.drop_index('ux_applies_open_holds', table_name='applies')
    with op.batch_alter_table('tune_runs') as batch:
        batch.drop_column('owner_start')
        batch.drop_column('owner_pid')
    with op.batch_alter_table('applies') as batch:
        batch.drop_column('holds')
