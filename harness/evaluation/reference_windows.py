"""The reference's side of the timed rounds (rounds.py drives them): its windows (eager, torch.compile, and the empty
window whose cost every window carries), their staged inputs and lead-ins, the wait for an idle GPU before each, and the
fingerprints of the last window's outputs. Commands of the trusted process (trusted.py's main() sends them here); what
they hold between commands is theirs alone, and what they take of the trusted side's is `ReferenceSide`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import torch

from harness.evaluation import exchange, problem_module, tensors, timing
from harness.evaluation.protocol import (
    EAGER_WINDOW_SEGMENT,
    WINDOW_SEGMENT,
    FillWindowCommand,
    FingerprintCommand,
    LeadInCommand,
    ReferenceWindowCommand,
    StageWindowCommand,
)

# A probe kernel (and its sync) slower than this ran behind another process's work: the GPU is not idle.
IDLE_PROBE_S = 0.5e-3


class ReferenceSide(Protocol):
    """What the windows take from the trusted side (trusted.Trusted): the reference it built, where it runs, the L2
    flush buffer, and the evaluation's segments, to which a window segment is added and shared."""

    model: torch.nn.Module | None
    module: Any
    device: torch.device
    flush: torch.Tensor | None
    exchange_where: str
    segments: dict[str, exchange.Segment]

    def share(self, segments: dict[str, exchange.Segment]) -> list[dict[str, Any]]: ...


