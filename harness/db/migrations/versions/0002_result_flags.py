"""results.flags, max_abs_err, err_vs_fp64, ref_err_vs_fp64: the checks of a result's flags and its
largest error figures as columns, so ranking (is it `no_custom_kernel`, held for review?) and results
tables need no result's payload. Backfilled from the payloads.

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


ERRORS = ('max_abs_err', 'err_vs_fp64', 'ref_err_vs_fp64')


def _worst(payload: dict, name: str) -> float | None:
    trials = (payload.get('observations') or {}).get('trials') or []
    vals = [v for t in trials for o in t.get('outputs') or [] if (v := o.get(name)) is not None]
    return max(vals) if vals else None


def upgrade() -> None:
    op.add_column('results', sa.Column('flags', sa.JSON(), nullable=True))
    for name in ERRORS:
        op.add_column('results', sa.Column(name, sa.Double(), nullable=True))
    conn = op.get_bind()
    results = sa.table('results', sa.column('id', sa.Integer()), sa.column('payload', sa.JSON()),
                       sa.column('flags', sa.JSON()), *(sa.column(name, sa.Double()) for name in ERRORS))
    rows = conn.execute(sa.select(results.c.id, results.c.payload)).all()
    for rid, payload in rows:
        if isinstance(payload, str):  # a driver that hands JSON back as text
            payload = json.loads(payload)
        payload = payload or {}
        checks = [f.get('check') for f in payload.get('flags') or [] if f.get('check')]
        conn.execute(results.update().where(results.c.id == rid)
                     .values(flags=checks, **{name: _worst(payload, name) for name in ERRORS}))
    with op.batch_alter_table('results') as batch:
        batch.alter_column('flags', existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('results') as batch:
        for name in ('flags', *ERRORS):
            batch.drop_column(name)
