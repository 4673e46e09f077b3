"""Where the trial segments live: the probe's decision (injected probes, no GPU), the runner never sending a CUDA
evaluation device segments its probe failed, and the probe's own path end to end with host memory (the confined
child, the descriptors' relay, the bytes both ways)."""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from harness.evaluation import exchange_probe
from harness.evaluation.handles import Trusted
from harness.evaluation.runner import EvalOptions, _Evaluation
from harness.sandbox import limits
from harness.sandbox.process import ChildExited, ChildProcess, scrubbed_env
from harness.schema import Observations, Provenance, Tolerance

KEY = ("cuda", "NVIDIA H100 80GB HBM3", "")


@pytest.fixture(autouse=True)
def _fresh_probes():
    exchange_probe.forget()
    yield
    exchange_probe.forget()


class Probe:
    """An injected probe: `failure` its answer (None: passed), counting its runs."""

    def __init__(self, failure: str | None = None, raises: Exception | None = None):
        self.failure, self.raises, self.runs = failure, raises, 0

    def __call__(self) -> str | None:
        self.runs += 1
        if self.raises is not None:
            raise self.raises
        return self.failure


def test_a_failed_probe_means_host_segments_with_its_reason_logged_and_is_not_run_again(caplog):
    probe = Probe("a confined child could not attach it: CudaError: cuMemImportFromShareableHandle failed")
    with caplog.at_level(logging.WARNING, logger="harness.exchange_probe"):
        first = exchange_probe.choose("auto", "cuda", KEY, probe)
        second = exchange_probe.choose("auto", "cuda", KEY, probe)
    assert first == second == ("cpu", "host (device probe failed: a confined child could not attach it: CudaError: "
                                      "cuMemImportFromShareableHandle failed)")
    assert probe.runs == 1
    assert "cuMemImportFromShareableHandle" in caplog.text


def test_its_twin_a_passing_probe_means_device_segments():
    probe = Probe(None)
    assert exchange_probe.choose("auto", "cuda", KEY, probe) == ("cuda", "device (probe passed)")
    assert exchange_probe.choose("auto", "cuda", KEY, probe) == ("cuda", "device (probe passed)")
    assert probe.runs == 1


def test_a_probe_that_raises_is_a_failed_probe():
    got = exchange_probe.choose("auto", "cuda", KEY, Probe(raises=OSError("no libcuda.so.1")))
    assert got == ("cpu", "host (device probe failed: OSError: no libcuda.so.1)")


def test_each_gpu_is_probed_apart():
    failing, passing = Probe("cuMemCreate failed"), Probe(None)
    assert exchange_probe.choose("auto", "cuda", (*KEY[:2], "0"), failing)[0] == "cpu"
    assert exchange_probe.choose("auto", "cuda", (*KEY[:2], "1"), passing)[0] == "cuda"
    assert (failing.runs, passing.runs) == (1, 1)


@pytest.mark.parametrize(("setting", "device", "want"), [
    ("host", "cuda", ("cpu", "host (setting)")),
    ("device", "cuda", ("cuda", "device (setting)")),
    ("auto", "cpu", ("cpu", "host")),
    ("device", "cpu", ("cpu", "host")),
])
def test_the_setting_or_a_cpu_evaluation_decides_without_a_probe(setting, device, want):
    probe = Probe("never asked")
    assert exchange_probe.choose(setting, device, KEY, probe) == want
    assert probe.runs == 0


# --- the runner: what the trusted side is told -------------------------------------------------------------------

class _FakeTrusted:
    """The trusted side's handle as `prepare` uses it: records each command, answers the init arguments' message."""

    def __init__(self):
        self.sent: list[dict] = []
        self.proc = SimpleNamespace(receive_fds=lambda count: [])

    def send(self, command, timeout_s=None):
        self.sent.append(command)

    def wait(self, reply, final=True):
        return SimpleNamespace(fields={"init_arg_count": 0, "init_args": {"kind": "list", "entries": []},
                                       "segments": []})