class ReferenceWindows:
    def __init__(self, side: ReferenceSide) -> None:
        self.side = side
        self.compiled: Any = None  # torch.compile's Model, made in its first window; None again where it is rebuilt
        self.window_outputs: list[Any] = []  # the last eager window's, until they are fingerprinted
        # A window's inputs (`stage_window`): this process's own, which its lead-ins and windows use and `fill_window`
        # copies into the window segment for the candidate's.
        self.window_inputs: list[list[Any]] = []
        self.staged_seeds: list[int] = []  # the seeds `window_inputs` were made from
        self.handed = False  # whether a model of this process was handed `window_inputs` since they were made

    def release(self) -> None:
        """The evaluation's window inputs and outputs let go (`Trusted.release`); the compiled Model is kept."""
        self.window_outputs, self.window_inputs, self.staged_seeds = [], [], []

    def window(self, cmd: ReferenceWindowCommand) -> dict[str, Any]:
        """One reference window (its time is the parent's clock around this command). A kind's first window warms
        it up; torch.compile's compiles the model there."""
        assert self.side.model is not None
        fn: Any = self.side.model
        if cmd.kind == "empty":
            fn = timing.empty_call
        elif cmd.kind == "compile":
            if self.compiled is None:
                self.compiled = torch.compile(self.side.model)
            fn = self.compiled
        self.window_outputs = []
        kept: list[Any] = []  # the candidate keeps its window's outputs too: the allocator sees the same
        staged = self.window_inputs if cmd.staged else None
        if staged is not None and len(staged) != len(cmd.seeds):
            raise ValueError(f"{len(staged)} calls' inputs staged for a window of {len(cmd.seeds)}")
        self.handed = self.handed or bool(staged)
        seen = timing.run_window(fn, self.side.module, cmd.seeds, cmd.forward_seeds, self.side.device,
                                 self.side.flush if cmd.flush_l2 else None, keep=kept, inputs=staged)
        if cmd.keep_outputs:
            self.window_outputs = kept
        del kept
        return seen

    def stage_window(self, cmd: StageWindowCommand) -> dict[str, Any]:
        """A window's inputs, made from its seeds before it (off every clock) and kept. A round's kinds share its
        seeds: the inputs are made once for them, and anew only once a model of this process was handed them (a
        reference that writes into its inputs leaves them changed). The candidate's and eager's processes only ever
        get copies (`fill_window`). Made for every kind's window, they took level1/19's lead-ins on the 2-core CPU
        to 21.0 s of a 121 s evaluation (10.2 s made once a round; docs/kernelbench.md). The reply's layout says
        where `fill_window` will write them for the candidate, each call's from where the last one's ends, in a
        window segment as large as they need (a new one, named in the reply, where the last was smaller).
        `stageable` is False where an input is no plain dense tensor or JSON scalar (the windows then make their
        inputs)."""
        if cmd.seeds != self.staged_seeds or self.handed:
            self.window_inputs, self.staged_seeds = [], []  # the last ones let go first
            with torch.no_grad():
                made = [problem_module.seeded_inputs(self.side.module, seed, self.side.device) for seed in cmd.seeds]
                problem_module.synchronize(self.side.device)
            self.window_inputs, self.staged_seeds, self.handed = made, list(cmd.seeds), False
        made = self.window_inputs
        if not all(tensors.stageable(v) for x in made for v in x):
            return {"layout": [], "segments": [], "stageable": False}
        need = sum(exchange.packed_bytes(x) for x in made)
        grown: dict[str, exchange.Segment] = {}
        for name in (WINDOW_SEGMENT, EAGER_WINDOW_SEGMENT) if cmd.eager else (WINDOW_SEGMENT,):
            seg = self.side.segments.get(name)
            if seg is None or seg.nbytes < need:
                if seg is not None:
                    seg.close()
                grown[name] = exchange.create(max(need, 1), self.side.exchange_where)
        specs = self.side.share(grown) if grown else []
        seg = self.side.segments[WINDOW_SEGMENT]
        layouts, base = [], 0
        for x in made:
            layouts.append(exchange.pack(list(x), seg, base, write=False))
            base += exchange.packed_bytes(x)
        return {"layout": layouts, "segments": specs, "stageable": True}

    def fill_window(self, cmd: FillWindowCommand) -> dict[str, Any]:
        """The staged inputs written into the window segment named, over whatever its process left there."""
        seg, base = self.side.segments[cmd.segment], 0
        for x in self.window_inputs:
            exchange.pack(list(x), seg, base)
            base += exchange.packed_bytes(x)
        problem_module.synchronize(self.side.device)
        return {}

    def lead_in(self, cmd: LeadInCommand) -> dict[str, Any]:
        """Untimed calls right before a window of `cmd.kind`, on the staged inputs (the reference's, for the empty
        window too: its fixed cost is then measured in a process as warm as the others'; torch.compile's once it
        has compiled, in its first window)."""
        assert self.side.model is not None
        fn: Any = self.compiled if cmd.kind == "compile" and self.compiled is not None else self.side.model
        self.handed = self.handed or (cmd.calls > 0 and bool(self.window_inputs))
        timing.lead_in(fn, self.window_inputs, cmd.calls, self.side.device, self.side.flush if cmd.flush_l2 else None)
        return {}

    def wait_idle(self, limit_s: float) -> dict[str, Any]:
        """Wait until no other process's work is queued on this GPU, up to `limit_s`: a tiny kernel and a sync take
        0.06 ms on an idle H100 and 1.3-1.5 ms while another process's kernels wait their turn (the GPU slices
        its time between processes). What a candidate left running after its reply is waited out here, off every
        window's clock, and said: how long (ms), and whether the GPU was still busy at the limit."""
        if self.side.device.type != "cuda":
            return {"waited_ms": 0.0, "busy": False}
        probe = torch.zeros(1, device=self.side.device)
        t0 = time.perf_counter()
        while True:
            t = time.perf_counter()
            probe.add_(1)
            torch.cuda.synchronize(self.side.device)
            if time.perf_counter() - t < IDLE_PROBE_S:
                return {"waited_ms": round((t - t0) * 1e3, 4), "busy": False}
            if t - t0 > limit_s:
                return {"waited_ms": round((t - t0) * 1e3, 4), "busy": True}
            time.sleep(IDLE_PROBE_S)

    def fingerprint(self, cmd: FingerprintCommand) -> dict[str, Any]:
        """The last window's outputs fingerprinted as the candidate's are (the fingerprint step on this process's
        own clock is what an honest fingerprint costs), and each one's scale of an error within the tolerance;
        then they are let go."""
        clock = timing.Clock(self.side.device)
        sums = timing.fingerprints(self.window_outputs, cmd.key, self.side.device)
        # The candidate's command also writes its numbers into its reply (a window of 2000 calls: 1-3 ms on a 2-core
        # host): an honest fingerprint command's cost, counted here too so that it is not charged to the window.
        json.dumps(sums)
        clock.lap("fingerprint")
        scales = timing.fingerprint_scales(self.window_outputs, cmd.atol, cmd.rtol)
        self.window_outputs = []
        clock.lap("scales")
        return {"sums": sums, "scales": scales, "seconds": clock.seconds}

