"""Load a KernelBench-format problem file in a child process, with its size overrides applied.

Imported by both children (the problem file is trusted code; it holds no secret).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from harness.evaluation.protocol import ProblemLoad
from harness.precision import DTYPE_NAMES


def dtype_of(precision: str) -> torch.dtype:
    """The torch dtype of a precision (harness.precision)."""
    dtype = getattr(torch, DTYPE_NAMES[precision])
    assert isinstance(dtype, torch.dtype)
    return dtype


def cast(obj: Any, dtype: torch.dtype) -> Any:
    """Floating-point tensors, alone or in lists and tuples, as `dtype`; anything else (an index, a mask, a number) as
    it is. A tensor already of `dtype` is itself, not a copy."""
    if isinstance(obj, torch.Tensor) and obj.is_floating_point():
        return obj.to(dtype)
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast(o, dtype) for o in obj)
    return obj


def _at_precision(fn: Callable[[], Any], dtype: torch.dtype) -> Callable[[], Any]:
    def made_at_precision() -> Any:
        return cast(fn(), dtype)

    return made_at_precision


def load_problem(load: ProblemLoad, module_name: str = "_harness_problem") -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, load.path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load problem file {load.path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    for name, value in load.overrides.items():
        if not hasattr(module, name):
            raise AttributeError(f"size override {name!r} names no constant of {load.path.name}")
        if isinstance(getattr(module, name), tuple) and isinstance(value, list):
            value = tuple(value)  # JSON has no tuples
        setattr(module, name, value)
    for fn in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, fn):
            raise AttributeError(f"problem file {load.path.name} defines no {fn}")
    # Every caller (the trials, the timed windows on both sides, the size probe) makes the inputs at the evaluation's
    # precision through these, as KernelBench casts what get_inputs() and get_init_inputs() return.
    dtype = dtype_of(load.precision)
    module.get_inputs = _at_precision(module.get_inputs, dtype)
    module.get_init_inputs = _at_precision(module.get_init_inputs, dtype)
    return module


def to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    return obj


def manual_seed(seed: int, device: torch.device) -> None:
    """What `torch.manual_seed(seed)` does for the generators a call on `device` draws from (the CPU's and that
    device's), without its pass over every backend: on an H100 host it costs 0.1 ms, paid per call inside a timed
    window. Both sides seed with this, so they draw alike."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        _cuda_generator(device).manual_seed(seed)


def _cuda_generator(device: torch.device) -> torch.Generator:
    torch.cuda.init()
    return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]


def seeded_inputs(module: ModuleType, seed: int, device: torch.device) -> list[Any]:
    """get_inputs() under a seed, made on `device` directly (no host round trip inside a timed window).

    The generators are seeded only for this and their states restored after, so neither their state nor
    `torch.initial_seed()` tells code that runs later which seed made the inputs. (What torch.random.fork_rng
    does, at a sixth of its host cost: a window makes every call's inputs.)"""
    generators = [torch.default_generator] + ([_cuda_generator(device)] if device.type == "cuda" else [])
    states = [g.get_state() for g in generators]
    try:
        manual_seed(seed, device)
        with device:
            inputs = list(module.get_inputs())
    finally:
        for g, state in zip(generators, states, strict=True):
            g.set_state(state)
    return to_device(inputs, device)


EXTRA_DISTRIBUTION = "randn*2+0.5"


def redistribute(inputs: list[Any]) -> list[Any]:
    """The extra trial's inputs: each floating-point tensor of get_inputs() redrawn as randn*2+0.5 (same
    shape and dtype), so values are negative, above 1 and spread wider than `rand`'s [0, 1). A kernel
    that only works for the default inputs (an input-range shortcut) fails here.

    Replaced in `inputs` one at a time, each let go before its draw and the draw scaled where it lies: the inputs
    and one draw are held at most (memory_plan.redistributed_bytes), where a new list of `randn * 2 + 0.5` held two
    temporaries beside every input (three times level1/45's 16 GiB input). The tensors get_inputs() returned are
    never written."""
    for j in range(len(inputs)):
        x = inputs[j]
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            shape, dtype, device = x.shape, x.dtype, x.device
            del x
            inputs[j] = None  # let go before the draw, unless get_inputs() keeps it elsewhere
            inputs[j] = torch.randn(shape, dtype=dtype, device=device).mul_(2).add_(0.5)
    return inputs


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA GPU")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
