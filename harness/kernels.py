"""Which GPU kernels are the submission's own. No torch: the parent uses this.

The evidence is a trace of one timed window's own calls: the candidate's process reports each kernel as it is first
launched there (evaluation/launches.py), with the launch's handle: a runtime launch's host stub (or its cudaKernel_t), a
driver launch's `CUfunction`. After the timed rounds it lists the handles of what the submission defined: the host
stubs (and their cudaKernel_t) of the kernels in the device code of the shared objects under its build dir, and the
compiled kernels of the `@triton.jit` functions whose code lives in its file. A kernel counts as the submission's own
only where it provably defined it:
- the device code of its build (the CUDA fatbin in a shared object under its build dir, read here) defines a kernel
  of exactly that (demangled) name, and the launch's handle is that build's kernel's. A build can compile a kernel
  named exactly like PyTorch's, so the name alone would claim PyTorch's launches of it; the handle tells them apart.
  Host symbols never name a kernel: any C++ file can define a function of any name;
- or it is a Triton kernel compiled from a `@triton.jit` function that the submission's text defines, the launch's
  `CUfunction` one of that function's compiled kernels. Inductor's generated kernels (all named `triton_` when its
  unique names are off) live in files of its cache, and a function of the same name in the text claims none of them.
A name that "looks like no library's" is no evidence (cuFFT's `vector_fft_r2c<...>` looks like none), and no list of
library names decides anything. A traced window that launched none of its own is `no_custom_kernel`.

A source that builds nothing and imports only modules that cannot launch a kernel of their own (torch's
layers and functions, math) needs no trace to say so (`launches_only_library_kernels`).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterable
from pathlib import Path

from harness import fatbin, python_ast
from harness.schema import KernelLaunch

MAX_SHARED_OBJECTS = 64  # a build dir is the submission's to fill; a real build has a few


def device_kernels(build_root: Path) -> set[str]:
    """Names (demangled, as CUPTI names a launch) of the kernels in the device code of the shared
    objects under a submission's build dir. Links are not followed."""
    if not build_root.is_dir() or build_root.is_symlink():
        return set()
    found = (p for p in build_root.rglob("*.so") if not p.is_symlink())
    return set().union(*(fatbin.device_kernels(so) for so in itertools.islice(found, MAX_SHARED_OBJECTS)))


def triton_jit_names(source: str) -> set[str]:
    """The names of the functions the source defines under a decorator named `jit` (`@triton.jit`, `@jit`,
    `@triton.jit(...)`), at any depth: the Triton kernels its own text can claim."""
    try:
        tree = python_ast.parse(source)
    except SyntaxError:
        return set()

    def is_jit(d: ast.expr) -> bool:
        d = d.func if isinstance(d, ast.Call) else d
        return (isinstance(d, ast.Name) and d.id == "jit") or (isinstance(d, ast.Attribute) and d.attr == "jit")

    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(is_jit, node.decorator_list))}


def custom_kernels(launches: Iterable[KernelLaunch], own_kernels: set[str], source: str = "",
                   own_triton: dict[str, list[int]] | None = None,
                   own_build: dict[str, list[int]] | None = None) -> list[str]:
    """The names of the traced kernels that are the submission's own. `own_kernels` are the exact names in its
    build's device code (`device_kernels`, read by the parent); `own_build` and `own_triton` are the candidate's
    report: the handles of its build's kernels by name, of its own file's `@triton.jit` functions' compiled kernels
    by function name."""
    jit_names = triton_jit_names(source)
    triton = {h for name, hs in (own_triton or {}).items() if name in jit_names for h in hs}
    build = own_build or {}

    def own(launch: KernelLaunch) -> bool:
        if launch.handle is None:
            return False
        if launch.name in own_kernels and launch.handle in build.get(launch.name, ()):
            return True
        return launch.handle in triton

    return sorted({launch.name for launch in launches if own(launch)})


# Modules a pure-PyTorch submission imports: none of them can launch a kernel that is not PyTorch's own.
_LIBRARY_ONLY_MODULES = {"torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.parameter",
                         "math", "typing", "functools", "itertools", "operator", "numbers", "collections",
                         "dataclasses", "__future__", "numpy", "einops"}
# Words that name a way to launch a kernel from Python without a build, or to reach one indirectly: where the
# source holds any of them (as a name, an attribute or inside a string), the trace decides.
_OWN_KERNEL_WORDS = re.compile(
    r"triton|jiterator|cupy|numba|pycuda|nvrtc|cuda_python|ctypes|cffi|tilelang|tvm|"
    r"cutlass|cute|compile|_inductor|_dynamo|cpp_extension|load_inline|_C\b|library|"
    r"import_module|__import__|exec|eval|getattr|globals|__dict__",
    re.IGNORECASE,
)


def _imports_only_library_modules(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return all(a.name in _LIBRARY_ONLY_MODULES for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return not node.level and node.module in _LIBRARY_ONLY_MODULES
    return True


def _words(node: ast.AST) -> list[str]:
    """The identifiers and string contents a node itself holds."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                                               else [])
    return []


def launches_only_library_kernels(source: str) -> bool:
    """True when the source can launch no kernel of its own: it builds nothing, imports only torch's layers and
    functions (and pure-Python helpers), and names no way to reach anything else (Triton, jiterator, cupy,
    torch.compile, a dynamic import). Conservative: any doubt is False, and the kernel trace decides. A source
    that hides such a way from this reading only loses its own kernels' credit (`no_custom_kernel`)."""
    try:
        tree = python_ast.parse(source)
    except SyntaxError:
        return False
    return all(_imports_only_library_modules(node) and not any(_OWN_KERNEL_WORDS.search(w) for w in _words(node))
               for node in ast.walk(tree))
