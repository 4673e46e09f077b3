"""The 3xTF32 gold solutions (reference_solutions/tensor_cores/): their arithmetic emulated on the CPU, and
each file a valid submission for its problem.

TF32 keeps fp32's exponent and 10 of its 23 mantissa bits. The solutions split every fp32 operand v into
hi = tf32(v) and lo = tf32(v - hi) and compute hi_a hi_b + hi_a lo_b + lo_a hi_b on TF32 tensor cores; here the
same split runs in torch on the CPU, where a product of two TF32 numbers is exact in fp32 just as on the GPU. The
honest twin (3xTF32) must stay at the fp32 product's error against float64; the cheat (one TF32 product) must be
far above it, as the harness's precision check (`precision_below_fp32`) requires to tell them apart.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from harness import kernels, static_checks
from harness.evaluation.problem_module import load_problem
from harness.evaluation.protocol import ProblemLoad
from harness.grading import PRECISION_FLOOR, PRECISION_RATIO
from harness.problems import get_registry
from harness.problems.spec import model_init_arg_names
from harness.submission import extract
from tests.reference_solutions.test_reference_solutions import _init_signature
from tests.reference_solutions.test_reference_solutions import solution as current_solution

ROOT = Path(__file__).parents[2] / "reference_solutions" / "tensor_cores"
SPECS = get_registry().all()


def tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> TF32 by rounding to nearest, ties to even, on the bits (the solutions' round_tf32): add half an
    ulp of the 10-bit mantissa (less one unless the lowest kept bit is odd), clear the 13 low bits. Inf/NaN kept."""
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    r = torch.where((u & 0x7F800000) == 0x7F800000, u, r)
    return torch.where(r >= 2**31, r - 2**32, r).to(torch.int32).view(torch.float32)


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi = tf32(x)
    return hi, tf32(x - hi)  # x - hi is exact in fp32


def err_vs_fp64(y: torch.Tensor, exact: torch.Tensor) -> float:
    """The harness's measure: max |y - g| / (1 + |g|)."""
    return float(((y.double() - exact).abs() / (1 + exact.abs())).max())


def test_tf32_rounds_to_nearest_even_on_ten_mantissa_bits():
    one_ulp = 2.0**-10  # TF32's ulp at 1
    x = torch.tensor([1 + one_ulp / 2,               # a tie, lowest kept bit even: down
                      1 + 3 * one_ulp / 2,           # a tie, lowest kept bit odd: up to even
                      1 + one_ulp / 2 + 2.0**-20,    # past the tie: up
                      -(1 + one_ulp / 2 + 2.0**-20),
                      1 + one_ulp / 2 - 2.0**-20,    # below the tie: down
                      float("inf"), float("-inf")], dtype=torch.float32)
    want = torch.tensor([1, 1 + 2 * one_ulp, 1 + one_ulp, -(1 + one_ulp), 1, float("inf"), float("-inf")])
    assert torch.equal(tf32(x), want)
    assert tf32(torch.tensor([float("nan")])).isnan().all()
    v = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 1e3
    t = tf32(v)
    assert not (t.view(torch.int32) & 0x1FFF).any(), "the 13 low mantissa bits must be zero"
    assert ((t.double() - v.double()).abs() <= 2.0**-11 * v.double().abs()).all()


def test_the_split_holds_the_value_to_2_to_the_minus_22():
    v = torch.randn(100_000, generator=torch.Generator().manual_seed(1)) * 2 + 0.5
    hi, lo = split(v)
    assert not ((hi.view(torch.int32) | lo.view(torch.int32)) & 0x1FFF).any()
    resid = (v.double() - hi.double() - lo.double()).abs()
    assert (resid <= 2.0**-22 * v.double().abs()).all()


@pytest.mark.parametrize("dist", ["uniform", "randn*2+0.5"])
def test_3xtf32_stays_at_fp32_error_and_one_tf32_product_does_not(dist):
    g = torch.Generator().manual_seed(2)
    M, K, N = 64, 512, 256
    a = torch.rand(M, K, generator=g) if dist == "uniform" else torch.randn(M, K, generator=g) * 2 + 0.5
    b = (torch.rand(K, N, generator=g) * 2 - 1) / K**0.5  # nn.Linear's initialisation scale
    exact = a.double() @ b.double()
    fp32 = err_vs_fp64(a @ b, exact)
    (a_hi, a_lo), (b_hi, b_lo) = split(a), split(b)
    three = err_vs_fp64(a_hi @ b_hi + (a_hi @ b_lo + a_lo @ b_hi), exact)
    one = err_vs_fp64(a_hi @ b_hi, exact)
    assert three <= 2 * fp32, (three, fp32)
    assert one >= 50 * fp32, (one, fp32)
    # The harness's precision check passes the twin and flags the cheat.
    assert not (three > PRECISION_FLOOR and three > PRECISION_RATIO * fp32)
    assert one > PRECISION_FLOOR and one > PRECISION_RATIO * fp32


# A model of a tensor core's fp32 accumulation (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021):
# each step adds k exact products to the accumulator, every addend aligned to the largest with `guard` bits below
# fp32's 24 and truncated, the sum truncated to fp32 (round toward zero). Why the solutions chunk the hi*hi GEMM.
def _rz_fp32(s: torch.Tensor) -> torch.Tensor:
    f = s.float()
    return torch.where(f.double().abs() > s.abs(), torch.nextafter(f, torch.zeros_like(f)), f)


