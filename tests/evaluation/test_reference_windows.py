"""The trusted side's window inputs (reference_windows.ReferenceWindows.stage_window): a round's kinds share its seeds,
so its inputs are made once for them, and made again only once a model of the trusted process was handed them (a
reference that writes into its inputs must not hand the next window changed ones)."""

from __future__ import annotations

import types
from typing import Any

import torch

from harness.evaluation import exchange
from harness.evaluation.protocol import FillWindowCommand, LeadInCommand, ReferenceWindowCommand, StageWindowCommand
from harness.evaluation.reference_windows import ReferenceWindows


class _WritesIntoItsInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1.0)


class _Side:
    """What ReferenceWindows takes of the trusted side, on the CPU, counting the inputs it makes."""

    def __init__(self) -> None:
        self.made = 0

        def get_inputs() -> list[Any]:
            self.made += 1
            return [torch.rand(4, 8)]

        self.module = types.SimpleNamespace(get_inputs=get_inputs)
        self.model: torch.nn.Module | None = _WritesIntoItsInput()
        self.device = torch.device("cpu")
        self.flush = None
        self.exchange_where = "cpu"
        self.segments: dict[str, exchange.Segment] = {}

    def share(self, segments: dict[str, exchange.Segment]) -> list[dict[str, Any]]:
        self.segments.update(segments)
        return [{"name": name} for name in segments]


def _filled(side: _Side, windows: ReferenceWindows, reply: dict[str, Any]) -> list[torch.Tensor]:
    """The inputs as the candidate would see them: the window segment, filled, read at the reply's layout."""
    windows.fill_window(FillWindowCommand())
    seg = side.segments["window"]
    return [exchange.unpack(layout, seg, side.device)[0].clone() for layout in reply["layout"]]


def test_a_rounds_kinds_share_its_inputs_until_a_model_of_the_trusted_process_is_handed_them():
    side = _Side()
    windows = ReferenceWindows(side)
    seeds = [11, 12, 13]
    first = windows.stage_window(StageWindowCommand(seeds=seeds))
    fresh = _filled(side, windows, first)
    assert side.made == 3
    # Eager's process and the candidate get copies: the same seeds' inputs are not made again.
    second = windows.stage_window(StageWindowCommand(seeds=seeds))
    assert side.made == 3 and second["layout"] == first["layout"] and second["segments"] == []
    assert all(torch.equal(a, b) for a, b in zip(fresh, _filled(side, windows, second), strict=True))
    # A lead-in in the trusted process runs the reference on them, which writes into them: made again.
    windows.lead_in(LeadInCommand(kind="compile", calls=2))
    windows.stage_window(StageWindowCommand(seeds=seeds))
    assert side.made == 6
    assert all(torch.equal(a, b) for a, b in zip(fresh, _filled(side, windows, second), strict=True))
    # A window on the staged inputs hands them over too.
    windows.window(ReferenceWindowCommand(kind="eager", seeds=seeds, forward_seeds=[1, 2, 3], staged=True))
    windows.stage_window(StageWindowCommand(seeds=seeds))
    assert side.made == 9
    assert all(torch.equal(a, b) for a, b in zip(fresh, _filled(side, windows, second), strict=True))
    # Other seeds are other inputs; after a release nothing is reused.
    windows.stage_window(StageWindowCommand(seeds=[21, 22, 23]))
    assert side.made == 12
    windows.release()
    windows.stage_window(StageWindowCommand(seeds=[21, 22, 23]))
    assert side.made == 15
