"""apply journal: applies, apply_steps, managed_servers

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 09:23:28.883150
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('applies',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('target', sa.String(length=63), nullable=False),
    sa.Column('recommendation_id', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('created_ms', sa.Integer(), nullable=False),
    sa.Column('updated_ms', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=True),
    sa.Column('diff', sa.Text(), nullable=False),
    sa.Column('old_flags', sa.Text(), nullable=False),
    sa.Column('new_flags', sa.Text(), nullable=False),
    sa.Column('old_argv', sa.Text(), nullable=False),
    sa.Column('new_argv', sa.Text(), nullable=False),
    sa.Column('baseline', sa.Text(), nullable=False),
    sa.Column('after', sa.Text(), nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.Column('owner_pid', sa.Integer(), nullable=False),
    sa.Column('owner_start', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('applies', schema=None) as batch_op:
        batch_op.create_index('ix_applies_target_state', ['target', 'state'], unique=False)

    op.create_table('apply_steps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('apply_id', sa.Integer(), nullable=False),
    sa.Column('ts_ms', sa.Integer(), nullable=False),
    sa.Column('step', sa.String(length=32), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('apply_steps', schema=None) as batch_op:
        batch_op.create_index('ix_apply_steps_apply', ['apply_id'], unique=False)

    op.create_table('managed_servers',
    sa.Column('target', sa.String(length=63), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('proc_start', sa.Integer(), nullable=True),
    sa.Column('argv', sa.Text(), nullable=False),
    sa.Column('flags', sa.Text(), nullable=False),
    sa.Column('config_flags', sa.Text(), nullable=False),
    sa.Column('started_ms', sa.Integer(), nullable=False),
    sa.Column('restarts', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('updated_ms', sa.Integer(), nullable=False),
    sa.Column('note', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('target')
    )


def downgrade() -> None:
    op.drop_table('managed_servers')
    with op.batch_alter_table('apply_steps', schema=None) as batch_op:
        batch_op.drop_index('ix_apply_steps_apply')

    op.drop_table('apply_steps')
    with op.batch_alter_table('applies', schema=None) as batch_op:
        batch_op.drop_index('ix_applies_target_state')

    op.drop_table('applies')
