"""The parent's side of the kernel trace, against a scripted candidate process (the real one runs in the GPU tests):
the kernels a traced window launched are taken as they arrive before its reply, and are claims that credit only what
the submission defined; a `launched` message outside a traced window, or a malformed one, is a protocol violation."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from harness import kernels
from harness.evaluation.handles import Candidate, CandidateStopped
from harness.evaluation.protocol import Trace, Window
from harness.sandbox.process import Message
from harness.schema import Observations
from harness.verdicts import Phase


class ScriptedProcess:
    """Answers each command sent with the messages `script` gives for it (the reply's nonce filled in)."""

    def __init__(self, script):
        self.script, self.queue = script, []

    def resume(self) -> None:
        pass

    def send(self, text: str) -> None:
        cmd = Window.model_validate_json(text) if '"window"' in text else Trace.model_validate_json(text)
        for event, fields in self.script(cmd):
            self.queue.append(Message(event, {**fields, "nonce": fields.get("nonce", cmd.nonce)}, time.monotonic()))

    def next_message(self, deadline: float) -> Message:
        return self.queue.pop(0)


def _candidate(script, builds: Path) -> Candidate:
    return Candidate(ScriptedProcess(script), Observations(), builds, contextlib.ExitStack(), 1.0,
                     source="import triton\n\n@triton.jit\ndef add_kernel(x):\n    pass\n")


def _window(trace: bool) -> Window:
    return Window(seeds=[1], forward_seeds=[2], trace=trace)


def test_a_traced_windows_launches_are_taken_as_they_arrive_and_credit_only_what_it_defined(tmp_path):
    launched = [("launched", {"name": "fused_kernel(float*, int)", "handle": 0x10}),
                ("launched", {"name": "void at::native::vectorized_elementwise_kernel<4>(int)", "handle": 0x20}),
                ("launched", {"name": "add_kernel", "handle": 0x30}),
                ("launched", {"name": "triton_", "handle": 0x40}),
                ("launched", {"graph": True})]

    def script(cmd):
        if isinstance(cmd, Window):
            return (launched if cmd.trace else []) + [("window_done", {})]
        return [("traced", {"own_triton": {"add_kernel": [0x30], "triton_": [0x50]},
                            "own_build": {"fused_kernel(float*, int)": [0x10, 0x11],
                                          "void at::native::vectorized_elementwise_kernel<4>(int)": [0x21]}})]

    cand = _candidate(script, tmp_path)
    cand.request(_window(False), 10, Phase.timing)
    cand.begin_trace(3)
    cand.request(_window(True), 10, Phase.timing)
    cand.record_trace(cand.request(Trace(), 10, Phase.timing).fields)
    trace = cand.obs.kernels
    assert trace is not None and trace.window == 3 and trace.graph and len(trace.launches) == 4
    assert trace.names == [launch.name for launch in trace.launches]
    defined = {"fused_kernel(float*, int)", "void at::native::vectorized_elementwise_kernel<4>(int)"}
    own = kernels.custom_kernels(trace.launches, defined, cand.source, trace.own_triton, trace.own_build)
    # Its build's kernel by its own handle, and its own @triton.jit function's compiled kernel; not PyTorch's kernel
    # of a name its build also defines, not a `triton_` of a handle that its text's functions never compiled.
    assert own == ["add_kernel", "fused_kernel(float*, int)"]


@pytest.mark.parametrize("message", [
    {"name": "add_kernel", "handle": 0x30},  # outside the traced window
    {"name": ["not", "a", "name"]},  # malformed, in it
])
def test_a_launched_message_out_of_turn_or_malformed_is_a_protocol_violation(tmp_path, message):
    traced = "handle" not in message

    def script(cmd):
        return [("launched", message), ("window_done", {})]

    cand = _candidate(script, tmp_path)
    if traced:
        cand.begin_trace(0)
    with pytest.raises(CandidateStopped):
        cand.request(_window(traced), 10, Phase.timing)
    assert cand.obs.protocol_violations, cand.obs
