"""submissions.precision and results.precision: the precision a submission asks to be evaluated at and the one a
result ran at (fp32, fp16, bf16; harness/precision.py), so results of different precisions rank apart. Everything
stored before either existed ran at fp32.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

TABLES = ('submissions', 'results')


def upgrade() -> None:
    # A column with a default, added in place: on SQLite a batch rebuild of `submissions` would drop the old table,
    # and with foreign keys on that deletes every job and result (ON DELETE CASCADE).
    for table in TABLES:
        op.add_column(table, sa.Column('precision', sa.String(length=8), nullable=False, server_default='fp32'))


def downgrade() -> None:
    for table in TABLES:  # SQLite drops a column in place since 3.35
        op.drop_column(table, 'precision')
