"""Metadata for the built-in problems (PROBLEMS.md). The model code lives in kernelbench/level2/."""

from __future__ import annotations

from pathlib import Path

from harness.problems.spec import ProblemSpec, SizeVariant, model_init_arg_names

KERNELBENCH_DIR = Path(__file__).parent / "kernelbench"

# Epilogue arithmetic per output element is small next to the GEMM; a generous count keeps the
# speed-of-light floor a floor.
_EPILOGUE_FLOPS_PER_ELEMENT = 16


def _gemm_family(batch: int, k: int, n: int, *, extra_params: int, out_elems: int) -> tuple[float, float]:
    """FLOPs and minimum bytes of Linear(k -> n) on (batch, k) followed by an elementwise epilogue."""
    flops = 2.0 * batch * k * n + _EPILOGUE_FLOPS_PER_ELEMENT * batch * n
    floats = batch * k + n * k + n + extra_params + out_elems  # x, W, Linear bias, other params, output
    return flops, 4.0 * floats


def _variant(batch: int, k: int, n: int, *, extra_params: int, out_elems: int, **overrides) -> SizeVariant:
    flops, nbytes = _gemm_family(batch, k, n, extra_params=extra_params, out_elems=out_elems)
    return SizeVariant(overrides=overrides, flops=flops, min_bytes=nbytes)


def _spec(
    slug: str, kb_number: int, stem: str, description: str, default: SizeVariant, small: SizeVariant
) -> ProblemSpec:
    path = KERNELBENCH_DIR / "level2" / f"{stem}.py"
    return ProblemSpec(
        id=slug,
        version=1,
        kernelbench_id=f"level2/{kb_number}",
        name=stem,
        source_path=path,
        description=description,
        builtin=True,
        sizes={"default": default, "small": small},
        init_arg_names=model_init_arg_names(path.read_text()),
    )


def builtin_problems() -> list[ProblemSpec]:
    # Small sizes: KernelBench v0's scale, trimmed so CPU tests stay quick.
    return [
        _spec(
            "gemm-groupnorm-min-biasadd", 75, "75_Gemm_GroupNorm_Min_BiasAdd",
            "Gemm, GroupNorm, min over features, + bias of shape (1,C,1,1): output (1, C, B, 1).",
            _variant(1024, 8192, 8192, extra_params=2 * 8192 + 8192, out_elems=8192 * 1024),
            _variant(128, 256, 256, extra_params=2 * 256 + 256, out_elems=256 * 128,
                     batch_size=128, in_features=256, out_features=256, num_groups=8,
                     bias_shape=[1, 256, 1, 1]),
        ),
        _spec(
            "matmul-groupnorm-leakyrelu-sum", 62, "62_Matmul_GroupNorm_LeakyReLU_Sum",
            "Matmul, GroupNorm, LeakyReLU, x + x.",
            _variant(1024, 8192, 8192, extra_params=2 * 8192, out_elems=1024 * 8192),
            _variant(128, 256, 256, extra_params=2 * 256, out_elems=128 * 256,
                     batch_size=128, input_size=256, hidden_size=256, num_groups=8),
        ),
        _spec(
            "matmul-swish-sum-groupnorm", 37, "37_Matmul_Swish_Sum_GroupNorm",
            "Matmul, Swish, + bias, GroupNorm.",
            _variant(32768, 1024, 4096, extra_params=3 * 4096, out_elems=32768 * 4096),
            _variant(256, 128, 256, extra_params=3 * 256, out_elems=256 * 256,
                     batch_size=256, in_features=128, out_features=256, num_groups=8,
                     bias_shape=[256]),
        ),
        _spec(
            "gemm-biasadd-hardtanh-mish-groupnorm", 94, "94_Gemm_BiasAdd_Hardtanh_Mish_GroupNorm",
            "Gemm, + bias, Hardtanh [-1, 1], Mish, GroupNorm.",
            _variant(1024, 8192, 8192, extra_params=3 * 8192, out_elems=1024 * 8192),
            _variant(128, 256, 256, extra_params=3 * 256, out_elems=128 * 256,
                     batch_size=128, in_features=256, out_features=256, bias_shape=[256], num_groups=8),
        ),
        _spec(
            "gemm-groupnorm-hardtanh", 30, "30_Gemm_GroupNorm_Hardtanh",
            "Gemm, GroupNorm, Hardtanh(-2, 2).",
            _variant(1024, 8192, 8192, extra_params=2 * 8192, out_elems=1024 * 8192),
            _variant(128, 256, 256, extra_params=2 * 256, out_elems=128 * 256,
                     batch_size=128, in_features=256, out_features=256, num_groups=4),
        ),
        _spec(
            "gemm-groupnorm-swish-multiply-swish", 88, "88_Gemm_GroupNorm_Swish_Multiply_Swish",
            "Gemm, GroupNorm, Swish, * weight, Swish.",
            _variant(1024, 8192, 8192, extra_params=3 * 8192, out_elems=1024 * 8192),
            _variant(128, 256, 256, extra_params=3 * 256, out_elems=128 * 256,
                     batch_size=128, in_features=256, out_features=256, num_groups=8,
                     multiply_weight_shape=[256]),
        ),
    ]
