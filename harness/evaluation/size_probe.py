"""Find a size at which a problem's forward pass fits a time budget: `python -m harness.evaluation.size_probe
--channel-fd N`, one JSON request on stdin, one `sized` (or `failed`) message back.

Only the problem file (trusted code) is loaded here, never a submission. Each candidate size is first
built on the `meta` device, where shapes propagate without memory or arithmetic: that proves the sizes
consistent (a kernel larger than its input, channels not divisible by groups raise there) and gives its
FLOPs and the bytes every operation writes. Those are priced with this machine's measured matmul rate and
memory bandwidth. The chosen size is then run for real once, and that run's time is what is reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from harness.evaluation.problem_module import load_problem, resolve_device, synchronize
from harness.evaluation.protocol import Channel, ProblemLoad
from harness.problems.sizes import SizeSpace, describe

# A size whose inputs and parameters alone take this many budgets to touch is not run for real to price
# it (where the meta device cannot): it is shrunk on that lower bound first.
_REAL_RUN_GUARD = 10.0
# A measured forward slower than this many budgets sends the search on, now on measured times.
_MEASURED_SLACK = 4.0
# Operations traced on the meta device before a forward pass is priced by running it instead.
_MAX_META_OPS = 2000
# The longest priced forward pass run for real when no size fits the budget (a VGG fixes its image size
# at 224 in get_inputs: batch 1 is as small as it gets). Prices of convolution stacks run high: VGG16 at
# batch 1 was priced at 0.92 s and measured at 0.67 s, VGG19 priced at 2.67 s.
_MAX_CALL_S = 5.0
# Larger sizes tried, newest first, when the chosen one fails for real but passed on the meta device.
_FALLBACKS = 3


@dataclass
class Rates:
    flops_per_s: float
    bytes_per_s: float


@dataclass
class Estimate:
    ok: bool
    cost_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    method: str = "meta"  # meta | measured | input-bound | lower-bound
    error: str = ""


@dataclass
class Search:
    choice: dict[str, int]  # slot key -> value
    estimate: Estimate | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)  # every size tried, in order
    accepted: list[dict[str, int]] = field(default_factory=list)  # the larger choices passed on the way

    def step(self, tried: str, est: Estimate) -> None:
        self.steps.append({"try": tried, "ok": est.ok, "cost_s": est.cost_s, "method": est.method,
                           "error": est.error})


class _TooManyOps(Exception):
    """Tracing on the meta device costs far more per operation than running it: a forward pass of many
    small operations (a recurrent network over a long sequence) is priced by running it instead."""


class _Traffic(TorchDispatchMode):
    """Bytes of every tensor every operation returns: what a forward pass writes, intermediates included."""

    def __init__(self, max_ops: int) -> None:
        super().__init__()
        self.bytes = 0
        self.ops = 0
        self.max_ops = max_ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        if self.ops > self.max_ops:
            raise _TooManyOps()
        out = func(*args, **(kwargs or {}))
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def calibrate(device: torch.device) -> Rates:
    """This machine's matmul FLOP rate and copy bandwidth now, best of a few tries (others share the cores)."""
    a = torch.randn(512, 512, device=device)
    x = torch.randn(8 << 20, device=device)

    def best(fn) -> float:  # type: ignore[no-untyped-def]
        times = []
        for _ in range(3):
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times)

    mm_s = best(lambda: a @ a)
    copy_s = best(lambda: x * 2)
    return Rates(flops_per_s=2 * 512**3 / mm_s, bytes_per_s=2 * x.numel() * x.element_size() / copy_s)


