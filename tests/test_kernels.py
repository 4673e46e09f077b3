"""Which kernels count as the submission's own: a kernel its build's device code defines, launched through its
build's host stub, or a Triton kernel compiled from a `@triton.jit` function of its own text; never its host symbols,
and never a name merely because it looks like no library's. No GPU: the builds here are made with nvcc (no device
needed) and g++; the kernel names are those an H100 gave for GroupNorm, LeakyReLU, add and a load_inline build's two
kernels (torch 2.11.0+cu130, nvcc 13.0, sm_90a), where this module's parser found exactly the kernels
`cuobjdump -symbols` listed for the same build. The traces of the three cheats an H200 ranked (inductor with unique
kernel names off, cuFFT beside PyTorch, an own kernel launched only outside the judged and timed calls) are written
as CUPTI reports them."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import fatbin
from harness.kernels import custom_kernels, device_kernels, triton_jit_names
from harness.schema import KernelLaunch

PROFILED = json.loads((Path(__file__).parent / "fixtures" / "kernels" / "h100_profiler_names.json").read_text())
HONEST = ["(anonymous namespace)::anon_scale(float*, long)",
          "void (anonymous namespace)::anon_tmpl<2>(float*, long)",
          "void gemm_bias_leaky_kernel<256>(float const*, float*, long)"]
PYTORCH = sorted(set(PROFILED) - set(HONEST))
TORCH_HANDLES = 0x7F00_0000_1000  # where PyTorch's kernels' handles start, in these traces
BUILD_HANDLES = 0x7F11_0000_0000  # and a build's


def _launched(names: list[str], handle: int = TORCH_HANDLES) -> list[KernelLaunch]:
    """Runtime launches of `names`, each with a handle of its own from `handle` on (PyTorch's unless said)."""
    return [KernelLaunch(name=n, handle=handle + i) for i, n in enumerate(names)]


def _handles(names: list[str], handle: int = BUILD_HANDLES) -> dict[str, list[int]]:
    """The candidate's report of its build's kernels' handles: those `_launched(names, handle)` carries."""
    return {n: [handle + i] for i, n in enumerate(names)}

# The honest build that ran on the H100: a kernel whose name looks like cuBLAS's ("gemm") and one in an
# anonymous namespace, both launched.
HONEST_CU = r"""
template <int B> __global__ void gemm_bias_leaky_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)B + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0 ? v : 0.01f * v; }
}
namespace { __global__ void anon_scale(float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] *= 2.f;
} }
// A template in an anonymous namespace (the reference solutions' kernels): its host function's name carries the
// internal-linkage `L` its device code's name lacks.
namespace { template <int K> __global__ void anon_tmpl(float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] *= (float)K;
} }
void launch(const float* x, float* y, long n) {
    gemm_bias_leaky_kernel<256><<<(n + 255) / 256, 256>>>(x, y, n);
    anon_scale<<<(n + 255) / 256, 256>>>(y, n);
    anon_tmpl<2><<<(n + 255) / 256, 256>>>(y, n);
}
"""
# The attack: host functions only, named like PyTorch's kernels, in an anonymous namespace.
DECOY_HOST_CPP = """
namespace at { namespace native { namespace {
void vectorized_elementwise_kernel(int) {}
void RowwiseMomentsCUDAKernel(int) {}
void elementwise_kernel(int) {}
} } }
int decoy(int a) {
    at::native::vectorized_elementwise_kernel(a);
    at::native::RowwiseMomentsCUDAKernel(a);
    at::native::elementwise_kernel(a);
    return a;
}
"""
# The same attack in device code: real kernels whose demangled names are PyTorch's and cuBLAS's exactly.
DECOY_DEVICE_CU = r"""
namespace at { namespace native { namespace {
template <typename T> __global__ void RowwiseMomentsCUDAKernel(long n, T eps, const T* x, T* mean, T* rstd) {
    if (n) mean[0] = x[0] + eps;
}
} void launch_decoy(float* p) { RowwiseMomentsCUDAKernel<float><<<1, 1>>>(1, 0.f, p, p, p); } } }
extern "C" __global__ void ampere_sgemm_128x64_nn(float* p) { p[0] = 0; }
"""

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (no GPU)")


def _build(root: Path, name: str, source: str, *flags: str, cuda: bool = True) -> Path:
    """A shared object where load_inline would put it: <build dir>/<name>/<name>.so."""
    out = root / name / f"{name}.so"
    out.parent.mkdir(parents=True)
    src = out.with_suffix(".cu" if cuda else ".cpp")
    src.write_text(source)
    cmd = (["nvcc", "-shared", "-Xcompiler", "-fPIC", *flags] if cuda else ["c++", "-shared", "-fPIC", "-O0"])
    subprocess.run([*cmd, "-o", str(out), str(src)], check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("builds")


@needs_nvcc
def test_an_honest_builds_kernels_are_its_own_even_where_named_like_a_librarys(builds):
    so = _build(builds / "honest", "kh_honest", HONEST_CU, "-gencode=arch=compute_90,code=sm_90")
    assert fatbin.device_kernels(so) == set(HONEST)
    section = fatbin._read_fatbin_section(so)
    assert fatbin.device_entry_names(section + bytes(16)) == fatbin.device_entry_names(section)  # padding
    # Its two kernels, one named like cuBLAS's ("gemm"), one in an anonymous namespace, launched through its own
    # stubs beside PyTorch's kernels: both its own, none of PyTorch's.
    trace = _launched(PYTORCH) + _launched(HONEST, BUILD_HANDLES)
    assert custom_kernels(trace, device_kernels(builds / "honest"), own_build=_handles(HONEST)) == HONEST


def test_host_symbols_named_like_pytorchs_kernels_credit_none_of_them(builds):
    _build(builds / "decoy_host", "kh_decoy", DECOY_HOST_CPP, cuda=False)
    nm = subprocess.run(["nm", "-C", str(builds / "decoy_host" / "kh_decoy" / "kh_decoy.so")],
                        capture_output=True, text=True, check=True).stdout
    assert "at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel(int)" in nm  # the decoy is there
    assert device_kernels(builds / "decoy_host") == set()
    # Not even a kernel whose name looks like no library's: only device code defines a kernel.
    assert custom_kernels(_launched(PROFILED), device_kernels(builds / "decoy_host"), own_build=_handles(PROFILED,
                                                                                                   TORCH_HANDLES)) == []


@needs_nvcc
def test_device_kernels_named_exactly_like_a_librarys_are_not_credited(builds):
    _build(builds / "decoy_device", "kh_decoy", DECOY_DEVICE_CU, "-gencode=arch=compute_90,code=sm_90")
    defined = device_kernels(builds / "decoy_device")
    rowwise = next(n for n in PYTORCH if "RowwiseMoments" in n)
    assert rowwise in defined and "ampere_sgemm_128x64_nn" in defined  # the very names PyTorch and cuBLAS launch
    # PyTorch's and cuBLAS's launches of those names carry their libraries' handles, not the build's.
    names = [rowwise, "ampere_sgemm_128x64_nn"]
    assert custom_kernels(_launched([*PYTORCH, "ampere_sgemm_128x64_nn"]), defined, own_build=_handles(names)) == []
    # Its own launch of its own kernel is its own, whatever the kernel is named.
    assert custom_kernels(_launched([rowwise], BUILD_HANDLES), defined, own_build=_handles(names)) == [rowwise]


CUBIN = "-gencode=arch=compute_90,code=sm_90"


@needs_nvcc
def test_the_kernels_of_a_loaded_build_have_its_host_stubs_as_handles(builds):
    """A launch names a kernel by its host stub (nvcc's host function of the kernel's own mangled name), or by the
    cudaKernel_t the CUDA runtime gives for that stub: the candidate's process finds the stubs of the kernels in the
    device code of the objects it has loaded from its build dir, in their symbol tables (local ones too)."""
    from harness.evaluation import launches

    so = _build(builds / "loaded", "kh_loaded", HONEST_CU, CUBIN)
    _build(builds / "loaded", "kh_not_loaded", HONEST_CU, CUBIN)  # never loaded: claims nothing
    ctypes.CDLL(str(so))
    handles = launches.build_kernel_handles(builds / "loaded")
    assert set(handles) == set(HONEST)
    # Each at its symbol's value from where the object is loaded: inside its mappings, as far apart as nm says.
    symbols = [line.split() for line in subprocess.run(["nm", str(so)], capture_output=True, text=True,
                                                       check=True).stdout.splitlines()]
    nm = {fields[2]: int(fields[0], 16) for fields in symbols if len(fields) == 3 and "stub" not in fields[2]}
    values = [next(v for m, v in nm.items() if m.endswith("10anon_scaleEPfl")),
              nm["_Z22gemm_bias_leaky_kernelILi256EEvPKfPfl"]]
    with open("/proc/self/maps") as maps:
        mapped = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in maps
                  if line.rstrip().endswith(str(so))]
    stubs = [next(h for h in handles[name] if any(lo <= h < hi for lo, hi in mapped))
             for name in (HONEST[0], HONEST[2])]
    assert stubs[1] - stubs[0] == values[1] - values[0]
    assert launches.build_kernel_handles(builds / "missing") == {}


@needs_nvcc
def test_a_build_sealed_after_it_was_loaded_keeps_its_kernels_handles(builds):
    """Sealing a build (sandbox/builds.py) replaces each of its files by the harness's copy of the same bytes while
    the candidate has the library mapped: /proc/self/maps then marks the mapping deleted. Its kernels are still found
    (a GPU evaluation lost its credit for them before)."""
    import shutil

    from harness.evaluation import launches

    so = _build(builds / "sealed", "kh_sealed", HONEST_CU, CUBIN)
    ctypes.CDLL(str(so))
    before = launches.build_kernel_handles(builds / "sealed")
    copy = so.with_name(so.name + ".copy")
    shutil.copy2(so, copy)
    so.unlink()
    copy.rename(so)
    with open("/proc/self/maps") as maps:
        assert any(line.rstrip().endswith(f"{so} (deleted)") for line in maps)
    assert launches.build_kernel_handles(builds / "sealed") == before and set(before) == set(HONEST)


PTX = "-gencode=arch=compute_90,code=compute_90"  # kernels JIT-compiled from PTX at load time


@needs_nvcc
@pytest.mark.parametrize(("packing", "flags"), [
    ("lz ptx", [PTX, "--compress-mode=speed"]),  # nvcc's LZ4-style format
    ("zstd cubin", [CUBIN, "--compress-mode=size"]),
    ("zstd ptx", [PTX]),  # nvcc compresses PTX with zstd by default
])
def test_device_code_is_read_however_nvcc_packed_it(builds, packing, flags):
    if "zstd" in packing and shutil.which("zstd") is None:
        pytest.skip("needs the zstd command")
    so = _build(builds / packing.replace(" ", "_"), "kh_honest", HONEST_CU, *flags)
    assert fatbin.device_kernels(so) == set(HONEST)


@needs_nvcc
def test_without_the_zstd_command_a_zstd_build_is_credited_nothing_and_says_so(builds, monkeypatch, caplog):
    so = _build(builds / "zstd_only", "kh_honest", HONEST_CU, CUBIN, "--compress-mode=size")
    monkeypatch.setattr(fatbin.shutil, "which", lambda name: None)
    assert fatbin.device_kernels(so) == set()
    assert "zstd-compressed device-code entries" in caplog.text
    assert custom_kernels(_launched(HONEST, BUILD_HANDLES), device_kernels(builds / "zstd_only"),
                          own_build=_handles(HONEST)) == []


def test_a_hostile_build_dir_is_read_without_hanging_or_following_links(tmp_path):
    (tmp_path / "ext").mkdir()
    os.mkfifo(tmp_path / "ext" / "fifo.so")  # opening it to read would block a reader that waits
    (tmp_path / "ext" / "junk.so").write_bytes(b"\x7fELF\x02\x01" + b"\xff" * 200)
    (tmp_path / "ext" / "link.so").symlink_to("/bin/true")
    (tmp_path / "ext" / "text.so").write_text("not an ELF")
    assert device_kernels(tmp_path) == set()
    assert device_kernels(tmp_path / "missing") == set()


def test_a_malformed_fatbin_yields_no_names():
    header = (0xBA55ED50).to_bytes(4, "little") + (1).to_bytes(2, "little") + (16).to_bytes(2, "little")
    zero_sized_entry = header + (64).to_bytes(8, "little") + bytes(64)
    with pytest.raises(fatbin._Malformed):
        fatbin.device_entry_names(zero_sized_entry)  # an entry header of 0 bytes: no endless loop
    with pytest.raises(fatbin._Malformed):
        fatbin.device_entry_names(b"\x01" * 32)
    with pytest.raises(fatbin._Malformed):
        fatbin._lz_decompress(bytes([0x0F, 0x01, 0x00]), 100)  # a match before any output
    if shutil.which("zstd"):
        with pytest.raises(fatbin._Malformed):
            fatbin._zstd_decompress(b"(\xb5/\xfd not zstd", 100)


# A @triton.jit add kernel launched from ModelNew.forward (KernelBench's Triton example, model_new_ex_add_triton).
TRITON_ADD = '''
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)
'''
TORCH_COMPILE = '''
import torch
import torch._inductor.config

torch._inductor.config.triton.unique_kernel_names = False
'''
ADD_HANDLE, INDUCTOR_HANDLE, DECOY_HANDLE = 0x5A5A_0000_0010, 0x5A5A_0000_0020, 0x5A5A_0000_0030
# Driver launches (Triton's): a CUfunction handle, no host stub.
INDUCTOR = [KernelLaunch(name="triton_", handle=INDUCTOR_HANDLE),
            KernelLaunch(name="triton_poi_fused_add_0", handle=INDUCTOR_HANDLE + 8)]
CUFFT = _launched(["void vector_fft_r2c<256u, 8u, 1u, 0u, float, float2>(float const*, float2*, unsigned int, "
                   "unsigned int, unsigned int, unsigned int)", "void regular_fft<1024u, 8u, 4u, 32u, float2>"
                   "(float2*, float2 const*, unsigned int)"], 0x7F22_0000_0000)


def test_inductors_kernels_are_not_the_submissions_with_unique_names_off_or_on():
    # torch.compile with unique kernel names off: every generated kernel is `triton_`, from a file in inductor's cache.
    assert custom_kernels(INDUCTOR + _launched(PYTORCH), set(), TORCH_COMPILE, {}) == []
    # A @triton.jit function of that very name in its own text claims none of inductor's launches: only the handles
    # of its own function's compiled kernels are its own.
    decoy = TORCH_COMPILE + "import triton\n\n@triton.jit\ndef triton_(x):\n    pass\n"
    assert custom_kernels(INDUCTOR, set(), decoy, {"triton_": [DECOY_HANDLE]}) == []
    # Its own `triton_` launched too is its own.
    own = [*INDUCTOR, KernelLaunch(name="triton_", handle=DECOY_HANDLE)]
    assert custom_kernels(own, set(), decoy, {"triton_": [DECOY_HANDLE]}) == ["triton_"]


def test_a_library_kernel_that_looks_like_no_librarys_is_not_credited():
    assert custom_kernels(CUFFT + _launched(PYTORCH), set(), "import torch\n", {}, {}) == []


def test_an_own_kernel_absent_from_the_traced_window_earns_nothing():
    # Defined in its build, launched only on inputs it had seen: the timed window traced ran PyTorch alone.
    mine = "kh_scale_kernel(float*, float, int)"
    assert custom_kernels(_launched(PYTORCH), {mine}, "", {}, _handles([mine])) == []
    # The honest twin launched it in the window: its own.
    assert custom_kernels(_launched(PYTORCH) + _launched([mine], BUILD_HANDLES), {mine}, "", {}, _handles([mine])) \
        == [mine]


def test_the_triton_add_example_keeps_its_credit():
    launches = [KernelLaunch(name="add_kernel", handle=ADD_HANDLE)]
    assert custom_kernels(launches, set(), TRITON_ADD, {"add_kernel": [ADD_HANDLE]}) == ["add_kernel"]
    # The candidate's report claims only what its text defines; a launch of another handle is not its kernel.
    assert custom_kernels(launches, set(), TRITON_ADD, {"other": [ADD_HANDLE]}) == []
    assert custom_kernels(launches, set(), TRITON_ADD, {"add_kernel": [ADD_HANDLE + 1]}) == []
    assert custom_kernels(launches, set(), "import torch\n", {"add_kernel": [ADD_HANDLE]}) == []


def test_a_build_kernel_counts_only_by_its_own_handle_and_its_name_in_the_device_code_read_here():
    mine = "fused_kernel(float*, int)"
    launch = _launched([mine], BUILD_HANDLES)
    assert custom_kernels(launch, {mine}, own_build=_handles([mine])) == [mine]
    # The candidate's report of a kernel its device code does not define (read by the parent) claims nothing.
    assert custom_kernels(launch, set(), own_build=_handles([mine])) == []
    # Nor does a launch whose handle is not its build kernel's, nor one that carries none (a multi-device launch).
    assert custom_kernels(_launched([mine]), {mine}, own_build=_handles([mine])) == []
    assert custom_kernels([KernelLaunch(name=mine)], {mine}, own_build={mine: [BUILD_HANDLES]}) == []
    # A build kernel's handle claims only its own name.
    assert custom_kernels(launch, {mine, "other(int)"}, own_build={"other(int)": [BUILD_HANDLES]}) == []


def test_triton_jit_names_are_the_functions_its_text_decorates_with_jit():
    source = TRITON_ADD + '''
from triton import jit


@triton.autotune(configs=[], key=["n"])
@triton.jit(do_not_specialize=["n"])
def tuned(x, n):
    pass


@jit
def bare(x):
    pass


def helper(x):
    @triton.jit
    def nested(y):
        pass
    return nested


@torch.compile
def compiled(x):
    return x
'''
    assert triton_jit_names(source) == {"add_kernel", "tuned", "bare", "nested"}
    assert triton_jit_names("def broken(:\n") == set()


_PURE = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return F.gelu(self.fc(x)) * math.sqrt(2.0)
'''


@pytest.mark.parametrize("extra, untraced", [
    ("", True),  # the honest pure-PyTorch twin: nothing of its own can run, no trace needed
    ("from torch.utils.cpp_extension import load_inline\n", False),
    ("import triton\n", False),
    ("k = torch.cuda.jiterator._create_jit_fn('template <typename T> T f(T x) { return x; }')\n", False),
    ("fast = torch.compile(F.gelu)\n", False),
    ("import cupy\n", False),
    ("import ctypes\n", False),
    ("m = __import__('tri' + 'ton')\n", False),
    ("lib = torch.library.Library('mine', 'DEF')\n", False),
    ("f = getattr(torch.cuda, 'jit' + 'erator')\n", False),
    ("from . import helpers\n", False),
    ("import os\n", False),
])
def test_only_a_source_that_can_launch_no_kernel_of_its_own_goes_untraced(extra, untraced):
    from harness.kernels import launches_only_library_kernels

    assert launches_only_library_kernels(_PURE + extra) is untraced


def test_the_fixtures_that_build_or_reach_kernels_are_traced():
    from harness.kernels import launches_only_library_kernels
    from harness.submission import extract

    root = Path(__file__).parent / "fixtures"
    for name in ("submissions/l30_cuda_correct.py", "submissions/l30_cpp_correct.py",
                 "adversarial/content_keyed_cache.py", "adversarial/try_except_fallback.py"):
        assert not launches_only_library_kernels(extract((root / name).read_text()).source), name
    for name in ("submissions/l30_pytorch_correct.py", "submissions/l75_pytorch_correct.py"):
        assert launches_only_library_kernels(extract((root / name).read_text()).source), name
    assert not launches_only_library_kernels("def broken(:\n")
