"""samples and hist_samples: keep, the mark retention sets on the points it will keep when it thins them

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 21:50:00

Retention marks each completed rollup step's last point and the points around each counter reset as it
goes (every run, not only once the raw span has passed), so a long window reads the marked points alone
(Store.window) and thinning deletes what is unmarked. Points older than the last thinning are the ones
it kept: they are marked here.
"""
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ('samples', 'hist_samples'):
        # Plain ALTER TABLE (batch mode would rebuild these WITHOUT ROWID tables as rowid ones).
        op.execute(f"ALTER TABLE {table} ADD COLUMN keep INTEGER NOT NULL DEFAULT '0'")
        op.execute(f"UPDATE {table} SET keep = 1 WHERE ts_ms < "
                   "COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'thinned_until_ms'), 0)")


def downgrade() -> None:
    op.execute("DELETE FROM meta WHERE key = 'marked_until_ms'")
    for table in ('samples', 'hist_samples'):
        op.execute(f"ALTER TABLE {table} DROP COLUMN keep")
