"""jobs.needs, workers.accepts: what a job needs of the worker that evaluates it (a CUDA device, an
architecture) and what each worker meets, so that a job only a GPU can run waits for a GPU worker instead of
failing on a CPU one. Jobs queued before this revision need nothing (any worker claims them, as before).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('needs', sa.String(length=32), nullable=True))
    op.add_column('workers', sa.Column('accepts', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('workers') as batch:
        batch.drop_column('accepts')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('needs')
