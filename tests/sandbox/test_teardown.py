"""An evaluation ends when its verdict is known: the trusted side's work for a candidate that already failed is
stopped, not waited for, and a warm trusted process left mid-command is replaced rather than kept."""

from __future__ import annotations

import time

from harness.evaluation.runner import EvalOptions, evaluate
from harness.evaluation.warm import TrustedPool
from harness.problems.spec import ProblemSpec
from harness.verdicts import Verdict

INPUT_S = 10.0  # each get_inputs() call of the slow problem: six trials make a minute of preparation

SLOW_PROBLEM = f"""import time
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    time.sleep({INPUT_S})  # the trusted side's preparation: inputs and reference outputs of a large problem
    return [torch.rand(4, 4)]


def get_init_inputs():
    return []
"""

FAILS_AT_IMPORT = "import torch\nundefined_name\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


def _slow_spec(tmp_path) -> ProblemSpec:
    path = tmp_path / "1_SlowInputs.py"
    path.write_text(SLOW_PROBLEM)
    return ProblemSpec(id="slow/1", name="1_SlowInputs", source_path=path)


def test_a_candidate_failing_at_import_ends_the_evaluation_while_the_reference_still_prepares(settings, tmp_path):
    """An import NameError at full size took 141.8 s, 139.8 s of it teardown: the trusted side was let finish
    the trials' inputs and reference outputs nobody would use. Here they take a minute; the verdict comes first."""
    t0 = time.monotonic()
    r = evaluate(_slow_spec(tmp_path), FAILS_AT_IMPORT, EvalOptions(device="cpu", size="default"), settings)
    elapsed = time.monotonic() - t0
    assert r.verdict == Verdict.runtime_error and "NameError" in r.message, r.message
    assert elapsed < 6 * INPUT_S / 2, (elapsed, r.observations.phases)
    assert r.observations.phases["teardown"] < 10, r.observations.phases


def test_a_warm_trusted_process_left_mid_preparation_is_replaced_not_kept(settings, tmp_path):
    pool = TrustedPool(settings)
    try:
        t0 = time.monotonic()
        r = evaluate(_slow_spec(tmp_path), FAILS_AT_IMPORT,
                     EvalOptions(device="cpu", size="default", trusted_pool=pool), settings)
        assert r.verdict == Verdict.runtime_error, r.message
        assert time.monotonic() - t0 < 6 * INPUT_S / 2
        assert not pool.kept  # it was at work for an evaluation that is over: out of step, so ended
    finally:
        pool.close()

