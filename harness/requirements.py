"""What a submission needs of the machine that evaluates it, read from its source (AST, never imported).

A job carries it (`Job.needs`), and only a worker that has it claims the job: a CUDA extension sent to a
service whose workers have no GPU waits for one, rather than failing with the machine's error (`CUDA_HOME
is not set`) and being counted against the model.

`needs` is one string: None (any worker), "cuda" (a CUDA device), or "cuda sm_90a" (a CUDA device that can
run code built for that architecture). A worker lists the strings it accepts (`accepted`), so the claim is
one `IN` on both databases.
"""

from __future__ import annotations

import ast
import re

from harness import python_ast
from harness.source_names import Names, text
from harness.submission import InvalidSubmission, extract

CUDA = "cuda"

# Builders whose CUDA sources nvcc compiles: the keyword that carries them, or their file names.
_INLINE_BUILDERS = ("load_inline",)
_FILE_BUILDERS = ("load",)
_CUDA_SOURCE_FILE = re.compile(r"\.cu[h]?$")
# An architecture named in nvcc flags: -arch=sm_90a, --gpu-architecture=compute_80, arch=compute_90a,code=sm_90a.
_ARCH = re.compile(r"(?:sm|compute)_(\d{2,3})([af]?)\b")
_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$")


def _builder(names: Names, call: ast.Call) -> str | None:
    name = names.resolve(call.func) or ""
    last = name.rsplit(".", 1)[-1]
    if last in _INLINE_BUILDERS:
        return "inline"
    if last in _FILE_BUILDERS and "cpp_extension" in name:
        return "files"
    return None


def _nonempty(node: ast.expr) -> bool:
    """Whether a `cuda_sources=` value can hold code: anything but None, "" or an empty list."""
    if isinstance(node, ast.Constant):
        return node.value not in (None, "")
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts)
    return True


def _strings(node: ast.AST) -> list[str]:
    return [s for n in ast.walk(node) if (s := text(n)) is not None]


def _asks_for_cuda(node: ast.AST) -> bool:
    """`.cuda()`, `device="cuda"`, `torch.device("cuda")`, `.to("cuda")`: a tensor or module placed on a GPU by
    a constant, not by a choice the source makes at run time."""
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and not node.args:
        return True
    values = [kw.value for kw in node.keywords if kw.arg == "device"]
    called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    if called in ("to", "device"):
        values += node.args[:1]
    return any((s := text(v)) is not None and _CUDA_DEVICE.match(s) for v in values)


def _arch(strings: list[str]) -> str | None:
    """The newest architecture the flags build for; arch-specific ones (sm_90a) need exactly that GPU."""
    found = [(int(m.group(1)), m.group(2)) for s in strings for m in _ARCH.finditer(s)]
    if not found:
        return None
    number, suffix = max(found)
    return f"sm_{number}{suffix}"


def needs_of(source: str) -> str | None:
    """What evaluating this source needs beyond a CPU; None when any worker can evaluate it."""
    tree = python_ast.parse(source)
    names = Names(tree)
    cuda = False
    flags: list[str] = []
    adapts = False  # the source asks whether CUDA is there: it places its tensors by the answer
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] == "triton" for m in modules):
                cuda = True  # Triton compiles for a GPU
        elif isinstance(node, ast.Call) and (kind := _builder(names, node)) is not None:
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            sources = kw.get("cuda_sources", node.args[2] if len(node.args) > 2 else None)  # (name, cpp, cuda)
            if kind == "inline" and sources is not None and _nonempty(sources):
                cuda = True
            if kind == "files" and any(_CUDA_SOURCE_FILE.search(s) for s in _strings(kw.get("sources", node))):
                cuda = True
            if "extra_cuda_cflags" in kw:
                flags += _strings(kw["extra_cuda_cflags"])
        elif isinstance(node, ast.Attribute) and node.attr == "is_available" and \
                (names.resolve(node.value) or "").endswith("cuda"):
            adapts = True
    if not cuda and not adapts:
        cuda = any(_asks_for_cuda(node) for node in ast.walk(tree))
    if not cuda:
        return None
    arch = _arch(flags)
    return f"{CUDA} {arch}" if arch else CUDA


def needs_of_text(text_: str) -> str | None:
    """`needs_of` for a submitted text (a source or an LLM reply); None when it holds no code to evaluate
    (any worker judges that invalid_submission)."""
    try:
        return needs_of_extracted(extract(text_).source)
    except InvalidSubmission:
        return None


def needs_of_extracted(source: str | None) -> str | None:
    """`needs_of` for the source `extract` took from a text (None: it found none), for a caller that extracted
    it already; None too where the source cannot be read."""
    if source is None:
        return None
    try:
        return needs_of(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def accepted(device: str, compute_capability: str | None) -> list[str]:
    """The needs a slot meets: a CUDA slot meets "cuda", and each architecture its GPU runs: code built for an
    older one (sm_80 on a 9.0 GPU), an arch-specific one of its own (sm_90a), a family one of its major (sm_100f
    on 10.3). A slot whose compute capability is unknown meets "cuda" only."""
    if device != CUDA:
        return []
    out = [CUDA]
    if compute_capability:
        major, _, minor = compute_capability.partition(".")
        own = int(major) * 10 + int(minor or 0)
        out += [f"{CUDA} sm_{n}" for n in range(10, own + 1)]
        out.append(f"{CUDA} sm_{own}a")
        out += [f"{CUDA} sm_{int(major) * 10 + m}f" for m in range(int(minor or 0) + 1)]
    return out


def slots_accept(slots: list[str]) -> list[str]:
    """What a worker registered before it listed what it accepts meets, read from its slot names."""
    return [CUDA] if any(s.startswith(CUDA) for s in slots) else []


def met(needs: str | None, accepts: set[str]) -> bool:
    return needs is None or needs in accepts


def describe(needs: str | None) -> str:
    """'a GPU worker' or 'a GPU worker that runs sm_90a': what a waiting job waits for."""
    if needs is None:
        return "a worker"
    _, _, arch = needs.partition(" ")
    return f"a GPU worker that runs {arch}" if arch else "a GPU worker"


def waiting_note(needs: str | None) -> str:
    """What a job that no live worker can take is told."""
    return f"waits for {describe(needs)}; none is connected"
