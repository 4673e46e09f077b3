"""What the candidate's process packed into shared memory, as the trusted side reads it (in process: no children): its
layout is hostile data, checked before a byte is read, and the bytes are copied out before anything looks at them."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from harness import grading
from harness.evaluation import exchange, untrusted
from harness.evaluation.protocol import JudgeCommand, PrepareCommand, ProblemLoad
from harness.evaluation.trusted import Trusted
from harness.schema import Tolerance, TrialFigures
from harness.verdicts import Verdict

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



@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A prepared trusted side on a small problem; `judge(layout)` takes and judges a layout of trial 0's output in
    its output segment (`judge.pack(obj)` packs an object there as the candidate's process does); the honest
    output of trial 0 is `judge.honest`."""
    tmp = tmp_path_factory.mktemp("judge")
    (tmp / "problem.py").write_text(_LINEAR)
    side = Trusted()
    side.prepare(PrepareCommand(problem=ProblemLoad(path=tmp / "problem.py"), device="cpu", param_seed=42,
                                draw_seed=7, input_seed=1234, trials=1, extra_distribution=False))
    cmd = JudgeCommand(atol=1e-4, rtol=1e-4)
    seg = side.segments["output"]

    def run(layout) -> dict:
        got = side._take(layout, seg, 1)
        return side._judge_got(got, side.expected[0], side.ground_truth[0], cmd)

    run.pack = lambda obj: exchange.pack(obj, seg)
    run.segment = seg
    run.honest = side.expected[0].clone()
    return run


def _verdict(figures: dict) -> grading.Grade | None:
    trial = TrialFigures.model_validate({"trial": 0, **figures})
    return grading._grade_trial("0", trial.structure_error, trial.outputs, Tolerance(atol=1e-4, rtol=1e-4),
                                trial.file_error)


def test_an_honest_output_is_judged_and_passes(judge):
    figures = judge(judge.pack(judge.honest))
    assert figures["outputs"][0]["mismatches_at_eval_tolerance"] == 0 and _verdict(figures) is None


def test_bytes_written_into_the_segment_after_the_take_change_nothing_judged(judge):
    """The candidate can write into its output segment at any time: the judge compares its own copy."""
    layout = judge.pack(judge.honest)
    got = exchange.take(layout, judge.segment, 1, torch.device("cpu"))
    judge.segment.write(0, torch.zeros(judge.segment.nbytes, dtype=torch.uint8))
    assert torch.equal(got, judge.honest)


@pytest.mark.parametrize(("mangle", "said"), [
    (lambda lay: {**lay, "kind": "pickle"}, "kind"),
    (lambda lay: "not an object", "not an object"),
    (lambda lay: {**lay, "entries": [{"tensor": {**lay["entries"][0]["tensor"], "dtype": "object"}}]}, "dtype"),
    (lambda lay: {**lay, "entries": [{"tensor": {**lay["entries"][0]["tensor"], "shape": [-1, 4]}}]},
     "dimension"),
    (lambda lay: {**lay, "entries": [{"tensor": {**lay["entries"][0]["tensor"], "shape": [1 << 40, 1 << 40]}}]},
     "more than any device holds"),
    (lambda lay: {**lay, "entries": [{"tensor": {**lay["entries"][0]["tensor"], "offset": 1 << 40}}]}, "offset"),
    (lambda lay: {**lay, "entries": [{"tensor": {**lay["entries"][0]["tensor"], "offset": 8}}]}, "unaligned"),
    (lambda lay: {**lay, "entries": [{"tensor": {**lay["entries"][0]["tensor"], "offset": None}}]},
     "was not written"),
    (lambda lay: {**lay, "kind": "list", "entries": lay["entries"] * 100}, "entries"),
    (lambda lay: {**lay, "kind": "list", "entries": lay["entries"] * 2}, "overlaps"),
])
def test_a_layout_that_the_packing_never_writes_is_the_submissions_runtime_error(judge, mangle, said):
    """A submission rewrote the layout of its output (or the bytes it names): each such layout is refused before a
    byte is read, as the submission's runtime_error, never a failure of the judge's."""
    figures = judge(mangle(judge.pack(judge.honest)))
    assert said in figures["file_error"], figures
    assert _verdict(figures).verdict == Verdict.runtime_error


def test_an_output_on_another_device_is_a_structure_error(judge):
    figures = judge({**judge.pack(judge.honest), "device": "cuda"})
    assert figures["structure_error"] == "the output lives on cuda, the reference's on cpu"


