"""samples and hist_samples in (target, time, series) order

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 01:40:00

In (series, time) order a scrape's ~36 rows went to ~36 different pages, each written to the WAL and then
checkpointed, and the cost per scrape grew as the store filled (1,000 targets: 98 µs per scrape after 2 minutes,
386 µs after 12, still rising; bench/store_growth.py). In (target, time, series) order a scrape's rows are
neighbours and the cost stays flat (~78 µs in the same test). A target's window reads one range of the key.
series_id is no longer a foreign key: checking it on a delete would need an index by series; a target's rows
go with the target (its cascade), as they went with its series before.
"""
import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_VALUES = {'samples': [sa.Column('value', sa.Float(), nullable=False)],
           'hist_samples': [sa.Column('count', sa.Float(), nullable=False),
                            sa.Column('sum', sa.Float(), nullable=False),
                            sa.Column('counts', sa.Text(), nullable=False)]}
_NAMES = {'samples': 'value', 'hist_samples': 'count, sum, counts'}


def _keep() -> sa.Column:
    return sa.Column('keep', sa.Integer(), server_default='0', nullable=False)


def upgrade() -> None:
    for table, values in _VALUES.items():
        op.create_table(f'{table}_new',
                        sa.Column('target_id', sa.Integer(), nullable=False),
                        sa.Column('ts_ms', sa.Integer(), nullable=False),
                        sa.Column('series_id', sa.Integer(), nullable=False),
                        *values, _keep(),
                        sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
                        sa.PrimaryKeyConstraint('target_id', 'ts_ms', 'series_id'),
                        sqlite_with_rowid=False)
        op.execute(f"INSERT INTO {table}_new (target_id, ts_ms, series_id, {_NAMES[table]}, keep) "
                   f"SELECT r.target_id, p.ts_ms, p.series_id, {', '.join('p.' + c for c in _NAMES[table].split(', '))}, "
                   f"p.keep FROM {table} p JOIN series r ON r.id = p.series_id "
                   "ORDER BY r.target_id, p.ts_ms, p.series_id")
        op.drop_table(table)
        op.rename_table(f'{table}_new', table)


def downgrade() -> None:
    for table, values in _VALUES.items():
        op.create_table(f'{table}_old',
                        sa.Column('series_id', sa.Integer(), nullable=False),
                        sa.Column('ts_ms', sa.Integer(), nullable=False),
                        *values, _keep(),
                        sa.ForeignKeyConstraint(['series_id'], ['series.id'], ondelete='CASCADE'),
                        sa.PrimaryKeyConstraint('series_id', 'ts_ms'),
                        sqlite_with_rowid=False)
        op.execute(f"INSERT INTO {table}_old (series_id, ts_ms, {_NAMES[table]}, keep) "
                   f"SELECT series_id, ts_ms, {_NAMES[table]}, keep FROM {table} ORDER BY series_id, ts_ms")
        op.drop_table(table)
        op.rename_table(f'{table}_old', table)
