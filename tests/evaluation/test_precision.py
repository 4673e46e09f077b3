"""Evaluations at a precision (harness/precision.py): inputs, parameters and both models cast as KernelBench casts them,
the tolerance from the precision, the reference's output dtype expected of the candidate, baselines timed alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness import precision
from harness.evaluation import problem_module, timing
from harness.evaluation.protocol import ProblemLoad
from harness.schema import Tolerance
from harness.verdicts import Verdict

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _load(path: Path, prec: str, **overrides) -> object:
    return problem_module.load_problem(ProblemLoad(path=path, overrides=overrides, precision=prec),
                                       f"_test_precision_{prec}")


def test_inputs_are_cast_to_the_precision_but_integer_inputs_keep_their_dtype():
    module = _load(FIXTURES / "kernelbench/level1/95_CrossEntropyLoss.py", "bf16", batch_size=8, num_classes=16,
                   input_shape=[16])
    predictions, targets = module.get_inputs()
    assert predictions.dtype == torch.bfloat16 and targets.dtype == torch.int64
    seeded = problem_module.seeded_inputs(module, 3, torch.device("cpu"))  # as a timed window makes them
    assert [t.dtype for t in seeded] == [torch.bfloat16, torch.int64]
    assert module.Model(*module.get_init_inputs())(*seeded).dtype == torch.bfloat16


def test_fp32_leaves_a_problems_fp32_inputs_as_they_are(registry):
    spec = registry.get("level2/30")
    module = _load(spec.source_path, "fp32", **spec.size("small").overrides)
    (x,) = module.get_inputs()
    assert x.dtype == torch.float32


def test_a_reference_window_at_fp16_runs_the_fp16_model_on_fp16_inputs(registry):
    spec = registry.get("level2/30")
    module = _load(spec.source_path, "fp16", **spec.size("small").overrides)
    model = module.Model(*module.get_init_inputs()).to(problem_module.dtype_of("fp16"))
    kept: list = []
    timing.run_window(model, module, [1, 2], [5, 6], torch.device("cpu"), None, keep=kept)
    assert [out.dtype for out in kept] == [torch.float16, torch.float16]


def test_each_precision_has_kernelbench_tolerance_and_the_problems_own_applies_at_fp32(registry):
    spec = registry.get("level2/30")
    assert spec.tolerance_at("fp32") == spec.tolerance == Tolerance(atol=1e-4, rtol=1e-4)
    assert spec.tolerance_at("fp16") == spec.tolerance_at("bf16") == Tolerance(atol=1e-2, rtol=1e-2)
    loose = spec.model_copy(update={"tolerance": Tolerance(atol=5e-2, rtol=1e-3)})
    assert loose.tolerance_at("bf16") == Tolerance(atol=5e-2, rtol=1e-2)  # looser of the two, part by part
    with pytest.raises(precision.UnknownPrecision, match="fp8"):
        spec.tolerance_at("fp8")


def test_the_speed_of_light_bytes_halve_at_a_half_precision(registry):
    variant = registry.get("level2/30").size("small")
    assert variant.min_bytes is not None
    assert variant.min_bytes_at("fp16") == variant.min_bytes_at("bf16") == variant.min_bytes / 2
    assert variant.min_bytes_at("fp32") == variant.min_bytes


def test_an_fp16_evaluation_of_a_cast_aware_kernel_passes_at_fp16s_tolerance_and_fails_at_fp32s(run_fixture):
    r = run_fixture("level2/30", "l30_fp32_accumulate.py", precision="fp16")
    assert r.verdict == Verdict.passed, r.message
    assert r.problem.precision == "fp16" and r.tolerance == Tolerance(atol=1e-2, rtol=1e-2)
    for t in r.observations.trials:
        (out,) = t.outputs
        assert out.got_dtype == out.expected_dtype == "float16"
        # Nearer the float64 truth than the fp16 reference is: what computing in fp32 buys.
        assert out.err_vs_fp64 is not None and out.ref_err_vs_fp64 is not None
        assert 1e-4 < out.max_rel_err < 1e-2 and out.err_vs_fp64 < out.ref_err_vs_fp64
    # Timed at fp16 on both sides: the handed-over timed outputs are fp16 and judged against the fp16 reference.
    check = r.observations.timed_outputs
    assert check is not None and check.calls
    assert all(c.outputs[0].got_dtype == c.outputs[0].expected_dtype == "float16" for c in check.calls)
    strict = run_fixture("level2/30", "l30_fp32_accumulate.py", precision="fp16", timing=False,
                         tolerance=Tolerance(atol=1e-4, rtol=1e-4))
    assert strict.verdict == Verdict.wrong_answer, strict.message


def test_an_output_left_in_fp32_at_fp16_is_a_dtype_mismatch(run_fixture):
    r = run_fixture("level2/30", "l30_returns_fp32.py", precision="fp16", timing=False)
    assert r.verdict == Verdict.dtype_mismatch, r.message
    assert "float32" in r.message and "float16" in r.message
    fp32 = run_fixture("level2/30", "l30_returns_fp32.py", timing=False)  # its honest twin: right at fp32
    assert fp32.verdict == Verdict.passed and fp32.problem.precision == "fp32", fp32.message


@pytest.mark.parametrize("prec", ["bf16", "fp16"])
def test_the_reference_resubmitted_passes_at_a_half_precision_on_the_cpu(run_fixture, prec):
    r = run_fixture("level2/30", "l30_pytorch_correct.py", precision=prec, timing=False)
    assert r.verdict == Verdict.passed, r.message
    assert r.observations.trials[0].outputs[0].got_dtype == precision.DTYPE_NAMES[prec]
    assert r.observations.state_dict is not None and r.observations.state_dict.copied  # parameters at prec matched


FP32_ONLY = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        if x.dtype != torch.float32:  # as an op without a half-precision kernel on this device fails
            raise RuntimeError(f'"some_op_cpu" not implemented for {x.dtype}')
        return x * 2


def get_inputs():
    return [torch.rand(16, 16)]


def get_init_inputs():
    return []
'''


def test_a_reference_that_cannot_run_at_the_precision_is_the_harnesss_failure_not_the_submissions(tmp_path, settings):
    from harness.evaluation.runner import EvalOptions, evaluate
    from harness.problems import load_kernelbench_dir

    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "1_Fp32Only.py").write_text(FP32_ONLY)
    (spec,) = load_kernelbench_dir(tmp_path)
    text = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    r = evaluate(spec, text, EvalOptions(device="cpu", precision="fp16", timing=False), settings)
    assert r.verdict == Verdict.infra_error and "not implemented for torch.float16" in r.message, r.message
    assert evaluate(spec, text, EvalOptions(device="cpu", timing=False), settings).verdict == Verdict.passed
