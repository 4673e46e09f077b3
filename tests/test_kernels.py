"""Which kernels count as the submission's own: names from its build's device code, never its host
symbols, and never a name a library owns. No GPU: the builds here are made with nvcc (no device needed)
and g++; the profiler names are those an H100 gave for GroupNorm, LeakyReLU, add and a load_inline
build's two kernels (torch 2.11.0+cu130, nvcc 13.0, sm_90a), where this module's parser found exactly
the kernels `cuobjdump -symbols` listed for the same build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import fatbin
from harness.kernels import base_name, custom_kernels, device_kernels, extension_symbols, is_library_kernel

PROFILED = json.loads((Path(__file__).parent / "fixtures" / "kernels" / "h100_profiler_names.json").read_text())
HONEST = ["(anonymous namespace)::anon_scale(float*, long)",
          "void gemm_bias_leaky_kernel<256>(float const*, float*, long)"]
PYTORCH = sorted(set(PROFILED) - set(HONEST))

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
void launch(const float* x, float* y, long n) {
    gemm_bias_leaky_kernel<256><<<(n + 255) / 256, 256>>>(x, y, n);
    anon_scale<<<(n + 255) / 256, 256>>>(y, n);
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
    assert is_library_kernel(HONEST[1])  # "gemm": the name alone would not be credited
    assert custom_kernels(PROFILED, extension_symbols(builds / "honest")) == HONEST


def test_host_symbols_named_like_pytorchs_kernels_credit_none_of_them(builds):
    _build(builds / "decoy_host", "kh_decoy", DECOY_HOST_CPP, cuda=False)
    nm = subprocess.run(["nm", "-C", str(builds / "decoy_host" / "kh_decoy" / "kh_decoy.so")],
                        capture_output=True, text=True, check=True).stdout
    assert "at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel(int)" in nm  # the decoy is there
    assert device_kernels(builds / "decoy_host") == set()
    assert custom_kernels(PROFILED, device_kernels(builds / "decoy_host")) == HONEST[:1]  # the heuristic's


@needs_nvcc
def test_device_kernels_named_exactly_like_a_librarys_are_not_credited(builds):
    _build(builds / "decoy_device", "kh_decoy", DECOY_DEVICE_CU, "-gencode=arch=compute_90,code=sm_90")
    defined = device_kernels(builds / "decoy_device")
    rowwise = next(n for n in PYTORCH if "RowwiseMoments" in n)
    assert rowwise in defined and "ampere_sgemm_128x64_nn" in defined  # the very names PyTorch and cuBLAS launch
    assert custom_kernels([*PYTORCH, "ampere_sgemm_128x64_nn"], defined) == []


CUBIN = "-gencode=arch=compute_90,code=sm_90"
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
    # The name heuristic still credits the kernel whose name looks like no library's.
    assert custom_kernels(PROFILED, device_kernels(builds / "zstd_only")) == HONEST[:1]


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


def test_base_name_keeps_an_anonymous_namespace():
    assert base_name("void ns::fused_kernel<128, float>(float*, int)") == "ns::fused_kernel"
    assert base_name("fused_epilogue(float const*, float*)") == "fused_epilogue"
    # It was `at::native::` for these two, the same for every kernel in that namespace.
    assert base_name(next(n for n in PYTORCH if "RowwiseMoments" in n)) == \
        "at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel"
    assert base_name("at::native::(anonymous namespace)::vectorized_elementwise_kernel(int)") == \
        "at::native::(anonymous namespace)::vectorized_elementwise_kernel"


def test_kernel_names_are_split_into_the_submissions_and_the_libraries():
    library = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
        "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel",
        "ampere_sgemm_128x64_nn", "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "triton_poi_fused_add_mul_0",
        "triton_red_fused_native_group_norm_1", "Memset (Device)", "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm>",
        *PYTORCH,
    ]
    assert all(is_library_kernel(n) for n in library)
    honest = ["fused_groupnorm_hardtanh_kernel(float*, float const*, int, int)", "my_swish_epilogue(float*, int)"]
    assert not any(is_library_kernel(n) for n in honest)
    assert custom_kernels(library + honest, set()) == sorted(honest)
    # Credited by exact name only: a base name (what host symbols gave) claims nothing.
    mine = "void gemm_tile_kernel<64>(float const*, float const*, float*, int)"
    assert custom_kernels([mine], {mine}) == [mine]
    assert custom_kernels([mine], {"gemm_tile_kernel"}) == []
    # A library's own names stay the library's, whatever a build claims.
    assert custom_kernels(library, set(library)) == []


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