def _tensor_core_chain(a: torch.Tensor, b: torch.Tensor, k: int = 8, guard: int = 3) -> torch.Tensor:
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for k0 in range(0, a.shape[1], k):
        terms = torch.cat([acc[..., None], a[:, None, k0:k0 + k].double() * b[None, :, k0:k0 + k].double()], -1)
        e = torch.frexp(terms.abs().amax(-1, keepdim=True)).exponent
        q = torch.ldexp(torch.ones((), dtype=torch.float64), (e - 24 - guard).double())
        acc = _rz_fp32((torch.trunc(terms / q) * q).sum(-1)).double()
    return acc.float()


def _fma_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The fp32 GEMM of CUDA cores: one fused multiply-add per k, rounded to nearest."""
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32)
    for k in range(a.shape[1]):
        acc = (acc.double() + torch.outer(a[:, k].double(), b[:, k].double())).float()
    return acc


@pytest.mark.parametrize("dist", ["uniform", "randn*2+0.5"])
def test_a_truncating_accumulator_needs_the_hi_hi_product_in_k_chunks(dist):
    g = torch.Generator().manual_seed(0)
    M, K, N, chunk = 8, 2048, 32, 256
    x = torch.rand(M, K, generator=g) if dist == "uniform" else torch.randn(M, K, generator=g) * 2 + 0.5
    w = (torch.rand(N, K, generator=g) * 2 - 1) / K**0.5
    exact = x.double() @ w.double().T
    fp32 = err_vs_fp64(_fma_chain(x, w), exact)
    (x_hi, x_lo), (w_hi, w_lo) = split(x), split(w)
    cross = _tensor_core_chain(torch.cat([x_hi, x_lo], 1), torch.cat([w_lo, w_hi], 1))
    one_chain = _tensor_core_chain(x_hi, w_hi) + cross
    parts = [_tensor_core_chain(x_hi[:, i:i + chunk], w_hi[:, i:i + chunk]) for i in range(0, K, chunk)]
    chunked = parts[0]
    for p in parts[1:]:
        chunked = chunked + p  # fp32, round to nearest (the solutions' tf32x3_sum_kernel)
    chunked = chunked + cross
    assert err_vs_fp64(one_chain, exact) >= 1.5 * fp32
    assert err_vs_fp64(chunked, exact) <= 1.2 * fp32


# ---- the solution files ----

def tc_solution(spec) -> Path:
    (path,) = ROOT.glob(f"level2_{spec.kernelbench_id.split('/')[1]}_*.py")
    return path


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_tensor_core_solution_is_a_valid_submission_with_the_reference_constructor(spec):
    path = tc_solution(spec)
    assert path.name == current_solution(spec).name
    sub = extract(path.read_text())
    assert not sub.from_reply
    assert model_init_arg_names(spec.source())
    assert _init_signature(sub.source, "ModelNew") == _init_signature(spec.source(), "Model")
    assert "cuda_sources" in sub.source and "load_inline" in sub.source
    for global_setting in ("allow_tf32", "set_float32_matmul_precision", "fp32_precision", "cublasSetMathMode"):
        assert global_setting not in sub.source, global_setting
    assert "CUBLAS_COMPUTE_32F_FAST_TF32" in sub.source
    assert static_checks.check(sub.source) == []
    assert not kernels.launches_only_library_kernels(sub.source)


def test_tensor_core_solutions_build_extensions_of_their_own_names():
    names = [extract(tc_solution(s).read_text()).source.split('name="', 1)[1].split('"', 1)[0] for s in SPECS]
    current = [extract(current_solution(s).read_text()).source.split('name="', 1)[1].split('"', 1)[0] for s in SPECS]
    assert len(set(names)) == len(names) and not set(names) & set(current)


def _import_with_stub_extension(spec):
    """The solution module with load_inline stubbed (no CUDA here), and the stub standing for its extension."""
    ext = mock.MagicMock()
    name = f"_tc_gold_{spec.kernelbench_id.replace('/', '_')}"
    module_spec = importlib.util.spec_from_file_location(name, tc_solution(spec))
    module = importlib.util.module_from_spec(module_spec)
    with mock.patch("torch.utils.cpp_extension.load_inline", return_value=ext):
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    return module, ext


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_tensor_core_solution_holds_the_reference_parameters_and_derives_nothing_in_init(spec):
    problem = load_problem(ProblemLoad(path=spec.source_path, overrides=spec.size("small").overrides))
    init = problem.get_init_inputs()
    module, ext = _import_with_stub_extension(spec)
    torch.manual_seed(42)
    ref = problem.Model(*init).state_dict()
    torch.manual_seed(42)
    model = module.ModelNew(*init)
    gold = model.state_dict()
    assert list(gold) == list(ref)
    for key in ref:
        assert gold[key].shape == ref[key].shape and gold[key].dtype == ref[key].dtype
        assert torch.equal(gold[key], ref[key]), f"{key}: seeded initialisation differs"
    assert not ext.method_calls, f"__init__ called the extension: {ext.method_calls}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_the_weight_split_is_remade_exactly_when_the_weight_changes(spec):
    problem = load_problem(ProblemLoad(path=spec.source_path, overrides=spec.size("small").overrides))
    module, ext = _import_with_stub_extension(spec)
    model = module.ModelNew(*problem.get_init_inputs())
    ext.tf32_split.side_effect = lambda w: object()
    first = model._weight_split()
    assert model._weight_split() is first and ext.tf32_split.call_count == 1
    # What the harness does after construction: load_state_dict copies in place (same storage, new ._version).
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
    second = model._weight_split()
    assert second is not first and ext.tf32_split.call_count == 2
    assert model._weight_split() is second
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.weight = torch.nn.Parameter(linear.weight.detach().clone())  # a new tensor
    assert model._weight_split() is not second and ext.tf32_split.call_count == 3
