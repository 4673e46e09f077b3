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
        description="Build cache, per-job logs and (later) the SQLite file live here.",
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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
