"""What the service's commands share: settings with command-line overrides, logging, a ready worker."""

from __future__ import annotations

import logging
import sys
from typing import Any

from harness.config import Settings
from harness.db.session import Database
from harness.problems import Registry
from harness.sandbox import capabilities
from harness.service.devices import Slot, plan_slots, probe
from harness.service.worker import Worker

log = logging.getLogger("harness.worker")


def settings_with(**overrides: Any) -> Settings:
    """Settings from the environment, with the options a command was given (None: not given) on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def ready_slots(gpus: str, settings: Settings) -> list[Slot]:
    """Plan the slots for --gpus and probe each; raises SlotError for a bad --gpus, RuntimeError for none usable."""
    slots = probe(plan_slots(gpus, settings), settings)
    if not slots:
        raise RuntimeError("no evaluation slot could start (see the log above)")
    return slots


def make_worker(db: Database, settings: Settings, registry: Registry, gpus: str, **options: Any) -> Worker:
    """A worker ready to run; raises UnsafeSandbox (a RuntimeError) when children cannot be confined."""
    capabilities.check_safe(settings)
    return Worker(db, settings, registry, ready_slots(gpus, settings), **options)
