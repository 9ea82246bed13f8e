"""tuning journal: tune_runs, tune_trials

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 07:20:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tune_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target', sa.String(length=63), nullable=False),
    sa.Column('created_ms', sa.Integer(), nullable=False),
    sa.Column('updated_ms', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('request', sa.Text(), nullable=False),
    sa.Column('workload', sa.Text(), nullable=False),
    sa.Column('slo', sa.Text(), nullable=False),
    sa.Column('baseline_flags', sa.Text(), nullable=False),
    sa.Column('result', sa.Text(), nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_tune_runs_target', 'tune_runs', ['target'], unique=False)
    op.create_table('tune_trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('flags', sa.Text(), nullable=False),
    sa.Column('seed', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('capacity_rps', sa.Float(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('proc_start', sa.Integer(), nullable=True),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('started_ms', sa.Integer(), nullable=False),
    sa.Column('finished_ms', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_tune_trials_run', 'tune_trials', ['run_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_tune_trials_run', table_name='tune_trials')
    op.drop_table('tune_trials')
    op.drop_index('ix_tune_runs_target', table_name='tune_runs')
    op.drop_table('tune_runs')
