"""What one evaluation is asked for: its device, size, precision, tolerance and limits, and what a worker's slot lends
it (its probed target, its warm trusted process). No torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.evaluation.warm import TrustedPool
from harness.schema import Precision, Provenance, Tolerance


@dataclass
class EvalOptions:
    device: str = "auto"  # auto | cpu | cuda
    size: str = "auto"  # auto (default on CUDA, small on CPU: every problem has one, `reduced_size`) or a size name
    tolerance: Tolerance | None = None  # the problem's own at the precision when None
    precision: Precision = "fp32"  # inputs, parameters and both models cast to it (harness/precision.py)
    trials: int | None = None
    timing: bool = True
    compile_baseline: str | None = None  # auto | on | off; settings' when None
    windows: int | None = None  # timed windows of each kind; the settings' for the device when None
    compile_timeout_s: float | None = None  # the problem's own when None
    run_timeout_s: float | None = None
    seed: int | None = None  # fixes the secret seeds, for reproducing a run
    # False traces no timed window's launches (one window slowed by CUPTI's callbacks): for benchmarks of timing
    # alone, whose results then carry no kernel evidence (no no_custom_kernel flag either way).
    kernel_trace: bool = True
    # False keeps the reference's parameters at the problem's own initialisation (as KernelBench evaluates), for
    # reproducing a result graded before they were drawn fresh.
    fresh_parameters: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    # The device as a worker's slot probed it: with it, the candidate's process starts beside the trusted one
    # instead of after its probe (and starts again after it, if the trusted child finds something else).
    target: Provenance | None = None
    # A slot's warm trusted process, kept between its evaluations (see warm.py); None: one for this evaluation.
    trusted_pool: TrustedPool | None = None
    # Called once the candidate is built (imported and constructed: its load_inline builds are done), so that a
    # worker can show the job as compiling until then. Nothing of the evaluation depends on it.
    built: Callable[[], None] | None = None
