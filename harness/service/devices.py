"""Which evaluation slots a worker runs: one per GPU, each pinned to its GPU, or one CPU slot.

Found without importing torch: CUDA_VISIBLE_DEVICES when the operator set it, else nvidia-smi;
when neither says anything, one probe child asks torch.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from harness.config import Settings
from harness.evaluation.prebuild import probe_device
from harness.schema import Provenance

log = logging.getLogger("harness.worker")


class SlotError(ValueError):
    """The --gpus value names GPUs this machine does not have."""


@dataclass
class Slot:
    name: str  # "cuda:0", "cpu"
    device: str  # "cuda" | "cpu": what EvalOptions asks for
    env: dict[str, str] = field(default_factory=dict)  # pins the slot's children to its GPU
    target: Provenance | None = None  # what a child on this slot sees (set by probe())

    def describe(self) -> str:
        if self.target is None:
            return self.name
        return f"{self.name} {self.target.device_name}"


def visible_gpus() -> list[str] | None:
    """GPU ids a child may be pinned to; None when this cannot be told without torch."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = []
        for part in (p.strip() for p in cvd.split(",")):
            if not part or part == "-1":
                break  # CUDA ignores every id after an invalid one
            ids.append(part)
        return ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("nvidia-smi failed (%s); looking for GPUs through torch instead", e)
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def cuda_device_missing(settings: Settings) -> str | None:
    """Why this process's children would see no CUDA device, or None when they would see one (or when
    it cannot be told: the evaluation's own probe then has the last word)."""
    visible = visible_gpus()
    if visible is None:
        try:
            seen = probe_device("auto", settings)
        except RuntimeError as e:
            log.warning("could not tell whether a CUDA device is visible: %s", e)
            return None
        return None if seen.device == "cuda" else "torch in a fresh process finds no CUDA device"
    if visible:
        return None
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU"
    return "nvidia-smi lists no GPU"


def _gpu_slot(index: int, gpu_id: str) -> Slot:
    # PCI bus order makes CUDA's numbering nvidia-smi's, so "1" names the same GPU to both.
    return Slot(name=f"cuda:{index}", device="cuda",
                env={"CUDA_VISIBLE_DEVICES": gpu_id, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})


def plan_slots(gpus: str, settings: Settings) -> list[Slot]:
    """Slots for `--gpus all|none|0,1`: indices count among the GPUs visible to this process."""
    choice = gpus.strip().lower()
    if choice in ("none", "cpu"):
        return [Slot(name="cpu", device="cpu")]
    visible = visible_gpus()
    if visible is None:
        # No nvidia-smi: ask a child. It sees every GPU, so one unpinned slot is all we can safely run.
        seen = probe_device("auto", settings)
        if seen.device == "cuda":
            log.warning("nvidia-smi not found: running one slot that sees all GPUs; set CUDA_VISIBLE_DEVICES "
                        "to run one slot per GPU")
            return [Slot(name="cuda", device="cuda", target=seen)]
        visible = []
    if choice == "all":
        if not visible:
            log.warning("no GPU found: evaluating on the CPU at the problems' small sizes; these results are "
                        "CPU results, never ranked with GPU results")
            return [Slot(name="cpu", device="cpu")]
        return [_gpu_slot(i, gpu) for i, gpu in enumerate(visible)]
    try:
        wanted = [int(p) for p in choice.split(",") if p.strip()]
    except ValueError:
        raise SlotError(f"--gpus takes all, none or GPU indices such as 0,1; got {gpus!r}") from None
    if not wanted:
        raise SlotError("--gpus names no GPU")
    missing = [i for i in wanted if not 0 <= i < len(visible)]
    if missing:
        raise SlotError(f"no GPU {', '.join(map(str, missing))}: this machine shows {len(visible)} "
                        f"(indices 0 to {len(visible) - 1})" if visible else "this machine shows no GPU")
    if len(set(wanted)) != len(wanted):
        raise SlotError("--gpus names a GPU twice; one slot per GPU keeps timings honest")
    return [_gpu_slot(i, visible[i]) for i in wanted]


def probe(slots: list[Slot], settings: Settings) -> list[Slot]:
    """Ask a child on each slot what it sees; a slot whose probe fails is dropped (and logged)."""
    ready = []
    for slot in slots:
        if slot.target is None:
            try:
                slot.target = probe_device(slot.device, settings, slot.env)
            except RuntimeError as e:
                log.error("slot %s is unusable and is left out: %s", slot.name, e)
                continue
        ready.append(slot)
    return ready
