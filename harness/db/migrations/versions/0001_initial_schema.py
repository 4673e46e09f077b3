"""Initial schema: tokens, workers, submissions, jobs (the queue), results.

Datetimes are naive UTC (harness.db.models.UTCDateTime converts at the edge).

Revision ID: 0001
Revises:
Create Date: 2026-11-22 06:19:32.841460
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('is_admin', sa.Boolean(), nullable=False),
    sa.Column('max_queued', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('revoked_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('workers',
    sa.Column('id', sa.String(length=100), nullable=False),
    sa.Column('hostname', sa.String(length=200), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('slots', sa.JSON(), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('last_seen', sa.DateTime(), nullable=False),
    sa.Column('stopped_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('submissions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('problem_id', sa.String(length=200), nullable=False),
    sa.Column('problem_version', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('text_kind', sa.String(length=8), nullable=False),
    sa.Column('submitter', sa.String(length=100), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=False),
    sa.Column('token_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('verdict', sa.String(length=32), nullable=True),
    sa.Column('current_result_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['token_id'], ['tokens.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_submissions_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_submissions_model'), ['model'], unique=False)
        batch_op.create_index(batch_op.f('ix_submissions_problem_id'), ['problem_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_submissions_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_submissions_submitter'), ['submitter'], unique=False)
        batch_op.create_index(batch_op.f('ix_submissions_token_id'), ['token_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_submissions_verdict'), ['verdict'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('submission_id', sa.Integer(), nullable=False),
    sa.Column('reason', sa.String(length=16), nullable=False),
    sa.Column('batch', sa.String(length=100), nullable=True),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('not_before', sa.DateTime(), nullable=False),
    sa.Column('claim_token', sa.String(length=32), nullable=True),
    sa.Column('worker_id', sa.String(length=100), nullable=True),
    sa.Column('claimed_at', sa.DateTime(), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['submission_id'], ['submissions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_batch'), ['batch'], unique=False)
        batch_op.create_index('ix_jobs_claim_order', ['status', 'priority', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_lease_expires_at'), ['lease_expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_submission_id'), ['submission_id'], unique=False)

    op.create_table('results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('submission_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('origin', sa.String(length=16), nullable=False),
    sa.Column('regraded_from', sa.Integer(), nullable=True),
    sa.Column('verdict', sa.String(length=32), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('problem_id', sa.String(length=200), nullable=False),
    sa.Column('problem_version', sa.Integer(), nullable=False),
    sa.Column('size', sa.String(length=32), nullable=False),
    sa.Column('device', sa.String(length=8), nullable=True),
    sa.Column('device_name', sa.String(length=200), nullable=True),
    sa.Column('atol', sa.Double(), nullable=False),
    sa.Column('rtol', sa.Double(), nullable=False),
    sa.Column('speedup_vs_eager', sa.Double(), nullable=True),
    sa.Column('speedup_vs_compile', sa.Double(), nullable=True),
    sa.Column('candidate_ms', sa.Double(), nullable=True),
    sa.Column('eager_ms', sa.Double(), nullable=True),
    sa.Column('compile_ms', sa.Double(), nullable=True),
    sa.Column('harness_version', sa.String(length=32), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['submission_id'], ['submissions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id')
    )
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_results_device'), ['device'], unique=False)
        batch_op.create_index(batch_op.f('ix_results_problem_id'), ['problem_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_results_submission_id'), ['submission_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_results_verdict'), ['verdict'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_results_verdict'))
        batch_op.drop_index(batch_op.f('ix_results_submission_id'))
        batch_op.drop_index(batch_op.f('ix_results_problem_id'))
        batch_op.drop_index(batch_op.f('ix_results_device'))

    op.drop_table('results')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_submission_id'))
        batch_op.drop_index(batch_op.f('ix_jobs_lease_expires_at'))
        batch_op.drop_index('ix_jobs_claim_order')
        batch_op.drop_index(batch_op.f('ix_jobs_batch'))

    op.drop_table('jobs')
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_submissions_verdict'))
        batch_op.drop_index(batch_op.f('ix_submissions_token_id'))
        batch_op.drop_index(batch_op.f('ix_submissions_submitter'))
        batch_op.drop_index(batch_op.f('ix_submissions_status'))
        batch_op.drop_index(batch_op.f('ix_submissions_problem_id'))
        batch_op.drop_index(batch_op.f('ix_submissions_model'))
        batch_op.drop_index(batch_op.f('ix_submissions_created_at'))

    op.drop_table('submissions')
    op.drop_table('workers')
    op.drop_table('tokens')
