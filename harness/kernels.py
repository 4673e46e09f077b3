"""Which GPU kernels are the submission's own. No torch: the parent uses this.

The candidate's process reports the names of the kernels one forward launched (the torch profiler,
demangled). A name is the submission's own when the device code its load_inline build produced (the
CUDA fatbin in a shared object under its build dir) defines a kernel of exactly that name, unless the
name is one a library owns: a build can compile a kernel named like PyTorch's (or put one in an
anonymous namespace, which demangles alike in every library), and the profiler could then not tell
PyTorch's kernel from it. Host symbols never count: any C++ file can define a function of any name.
A kernel from no build (a user's Triton kernel) is the submission's own when it looks like no
library's: not PyTorch's (`at::`, `c10::`), not inductor's generated Triton (`triton_poi_fused_...`),
not cuBLAS, cuDNN, CUTLASS or the CUDA runtime's. A forward that launches none of its own is
`no_custom_kernel`.

A source that builds nothing and imports only modules that cannot launch a kernel of their own (torch's
layers and functions, math) needs no trace to say so (`launches_only_library_kernels`): the profiler's
start-up alone costs 5-6 s an evaluation on an H100 host.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterable
from pathlib import Path

from harness import fatbin

_LIBRARY = re.compile(
    r"(\bat::|\bc10::|\bcub::|\bthrust::|\bcutlass|\bcudnn|\bcublas|xmma|nvjet|\bcask|gemv|gemm|"
    r"^triton_(poi|red|per|tem|for)_|^Memcpy|^Memset|^\[?memcpy|^\[?memset|splitKreduce|\bflash|fmha|"
    r"^(void )?(ampere|volta|turing|maxwell|hopper|sm\d+)_|elementwise_kernel|reduce_kernel|"
    r"at_cuda_detail|implicit_convolve|winograd|\bfft|radix|philox|curand|softmax_warp|"
    r"CatArrayBatchedCopy|indexSelect|scatter_gather|vectorized_|unrolled_elementwise)",
    re.IGNORECASE,
)
# Names no build is credited with, whatever its device code holds: the namespaces of the libraries a
# PyTorch process launches kernels from, and the vendor kernels' own names (cuBLAS's and cuDNN's carry
# their types or an architecture prefix; cuBLAS's CUTLASS kernels a `cutlass_80_`-style name).
_LIBRARY_NAMESPACES = {"at", "c10", "torch", "at_cuda_detail", "cub", "thrust", "cudnn", "cublas", "cublasLt",
                       "pytorch_flash"}
_VENDOR = re.compile(
    r"(\bcublas|\bcudnn|xmma|nvjet|\bcask|\bcutlass(3x)?_(sm)?\d+_|"
    r"^(void )?(ampere|volta|turing|maxwell|hopper|blackwell|sm\d+)_|^\[?(memcpy|memset)|"
    r"^triton_(poi|red|per|tem|for)_)",
    re.IGNORECASE,
)
_ANONYMOUS = "(anonymous namespace)"
MAX_SHARED_OBJECTS = 64  # a build dir is the submission's to fill; a real build has a few


def base_name(name: str) -> str:
    """`void ns::kern<128, float>(float*, int)` -> `ns::kern`; an anonymous namespace stays in it:
    `at::native::(anonymous namespace)::kern(...)` -> `at::native::(anonymous namespace)::kern`."""
    text = name.strip().removeprefix("void ").strip().replace(_ANONYMOUS, "\0")
    out, depth = [], 0
    for ch in text:
        if ch in "<{":
            depth += 1
        elif ch in ">}":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip().split(" ")[-1].replace("\0", _ANONYMOUS)


def device_kernels(build_root: Path) -> set[str]:
    """Names (demangled, as the profiler gives them) of the kernels in the device code of the shared
    objects under a submission's build dir. Links are not followed."""
    if not build_root.is_dir() or build_root.is_symlink():
        return set()
    found = (p for p in build_root.rglob("*.so") if not p.is_symlink())
    return set().union(*(fatbin.device_kernels(so) for so in itertools.islice(found, MAX_SHARED_OBJECTS)))


# The runner's name for it, from when host symbols were read.
extension_symbols = device_kernels


def is_library_kernel(name: str) -> bool:
    return bool(_LIBRARY.search(name))


def is_library_owned(name: str) -> bool:
    """A name a build cannot claim: a library's namespace, an anonymous namespace, a vendor's name."""
    base = base_name(name)
    return base.split("::")[0] in _LIBRARY_NAMESPACES or _ANONYMOUS in base or bool(_VENDOR.search(name))


def custom_kernels(names: Iterable[str], own_kernels: set[str]) -> list[str]:
    """The kernels among `names` that are the submission's own; `own_kernels` are the exact names in
    its build's device code (`device_kernels`)."""
    return sorted(n for n in names
                  if (n in own_kernels and not is_library_owned(n)) or not is_library_kernel(n))


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
    torch.compile, a dynamic import). Conservative: any doubt is False, and the profiler's trace decides. A source
    that hides such a way from this reading only loses its own kernels' credit (`no_custom_kernel`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return all(_imports_only_library_modules(node) and not any(_OWN_KERNEL_WORDS.search(w) for w in _words(node))
               for node in ast.walk(tree))