def _held_bytes(model: torch.nn.Module, inputs: list[Any]) -> int:
    tensors = [*model.parameters(), *model.buffers(), *(t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


class Prober:
    def __init__(self, path: Path, device: torch.device, budget_s: float):
        self.path = path
        self.device = device
        self.budget_s = budget_s
        self.rates = calibrate(device)
        self._loads = 0

    def _module(self, overrides: dict[str, Any]):  # type: ignore[no-untyped-def]
        self._loads += 1
        return load_problem(ProblemLoad(path=self.path, overrides=overrides), f"_harness_size_probe_{self._loads}")

    def on_meta(self, overrides: dict[str, Any]) -> Estimate:
        module = self._module(overrides)
        torch.manual_seed(0)
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
            inputs = list(module.get_inputs())
            held = _held_bytes(model, inputs)
            traffic = _Traffic(_MAX_META_OPS)
            try:
                with torch.no_grad(), FlopCounterMode(display=False) as flops, traffic:
                    model(*inputs)
                complete = True
            except _TooManyOps:
                complete = False
        total_flops, total_bytes = float(flops.get_total_flops()), float(held + traffic.bytes)
        cost = total_flops / self.rates.flops_per_s + total_bytes / self.rates.bytes_per_s
        if complete:
            return Estimate(True, cost, total_flops, total_bytes)
        if cost > _REAL_RUN_GUARD * self.budget_s:  # what was traced so far already costs too much to run
            return Estimate(True, cost, total_flops, total_bytes, method="lower-bound")
        return self.measured(overrides)

    def measured(self, overrides: dict[str, Any]) -> Estimate:
        """Real forward passes, the fastest of up to three (the first pays for lazy initialisation); fewer
        where they already took several budgets."""
        module = self._module(overrides)
        torch.manual_seed(0)
        with self.device:
            model = module.Model(*module.get_init_inputs()).to(self.device)
            inputs = list(module.get_inputs())
        times = []
        with torch.no_grad():
            for _ in range(3):
                synchronize(self.device)
                t0 = time.perf_counter()
                model(*inputs)
                synchronize(self.device)
                times.append(time.perf_counter() - t0)
                if sum(times) > _MEASURED_SLACK * self.budget_s:
                    break
        return Estimate(True, min(times), bytes=float(_held_bytes(model, inputs)), method="measured")

    def input_bound(self, overrides: dict[str, Any]) -> Estimate:
        """Where the meta device cannot run the forward pass (an op without a meta kernel, `.item()`): build
        on meta to price touching inputs and parameters once; run for real only if that is affordable."""
        module = self._module(overrides)
        torch.manual_seed(0)
        with torch.device("meta"):
            inputs = list(module.get_inputs())
            try:
                model = module.Model(*module.get_init_inputs())
            except Exception:  # a constructor that reads values (`.item()` on a linspace): its parameters are real
                model = None
        if model is None:
            model = module.Model(*module.get_init_inputs())
        held = _held_bytes(model, inputs)
        bound = held / self.rates.bytes_per_s
        if bound > _REAL_RUN_GUARD * self.budget_s:
            return Estimate(True, bound, bytes=float(held), method="input-bound")
        return self.measured(overrides)

    def price(self, overrides: dict[str, Any], how: str) -> Estimate:
        """`how`: meta, input-bound (meta for the inputs, then a real run if affordable) or measured."""
        pricing = {"meta": self.on_meta, "input-bound": self.input_bound, "measured": self.measured}[how]
        try:
            return pricing(overrides)
        except Exception as e:  # an invalid size (or a problem that does not run): the search steps back
            return Estimate(False, error=f"{type(e).__name__}: {str(e)[:300]}")


def _memory_available() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def _too_big_to_run(est: Estimate) -> str:
    """Why a priced size must not be run for real ("" when it may): more than a quarter of the memory
    available now, or more than `_MAX_CALL_S` a call (an evaluation makes dozens of calls)."""
    if est.bytes > _memory_available() / 4:
        return f"writes {est.bytes / 2**30:.1f} GiB a call, over a quarter of the memory available"
    if est.cost_s > _MAX_CALL_S:
        return f"is priced at {est.cost_s:.3g} s a call, over {_MAX_CALL_S:g} s"
    return ""


def search(space: SizeSpace, price: Callable[[dict[str, Any]], Estimate], budget_s: float,
           start: dict[str, int] | None = None, deadline: float = float("inf")) -> Search:
    """Halve sizes (batch first, then the largest) until the priced cost fits `budget_s`. A halving whose
    size fails to build is undone and that size left alone."""
    found = Search(choice=dict(start or {}))
    found.estimate = est = price(space.overrides(found.choice))
    found.step(describe(space.overrides(found.choice)), est)
    frozen: set[str] = set()
    while est.ok and est.cost_s > budget_s and time.monotonic() < deadline:
        key = space.next_halving(found.choice, frozen)
        if key is None:
            break
        alone = space.halved(found.choice, key, frozen, together=False)
        for together in (False, True):
            trial = space.halved(found.choice, key, frozen, together)
            if together and trial == alone:
                break  # no other size has the same value: nothing new to try
            trial_est = price(space.overrides(trial))
            found.step(" ".join(f"{k}={v}" for k, v in trial.items() if found.choice.get(k) != v), trial_est)
            if trial_est.ok:
                found.accepted.append(found.choice)
                found.choice, found.estimate = trial, trial_est
                est = trial_est
                break
        else:
            frozen.add(key)
            continue
        if not trial_est.ok:
            frozen.add(key)
    return found


def size_problem(path: Path, device_name: str, budget_s: float, time_limit_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + time_limit_s
    space = SizeSpace(path.read_text())
    prober = Prober(path, resolve_device(device_name), budget_s)
    how = "meta" if prober.price({}, "meta").ok else "input-bound"
    found = search(space, lambda o: prober.price(o, how), budget_s, deadline=deadline)
    est = found.estimate
    assert est is not None
    if not est.ok:
        missing = est.error.startswith("ModuleNotFoundError")
        hint = "; the problem file imports a module this environment lacks: install it" if missing else ""
        return {"ok": False, "error": f"the problem does not build at its own sizes: {est.error}{hint}",
                "steps": found.steps}
    too_big = _too_big_to_run(est)
    if too_big:  # the smallest size that builds is still over budget, and too large to run for real
        return {"ok": False, "error": f"no size found within the budget: the smallest that builds "
                f"({describe(space.overrides(found.choice))}) {too_big}", "steps": found.steps}
    real = est if est.method == "measured" else prober.price(space.overrides(found.choice), "measured")
    for previous in reversed(found.accepted[-_FALLBACKS:]):  # a size the meta device accepted, a real run not
        if real.ok:
            break
        found.step(describe(space.overrides(found.choice)), real)
        found.choice = previous
        real = prober.price(space.overrides(found.choice), "measured")
    if real.ok and real.cost_s > _MEASURED_SLACK * budget_s:  # the estimate was too kind: go on, measuring
        more = search(space, lambda o: prober.price(o, "measured"), budget_s, start=found.choice, deadline=deadline)
        found.steps.extend(more.steps[1:])
        found.choice, real = more.choice, more.estimate or real
    if not real.ok:
        return {"ok": False, "error": f"no size found that runs: {real.error}", "steps": found.steps}
    overrides = space.overrides(found.choice)
    return {"ok": True, "overrides": overrides, "size": describe(overrides), "estimate": asdict(est),
            "forward_s": real.cost_s, "priced_on": how, "rates": asdict(prober.rates), "budget_s": budget_s,
            "steps": found.steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel-fd", type=int, required=True)
    args = parser.parse_args(argv)
    chan = Channel(args.channel_fd)
    request = json.loads(sys.stdin.readline())
    torch.set_num_threads(int(request.get("threads", torch.get_num_threads())))
    try:
        chan.send("sized", **size_problem(Path(request["path"]), request.get("device", "cpu"),
                                          float(request["budget_s"]), float(request.get("time_limit_s", 120))))
    except Exception as e:
        chan.send("failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
