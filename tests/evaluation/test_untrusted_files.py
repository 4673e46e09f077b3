"""Files the candidate's process wrote, as the trusted side reads them (in process: no children): where they lie, and
what they hold."""

from __future__ import annotations

import io
import os
import tracemalloc
import zipfile

import pytest
import torch

from harness import grading
from harness.evaluation.protocol import JudgeCommand, PrepareCommand, ProblemLoad
from harness.evaluation.trusted import Trusted
from harness.evaluation.untrusted import UntrustedFile, read_untrusted
from harness.schema import Tolerance, TrialFigures
from harness.verdicts import Verdict


def test_a_regular_file_is_read(tmp_path):
    (tmp_path / "out_0.pt").write_bytes(b"x" * 10)
    assert read_untrusted(tmp_path / "out_0.pt", 100) == b"x" * 10


def test_a_fifo_in_place_of_an_output_is_refused_at_once_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "out_0.pt")  # a plain open() would block here until the evaluation's deadline
    with pytest.raises(UntrustedFile, match="not a regular file"):
        read_untrusted(tmp_path / "out_0.pt", 100)


def test_a_link_in_place_of_an_output_is_not_followed(tmp_path):
    (tmp_path / "secret").write_bytes(b"s")
    (tmp_path / "out_0.pt").symlink_to(tmp_path / "secret")
    with pytest.raises(UntrustedFile, match="cannot be opened as a regular file"):
        read_untrusted(tmp_path / "out_0.pt", 100)


def test_an_output_larger_than_the_problem_can_need_is_refused(tmp_path):
    (tmp_path / "out_0.pt").write_bytes(b"x" * 101)
    with pytest.raises(UntrustedFile, match="101 bytes"):
        read_untrusted(tmp_path / "out_0.pt", 100)


# --- what the files hold: the judge reads them as hostile data (in process, on the CPU) ------------------------

_LINEAR = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
    def forward(self, x):
        return self.linear(x)
def get_inputs():
    return [torch.rand(3, 8)]
def get_init_inputs():
    return []
"""


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _relocated(obj, location: bytes) -> bytes:
    """torch.save's archive of `obj` with its storages' location rewritten (a submission rewriting its saved
    output): the pickle's location string replaced, the archive written again, its records stored."""
    src = zipfile.ZipFile(io.BytesIO(_saved(obj)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.open(info).read()
            if info.filename.endswith("data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X" + len(location).to_bytes(4, "little") + location)
            dst.writestr(info.filename, data)
    return out.getvalue()


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A prepared trusted side on a small problem; `judge(data)` judges bytes as trial 0's output; the honest
    output of trial 0 is `judge.honest`."""
    tmp = tmp_path_factory.mktemp("judge")
    (tmp / "problem.py").write_text(_LINEAR)
    side = Trusted()
    side.prepare(PrepareCommand(problem=ProblemLoad(path=tmp / "problem.py"), device="cpu", param_seed=42,
                                draw_seed=7, input_seed=1234, trials=1, extra_distribution=False,
                                exchange_dir=tmp / "ex"))
    cmd = JudgeCommand(outputs_dir=tmp, atol=1e-4, rtol=1e-4)

    def run(data: bytes) -> dict:
        return side._judge_bytes(data, side.expected[0], side.ground_truth[0], cmd)

    run.honest = side.expected[0].clone()
    return run


def _verdict(figures: dict) -> grading.Grade | None:
    trial = TrialFigures.model_validate({"trial": 0, **figures})
    return grading._grade_trial("0", trial.structure_error, trial.outputs, Tolerance(atol=1e-4, rtol=1e-4),
                                trial.file_error)


def test_an_honest_output_is_judged_and_passes(judge):
    figures = judge(_saved(judge.honest))
    assert figures["outputs"][0]["mismatches_at_eval_tolerance"] == 0 and _verdict(figures) is None


@pytest.mark.parametrize("location", [b"", b"nodevice", b"cuda:0:0", b"cpu\n"])
def test_a_storage_location_that_names_no_device_is_the_submissions_runtime_error(judge, location):
    """A submission rewrote its saved output so that the storage location read as no device: torch.device('')
    raised in the judge, outside its guard, and the evaluation was the harness's infra_error, retried."""
    figures = judge(_relocated(judge.honest, location))
    assert "names no device" in figures["file_error"]
    assert _verdict(figures).verdict == Verdict.runtime_error


def test_an_output_on_another_device_is_a_structure_error(judge):
    figures = judge(_relocated(judge.honest, b"cuda:0"))
    assert figures["structure_error"] == "the output lives on cuda:0, the reference's on cpu"


@pytest.mark.parametrize(("make", "said"), [
    (lambda t: t.to_sparse(), "sparse_coo tensor"),
    (lambda t: t.to_sparse_csr(), "sparse_csr tensor"),
    (lambda t: torch.empty_like(t, device="meta"), "meta device"),
    (lambda t: torch.nn.Parameter(t), "Parameter (a torch.Tensor subclass)"),
    (lambda t: (t.to_sparse(),), "sparse_coo tensor"),
])
def test_an_output_that_is_not_a_dense_strided_plain_tensor_is_a_shape_mismatch(judge, make, said):
    """Sparse COO and CSR and meta tensors loaded as tensors and crashed the comparison (an infra_error)."""
    figures = judge(_saved(make(judge.honest)))
    assert said in figures["structure_error"], figures
    assert _verdict(figures).verdict == Verdict.shape_mismatch


def test_a_pickle_of_millions_of_small_objects_is_refused_before_it_is_unpickled(judge):
    """Two million small objects would take the judge's memory as Python objects (and minutes of the pure-Python
    weights-only unpickler); the archive's table of contents says how large its pickle is first."""
    bomb = _saved([[i] for i in range(2_000_000)])
    tracemalloc.start()
    try:
        figures = judge(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "its pickle has" in figures["file_error"] and _verdict(figures).verdict == Verdict.runtime_error
    assert peak < len(bomb) + (16 << 20), peak  # unpickled, the lists took 401 MB and 263 s on a 2-core host


def test_an_archive_with_compressed_or_too_many_records_is_refused(judge):
    data = _saved(judge.honest)
    src = zipfile.ZipFile(io.BytesIO(data))
    for extra, compression in ((0, zipfile.ZIP_DEFLATED), (100, zipfile.ZIP_STORED)):
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression) as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.open(info).read())
            for i in range(extra):
                dst.writestr(f"archive/data/x{i}", b"")
        figures = judge(out.getvalue())
        assert "compressed" in figures["file_error"] if extra == 0 else "records" in figures["file_error"]
    assert "not an archive" in judge(b"\x80\x02]q\x00.")["file_error"]  # a bare pickle: torch's legacy format


def test_a_description_the_candidate_saved_is_shown_bounded(judge):
    figures = judge(_saved("<" + "x" * 50_000 + ">"))
    assert len(figures["structure_error"]) < 300


def test_an_output_the_judge_cannot_open_is_the_submissions_and_a_missing_one_says_so(tmp_path):
    """The candidate owns its outputs dir: a dir in a file's place, or an unreadable dir on the way, is a file_error
    of the submission's; a file it never saved is a structure error, as before."""
    side = Trusted()
    (tmp_path / "out_0.pt").mkdir()
    assert "out_0.pt" in side._read(tmp_path / "out_0.pt")["file_error"]
    (tmp_path / "plain").write_text("x")
    assert "file_error" in side._read(tmp_path / "plain" / "out_0.pt")  # a file where a dir should be: ENOTDIR
    assert side._read(tmp_path / "none.pt") == {"structure_error": "the candidate saved no output for this call"}
