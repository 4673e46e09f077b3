"""What the harness knows about a problem without importing its file."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from harness import precision as precisions
from harness import python_ast
from harness.problems.sizes import read_constants
from harness.schema import Tolerance

DEFAULT_TOLERANCE = precisions.KERNELBENCH_TOLERANCE["fp32"]  # KernelBench today, fp32
V01_TOLERANCE = Tolerance(atol=1e-2, rtol=1e-2)  # the KernelBench v0.1 tier


class SizeVariant(BaseModel):
    """Module constants to override before `get_inputs`/`get_init_inputs` run (empty: as in the file)."""

    overrides: dict[str, Any] = Field(default_factory=dict)
    flops: float | None = None  # for the speed-of-light floor
    min_bytes: float | None = None  # each input, parameter and output touched once, counted at fp32 (4 bytes)

    def min_bytes_at(self, precision: str) -> float | None:
        """`min_bytes` at `precision`: its floating-point elements take ELEMENT_BYTES each there, not 4."""
        if self.min_bytes is None:
            return None
        return self.min_bytes * precisions.ELEMENT_BYTES[precisions.check(precision)] / 4


class ProblemSpec(BaseModel):
    id: str
    version: int = 1
    kernelbench_id: str | None = None
    name: str  # the file's stem, KernelBench style: 75_Gemm_GroupNorm_Min_BiasAdd
    source_path: Path
    description: str = ""
    builtin: bool = False
    tolerance: Tolerance = DEFAULT_TOLERANCE
    compile_timeout_s: float = 600.0  # import of the submission: load_inline builds run here
    run_timeout_s: float = 300.0  # correctness trials and timing
    sizes: dict[str, SizeVariant] = Field(default_factory=lambda: {"default": SizeVariant()})
    init_arg_names: list[str] = Field(default_factory=list)
    # One more correctness trial on randn*2+0.5 inputs (negative, above 1); off where the op has a domain.
    extra_distribution: bool = True
    # The reference's parameters and buffers are drawn fresh for each evaluation (harness/evaluation/parameters.py);
    # these state-dict names (or prefixes) keep the problem's own initialisation, where their domain matters.
    fixed_parameters: list[str] = Field(default_factory=list)

    def tolerance_at(self, precision: str) -> Tolerance:
        """The tolerance of an evaluation at `precision` (precision.tolerance): `tolerance` is fp32's."""
        return precisions.tolerance(self.tolerance, precision)

    def size(self, name: str) -> SizeVariant:
        try:
            return self.sizes[name]
        except KeyError:
            raise KeyError(
                f"problem {self.id!r} has no size {name!r}; it has: {', '.join(sorted(self.sizes))}"
            ) from None

    @property
    def aliases(self) -> list[str]:
        names = [self.id, self.name]
        if self.kernelbench_id:
            names.append(self.kernelbench_id)
        return names

    def source(self) -> str:
        return self.source_path.read_text()

    @property
    def stochastic(self) -> list[str]:
        """What in the reference's Model draws random numbers (read from its source): non-empty, the problem is
        stochastic, and both sides of an evaluation run each call right after torch.manual_seed(the same fresh
        seed). An evaluation also tells it from the outputs (observations.stochastic_reference)."""
        try:
            return model_randomness(self.source())
        except (OSError, SyntaxError):
            return []


def module_constants(source: str) -> dict[str, str]:
    """Module-level constants as source text, read without importing (`height = width = 256` and
    `depth, height, width = 16, 32, 32` included: KernelBench writes sizes both ways)."""
    return {c.name: c.text or "?" for c in read_constants(source)}


# Calls that draw random numbers; a layer that does so in forward (dropout) is named by its class.
_RANDOM_CALLS = {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "dropout",
                 "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "bernoulli",
                 "bernoulli_", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal",
                 "normal_", "uniform_", "multinomial", "randperm", "poisson", "exponential_", "rrelu", "RReLU"}


def model_randomness(source: str) -> list[str]:
    """The random-number draws of class Model, sorted and unique: layers that draw in forward (Dropout), wherever
    they are built, and random calls in its methods other than __init__ (where they only initialise parameters)."""
    tree = python_ast.parse(source)
    found: set[str] = set()
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == "Model"):
            continue
        for method in node.body:
            if not isinstance(method, ast.FunctionDef):
                continue
            for call in ast.walk(method):
                if not isinstance(call, ast.Call):
                    continue
                f = call.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                    continue  # a layer of its own being called (self.dropout(x)): its construction counts
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name in _RANDOM_CALLS and (name[0].isupper() or method.name != "__init__"):
                    found.add(name)
    return sorted(found)


def model_init_arg_names(source: str) -> list[str]:
    """Positional parameters of `Model.__init__` after self (with defaults marked)."""
    tree = python_ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args.posonlyargs + item.args.args
                    return [a.arg for a in args[1:]]
    return []
