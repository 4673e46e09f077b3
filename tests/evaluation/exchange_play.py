"""The candidate's side of the exchange, played in this process against a trusted side's segments (no children):
outputs packed where a candidate's process packs them, then taken and judged as the trusted process does."""

from __future__ import annotations

from typing import Any

import torch

from harness.evaluation import exchange
from harness.evaluation.protocol import CheckHandoverCommand, TakeCommand


def take(side: Any, trial: int | None, out: Any, atol: float = 1e-4, rtol: float = 1e-4) -> dict[str, Any]:
    """`out` packed into the output segment as trial `trial`'s (None: the determinism re-run's), then taken."""
    layout = exchange.pack(out, side.segments["output"])
    return side.take(TakeCommand(trial=trial, layout=layout, atol=atol, rtol=rtol))


def take_all(side: Any, prepared: dict[str, Any], output: Any) -> None:
    """Every trial's output (`output(i)`), then the determinism re-run's (`output(0)`), taken in turn."""
    for i in range(len(prepared["distributions"])):
        take(side, i, output(i))
    take(side, None, output(0))


def handover_command(side: Any, outs: list[torch.Tensor], seeds: list[int], forward_seeds: list[int],
                     **kw: Any) -> CheckHandoverCommand:
    """`outs` packed one to a slot of the hand-over segment; the command that checks them."""
    seg = side.segments["handover"]
    slot = seg.nbytes // max(len(outs), 1)
    layouts = [exchange.pack(o, seg, k * slot) for k, o in enumerate(outs)]
    return CheckHandoverCommand(layouts=layouts, seeds=seeds, forward_seeds=forward_seeds, atol=1e-4, rtol=1e-4,
                                **kw)
