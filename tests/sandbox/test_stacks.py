"""A timeout says where the candidate hung: its Python stacks and its threads' kernel state, dumped into its log
before the kill (harness/sandbox/stacks.py), shown in the verdict's log excerpt."""

from __future__ import annotations

from harness.evaluation.runner import EvalOptions, evaluate
from harness.verdicts import Verdict

HANGS_IN_A_HELPER = """import torch


def spin_forever(x):
    while True:
        x = x + 0


class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return spin_forever(x)
"""


def test_a_timeout_shows_where_the_candidate_hung_in_its_log_excerpt(settings, registry):
    """'correctness phase exceeded its 30 s limit' came with an empty log. Now its Python stacks (faulthandler) and
    its threads' kernel state are dumped into the log before the kill, and the verdict's excerpt shows them."""
    r = evaluate(registry.get("level2/30"), HANGS_IN_A_HELPER, EvalOptions(device="cpu", size="small",
                                                                         run_timeout_s=5), settings)
    assert r.verdict == Verdict.timeout and "correctness phase" in r.message, r.message
    excerpt = r.log_excerpt
    assert "the correctness phase timed out (past its 5 s limit)" in excerpt, excerpt
    assert "most recent call first" in excerpt and "in spin_forever" in excerpt and "in forward" in excerpt, excerpt
    assert "native: " in excerpt and "thread(s) of pid" in excerpt, excerpt


def test_a_candidate_that_turned_faulthandler_off_still_times_out_and_the_log_says_so(settings, registry):
    source = HANGS_IN_A_HELPER.replace("import torch\n", "import faulthandler\nimport signal\nimport torch\n\n"
                                       "faulthandler.unregister(signal.SIGUSR1)\n"
                                       "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n")
    r = evaluate(registry.get("level2/30"), source, EvalOptions(device="cpu", size="small", run_timeout_s=5),
                 settings)
    assert r.verdict == Verdict.timeout and "correctness phase" in r.message, r.message
    assert "no Python stacks came within 2 s of SIGUSR1" in r.log_excerpt, r.log_excerpt
    assert "most recent call first" not in r.log_excerpt
