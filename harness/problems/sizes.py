"""Reduced sizes for a KernelBench-format file, derived from its module-level size constants. No torch.

A KernelBench file states its sizes as module constants (`batch_size = 4096`, `dim = 393216`,
`bias_shape = (out_channels, 1, 1)`), read by `get_inputs()`/`get_init_inputs()` when they run. To run a
problem at a smaller size, some of those constants are overridden. Two things keep the result a valid
problem: constants computed from others (`bias_shape`, `num_channels = embed_dim`) are recomputed from the
new values, and shape-defining parameters (kernel sizes, strides, groups, heads...) are never touched.
Whether a candidate is valid is decided by building it (`harness.evaluation.size_probe`); this module only
proposes candidates.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any

from harness import python_ast

# Constants whose value shapes the computation rather than sizing it: halving one changes the problem
# (or breaks it: a kernel larger than its input, channels no longer divisible by groups).
STRUCTURAL = re.compile(
    r"kernel|stride|pad|dilation|group|head|pool|eps|momentum|drop|layers$|ratio|stage|classes$|"
    r"scale|factor|value|_min$|_max$|axis|alpha|beta|slope|divisor|multiplier|constant|weight",
    re.IGNORECASE,
)
BATCH = re.compile(r"batch", re.IGNORECASE)
# Only sizes at least this large are halved, and never below half of it: small sizes are usually
# structure (channels of an image, a head count) and cost little.
MIN_SHRINKABLE = 16
# A batch may go down to one sample.
MIN_BATCH = 1

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class _Unknown(Exception):
    """An expression this module does not evaluate (a call, an attribute): its constant is left alone."""


@dataclass(frozen=True)
class Constant:
    name: str
    expr: ast.expr
    text: str
    refs: frozenset[str]  # names of other module constants the expression reads


@dataclass(frozen=True)
class Slot:
    """One size that may be halved: a whole constant (`key == name`) or an element of a list/tuple one."""

    key: str  # "batch_size", "layer_sizes[1]"
    name: str
    index: int | None
    value: int

    @property
    def is_batch(self) -> bool:
        return bool(BATCH.search(self.name))

    @property
    def floor(self) -> int:
        return MIN_BATCH if self.is_batch else MIN_SHRINKABLE // 2


def _evaluate(node: ast.expr, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unknown(node.id)
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_evaluate(e, env) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_evaluate(node.left, env), _evaluate(node.right, env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, env))
    raise _Unknown(ast.dump(node)[:60])


def read_constants(source: str) -> list[Constant]:
    """Module-level `NAME = expr` assignments, in file order."""
    tree = python_ast.parse(source)
    found: list[Constant] = []

    def add(name: str, value: ast.expr) -> None:
        refs = frozenset(n.id for n in ast.walk(value) if isinstance(n, ast.Name))
        found.append(Constant(name, value, ast.get_source_segment(source, value) or "", refs))

    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:  # `height = width = 256` has two
            if isinstance(target, ast.Name):
                add(target.id, node.value)
            elif (isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                  and len(target.elts) == len(node.value.elts)
                  and all(isinstance(t, ast.Name) for t in target.elts)):  # `depth, height, width = 16, 32, 32`
                for t, v in zip(target.elts, node.value.elts, strict=True):
                    add(t.id, v)  # type: ignore[attr-defined]
    return found


def _values(constants: list[Constant], replace: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Every constant's value, in file order, with `replace` substituted; and the names left unevaluated."""
    env: dict[str, Any] = {}
    unknown: set[str] = set()
    for c in constants:
        if c.name in replace:
            env[c.name] = replace[c.name]
            continue
        try:
            env[c.name] = _evaluate(c.expr, env)
            unknown.discard(c.name)
        except (_Unknown, ArithmeticError, TypeError):
            env.pop(c.name, None)
            unknown.add(c.name)
    return env, unknown


def _is_size(name: str, value: Any) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return value > MIN_BATCH if BATCH.search(name) else value >= MIN_SHRINKABLE


class SizeSpace:
    """The sizes of one file that may be halved, and the overrides that put a choice of them in place."""

    def __init__(self, source: str):
        self.constants = read_constants(source)
        self.original, unknown = _values(self.constants, {})
        module_names = {c.name for c in self.constants}
        # A constant this module cannot evaluate could not be recomputed: what it reads stays as it is.
        read_by_unknown = set().union(*(c.refs for c in self.constants if c.name in unknown))
        self.slots: list[Slot] = []
        for c in self.constants:
            value = self.original.get(c.name)
            structural = STRUCTURAL.search(c.name) and not BATCH.search(c.name)
            if structural or c.refs & module_names or c.name in read_by_unknown:
                continue
            if _is_size(c.name, value):
                self.slots.append(Slot(c.name, c.name, None, value))
            elif isinstance(value, (list, tuple)):
                self.slots.extend(Slot(f"{c.name}[{i}]", c.name, i, v)
                                  for i, v in enumerate(value) if _is_size(c.name, v))

    def overrides(self, choice: dict[str, int]) -> dict[str, Any]:
        """Module constants to override for `choice` (slot key -> new value): the chosen ones and every
        constant computed from them, each only where it differs from the file."""
        replace: dict[str, Any] = {}
        by_key = {s.key: s for s in self.slots}
        for key, value in choice.items():
            slot = by_key[key]
            if slot.index is None:
                replace[slot.name] = value
            else:
                seq = list(replace.get(slot.name, self.original[slot.name]))
                seq[slot.index] = value
                replace[slot.name] = tuple(seq) if isinstance(self.original[slot.name], tuple) else seq
        values, _ = _values(self.constants, replace)
        return {name: v for name, v in values.items() if v != self.original.get(name)}

    def next_halving(self, choice: dict[str, int], frozen: set[str]) -> str | None:
        """The slot to halve next: a batch size first, then the largest remaining size; None when none is
        left above its floor."""
        current = {s.key: choice.get(s.key, s.value) for s in self.slots}
        open_slots = [s for s in self.slots if s.key not in frozen and current[s.key] // 2 >= s.floor]
        if not open_slots:
            return None
        batches = [s for s in open_slots if s.is_batch]
        pool = batches or open_slots
        return max(pool, key=lambda s: current[s.key]).key

    def halved(self, choice: dict[str, int], key: str, frozen: set[str], together: bool) -> dict[str, int]:
        """`choice` with `key` halved; `together`: with every other open size of the same value halved too.
        Sizes that must stay equal (a square image's height and width, a batch broadcast against a row
        of the same length) fail one at a time and pass together."""
        current = {s.key: choice.get(s.key, s.value) for s in self.slots}
        keys = [key] + ([s.key for s in self.slots if s.key != key and s.key not in frozen
                         and current[s.key] == current[key] and current[s.key] // 2 >= s.floor] if together else [])
        return {**choice, **{k: current[k] // 2 for k in keys}}


def describe(overrides: dict[str, Any]) -> str:
    """`batch_size=16 dim=1024`, or `default` when nothing is overridden."""
    return " ".join(f"{k}={v!r}".replace(" ", "") for k, v in overrides.items()) or "default"
