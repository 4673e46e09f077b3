"""results.flags: the checks of a result's flags as a column, so ranking (is it `no_custom_kernel`,
held for review, flagged by the static pre-check?) needs no result's payload. Backfilled from the payloads.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('results', sa.Column('flags', sa.JSON(), nullable=True))
    conn = op.get_bind()
    results = sa.table('results', sa.column('id', sa.Integer()), sa.column('payload', sa.JSON()),
                       sa.column('flags', sa.JSON()))
    rows = conn.execute(sa.select(results.c.id, results.c.payload)).all()
    for rid, payload in rows:
        if isinstance(payload, str):  # a driver that hands JSON back as text
            payload = json.loads(payload)
        checks = [f.get('check') for f in (payload or {}).get('flags') or [] if f.get('check')]
        conn.execute(results.update().where(results.c.id == rid).values(flags=checks))
    with op.batch_alter_table('results') as batch:
        batch.alter_column('flags', existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('results') as batch:
        batch.drop_column('flags')
