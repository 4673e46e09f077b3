"""Which GPU kernels are the submission's own. No torch: the parent uses this.

The candidate's process reports the names of the kernels one forward launched (the torch profiler).
A name is the submission's own when a shared object its load_inline build produced defines it, or,
for kernels that come from no build (a user's Triton kernel), when it looks like no library's: not
PyTorch's (`at::`, `c10::`), not inductor's generated Triton (`triton_poi_fused_...`), not cuBLAS,
cuDNN, CUTLASS or the CUDA runtime's. A forward that launches none of its own is `no_custom_kernel`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

_LIBRARY = re.compile(
    r"(\bat::|\bc10::|\bcub::|\bthrust::|\bcutlass|\bcudnn|\bcublas|xmma|nvjet|\bcask|gemv|gemm|"
    r"^triton_(poi|red|per|tem|for)_|^Memcpy|^Memset|^\[?memcpy|^\[?memset|splitKreduce|\bflash|fmha|"
    r"^(void )?(ampere|volta|turing|maxwell|hopper|sm\d+)_|elementwise_kernel|reduce_kernel|"
    r"at_cuda_detail|implicit_convolve|winograd|\bfft|radix|philox|curand|softmax_warp|"
    r"CatArrayBatchedCopy|indexSelect|scatter_gather|vectorized_|unrolled_elementwise)",
    re.IGNORECASE,
)


def base_name(name: str) -> str:
    """`void ns::kern<128, float>(float*, int)` -> `ns::kern`."""
    text = name.strip().removeprefix("void ").strip()
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip().split(" ")[-1]


def extension_symbols(build_root: Path) -> set[str]:
    """Base names of the functions defined in the shared objects under a submission's build dir."""
    nm = shutil.which("nm")
    if nm is None or not build_root.is_dir():
        return set()
    names: set[str] = set()
    for so in build_root.rglob("*.so"):
        try:
            out = subprocess.run([nm, "-C", "--defined-only", str(so)], capture_output=True, text=True,
                                 timeout=60, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in ("T", "t", "W"):
                names.add(base_name(parts[2]))
    return names


def is_library_kernel(name: str) -> bool:
    return bool(_LIBRARY.search(name))


def custom_kernels(names: Iterable[str], own_symbols: set[str]) -> list[str]:
    """The kernels among `names` that are the submission's own."""
    return sorted(n for n in names if base_name(n) in own_symbols or not is_library_kernel(n))