@pytest.mark.parametrize(("make", "said"), [
    (lambda t: t.to_sparse(), "sparse_coo tensor"),
    (lambda t: t.to_sparse_csr(), "sparse_csr tensor"),
    (lambda t: torch.empty_like(t, device="meta"), "meta device"),
    (lambda t: torch.nn.Parameter(t), "Parameter (a torch.Tensor subclass)"),
    (lambda t: (t.to_sparse(),), "sparse_coo tensor"),
])
def test_an_output_that_is_not_a_dense_strided_plain_tensor_is_a_shape_mismatch(judge, make, said):
    """Sparse COO and CSR and meta tensors once loaded as tensors and crashed the comparison (an infra_error): the
    packing describes them instead, and the description is the judge's structure error."""
    figures = judge(judge.pack(make(judge.honest)))
    assert said in figures["structure_error"], figures
    assert _verdict(figures).verdict == Verdict.shape_mismatch


def test_an_output_of_another_shape_too_large_for_the_segment_is_judged_by_its_shape(judge):
    """Its data cannot fit (it is not the reference's size): its layout says its shape, and the figures do."""
    figures = judge(judge.pack(torch.zeros(300, 400)))
    assert figures["outputs"][0]["got_shape"] == [300, 400]
    assert _verdict(figures).verdict == Verdict.shape_mismatch


def test_a_value_that_is_no_tensor_is_a_shape_mismatch(judge):
    figures = judge({"kind": "list", "device": "cpu", "entries": [{"value": 3}]})
    assert "not a tensor" in figures["structure_error"] and _verdict(figures).verdict == Verdict.shape_mismatch


def test_a_description_the_candidate_packed_is_shown_bounded(judge):
    figures = judge({"kind": "other", "description": "<" + "x" * 50_000 + ">"})
    assert len(figures["structure_error"]) < 300


def test_no_output_is_a_structure_error(judge):
    assert judge(None) == {"structure_error": "the candidate saved no output for this call"}


def test_a_segment_shrunk_under_the_reader_reads_short_never_faults():
    """The trusted side reads with preadv, never through a mapping: an (unsealed) segment the candidate shrank
    after its reply reads short, the submission's runtime_error; a mapping read would have been SIGBUS, the
    trusted process's death."""
    fd = os.memfd_create("unsealed")
    os.ftruncate(fd, 4096)
    seg = exchange.Segment(fd, 4096, "cpu")
    layout = exchange.pack(torch.ones(16, 16), seg)
    os.ftruncate(fd, 0)
    with pytest.raises(untrusted.UntrustedFile, match="it was shrunk"):
        exchange.take(layout, seg, 1, torch.device("cpu"))
    seg.close()


def test_the_trusted_sides_segments_cannot_be_resized():
    """Sealed: nobody (the candidate with its descriptor included) shrinks or grows them."""
    seg = exchange.create(4096, "cpu")
    for size in (0, 8192):
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, size)
    seg.close()


def test_a_read_only_segment_handed_to_the_candidate_cannot_be_written_through_its_descriptor():
    seg = exchange.create(4096, "cpu", writable=False)
    fd = seg.shared_fd()
    with pytest.raises(OSError):
        os.pwrite(fd, b"x", 0)
    mine = exchange.attach(seg.spec("inputs"), fd)
    view = mine.view(0, 16)
    view.fill_(7)  # a private, copy-on-write mapping: the writer's alone
    assert exchange.Segment(seg.fd, 4096, "cpu").read(0, 16, torch.device("cpu")).sum() == 0
    seg.close()


def test_the_parameters_segment_cannot_be_written_again_through_proc_by_a_process_of_the_same_uid():
    """A read-only descriptor is no seal: the same uid opens the memfd again through /proc/self/fd with write access
    (0600 keeps other uids out, not its own). The parameters go to the candidate first and to eager's own process
    after the judge, so a candidate that rewrote them would time eager on a model of its choosing. Frozen once
    written: no descriptor writes them, and a shared writable mapping is refused; the honest read still works."""
    trusted = Trusted()
    state = {"linear.weight": torch.arange(32.0).reshape(4, 8), "linear.bias": torch.ones(4)}
    layout, specs = trusted._packed("parameters", state)
    seg = trusted.segments["parameters"]
    fd = seg.shared_fd()
    again = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # what a candidate of the trusted side's uid can do
    try:
        with pytest.raises(PermissionError):
            os.pwrite(again, b"\xff" * 64, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(again, seg.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        taken = exchange.unpack(layout, exchange.attach(specs[0], os.dup(fd)), torch.device("cpu"))  # its side
        assert all(torch.equal(taken[k], v) for k, v in state.items())
    finally:
        os.close(fd)
        os.close(again)
        seg.close()


def test_the_inputs_segment_is_rewritten_each_trial_and_so_left_unfrozen():
    """The twin: a segment the trusted side writes again (each trial's inputs) keeps its write access for the trusted
    side; nothing reads it back but the candidate (the judge keeps its own inputs)."""
    seg = exchange.create(4096, "cpu", writable=False)
    exchange.pack(torch.ones(8), seg)
    exchange.pack(torch.zeros(8), seg)
    assert exchange.take(exchange.pack(torch.zeros(8), seg, write=False), seg, 1,
                         torch.device("cpu")).sum() == 0
    seg.close()