def _prepare_on_cuda(registry, settings, tmp_path) -> tuple[dict, Observations]:
    obs = Observations()
    settings = settings.model_copy(update={"eager_process_cuda": "trusted"})  # the prepare alone: no process started
    ev = _Evaluation(registry.get("level2/75"), "", EvalOptions(device="cuda", size="small"), settings,
                     Tolerance(atol=1e-4, rtol=1e-4), obs, tmp_path)
    ev.cand_home, ev.job = tmp_path / "candidate", tmp_path
    ev.provenance = Provenance(harness_version="0", device="cuda", device_name=KEY[1], torch_version="2",
                               python_version="3.11", hostname="h", started_at=datetime.now(timezone.utc))
    ev.trusted = _FakeTrusted()  # type: ignore[assignment]
    ev.candidate = SimpleNamespace(proc=SimpleNamespace(send_fds=lambda fds: None))  # type: ignore[assignment]
    ev.prepare()
    (command,) = ev.trusted.sent  # type: ignore[attr-defined]
    return command, obs


def test_a_cuda_evaluation_whose_probe_failed_is_prepared_with_host_segments(registry, settings, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(exchange_probe, "run", lambda *a, **k: exchange_probe.Outcome("cuMemCreate failed: "
                                                                                       "CUDA_ERROR_NOT_SUPPORTED"))
    command, obs = _prepare_on_cuda(registry, settings, tmp_path)
    assert command["cmd"] == "prepare" and command["exchange_device"] == "cpu"
    assert obs.exchange_memory == "host (device probe failed: cuMemCreate failed: CUDA_ERROR_NOT_SUPPORTED)"
    assert "exchange_probe" in obs.phases


def test_its_twin_whose_probe_passed_is_prepared_with_device_segments(registry, settings, tmp_path, monkeypatch):
    monkeypatch.setattr(exchange_probe, "run", lambda *a, **k: exchange_probe.Outcome(None))
    command, obs = _prepare_on_cuda(registry, settings, tmp_path)
    assert command["exchange_device"] == "cuda"
    assert obs.exchange_memory == "device (probe passed)"


def test_the_host_setting_prepares_a_cuda_evaluation_with_host_segments_and_no_probe(registry, settings, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setattr(exchange_probe, "run", lambda *a, **k: pytest.fail("probed"))
    command, obs = _prepare_on_cuda(registry, settings.model_copy(update={"exchange_memory": "host"}), tmp_path)
    assert command["exchange_device"] == "cpu" and obs.exchange_memory == "host (setting)"


# --- the probe's path, end to end, with host memory ----------------------------------------------------------------

def test_the_probe_crosses_the_sandbox_both_ways_and_reports_why_it_cannot(settings, tmp_path):
    """With a host segment the whole path runs here: the trusted process's export, the relay, the child confined as
    the candidate is attaching it, the bytes both ways. Its twin asks for CUDA memory on this host: a failure with
    its reason, the trusted process still in step."""
    home = tmp_path / "trusted"
    home.mkdir()
    proc = ChildProcess("harness.evaluation.trusted", [], cwd=home, env=scrubbed_env({}, home),
                        log_path=tmp_path / "trusted.log", kill_grace_s=settings.kill_grace_s,
                        jail=limits.jail(settings, untrusted=False), fd_socket=True)
    try:
        proc.next_message(time.monotonic() + 120)
        trusted = Trusted(proc, 120)
        passed = exchange_probe.run(trusted, settings, tmp_path / "probe", tmp_path / "probe.log", {}, device="cpu")
        assert passed.failure is None, passed.failure
        assert "pidns" in passed.child and passed.child["bytes_ok"] is True
        failed = exchange_probe.run(trusted, settings, tmp_path / "probe2", tmp_path / "probe2.log", {})
        assert failed.failure is not None and failed.failure.startswith("the trusted side could not export")
        assert trusted.call({"cmd": "ping"}, "pong") == {}
    finally:
        with contextlib.suppress(ChildExited):
            proc.send({"cmd": "exit"})
        proc.reap()
