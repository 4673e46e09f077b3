"""All configuration in one place: environment variables with the HARNESS_ prefix."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HARNESS_", extra="ignore")

    data_dir: Path = Field(
        default=Path.home() / ".local" / "share" / "kernelharness",
        description="Build cache, per-job logs and the SQLite file live here.",
    )
    scratch_dir: Path | None = Field(
        default=None,
        description="Where evaluation temp dirs (inputs/outputs exchanged between processes) are made; "
        "system temp dir when unset.",
    )
    problems_dir: Path | None = Field(
        default=None, description="An external KernelBench-format folder to load problems from."
    )

    # Correctness
    correctness_trials: int = Field(default=5, ge=1, le=100)

    # Timing
    warmup_calls: int = Field(default=5, ge=0)
    timed_calls_cuda: int = Field(default=100, ge=1)
    timed_calls_cpu: int = Field(default=10, ge=1)
    compile_baseline: str = Field(
        default="auto", pattern="^(auto|on|off)$",
        description="Time torch.compile of the reference too; 'auto' does so on CUDA only.",
    )

    # Deadlines the parent enforces (seconds). Problem specs may raise compile/run limits.
    reference_timeout_s: float = 600.0
    kill_grace_s: float = 3.0

    # Build cache
    build_cache: bool = Field(default=True, description="Reuse load_inline builds keyed by source hash.")

    # Service: database
    database_url: str | None = Field(
        default=None, description="Any SQLAlchemy URL; unset, the SQLite file <data_dir>/harness.db (WAL mode).",
    )
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0,
                                        description="How long a SQLite writer waits for the lock before failing.")

    # Service: API
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    open_mode: bool = Field(
        default=False, description="Accept submissions without a token (local single-user use; loopback only). "
        "Re-evaluation and deletion still need an admin token.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="Larger request bodies get 413.")
    max_queued_per_token: int = Field(default=100, ge=1,
                                      description="Unfinished submissions one token may have; admins are exempt.")

    # Service: queue and workers
    lease_s: float = Field(default=120.0, gt=0,
                           description="A claimed job whose worker sends no heartbeat for this long is requeued.")
    max_attempts: int = Field(default=3, ge=1, description="Evaluations of one job before infra_error is final.")
    retry_delay_s: float = Field(default=10.0, ge=0, description="Wait before retrying a job after an infra_error.")
    worker_poll_s: float = Field(default=1.0, gt=0, description="How often an idle worker looks for jobs.")
    compile_workers: int | None = Field(
        default=None, ge=0, description="Threads precompiling queued submissions ahead of the GPU slots; "
        "unset: half the CPU cores (up to 8) on a GPU worker, 0 on a CPU-only one.",
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
