"""A candidate that runs out of device memory: the submission's, or the harness's where the device could not give it
the memory plan's share (grading._harness_out_of_memory). Pure: stored figures in, a verdict out."""

from __future__ import annotations

from harness.grading import grade
from harness.schema import ChildError, ChildExit, GpuMemoryAtFailure, MemoryPlan, Observations, Tolerance
from harness.verdicts import Phase, Verdict, device_out_of_memory

GIB = 1 << 30
TOL = Tolerance(atol=1e-4, rtol=1e-4)
TOTAL = int(79.18 * GIB)  # an H100 80GB as PyTorch reports it
# The plan the level1/96 evaluation's figures come from: the candidate's phases' peak (22 GiB) and the 2 GiB reserve
# give it 24 GiB.
PLAN = MemoryPlan(fits=True, message="fits", budget_bytes=70 * GIB, free_bytes=70 * GIB, total_bytes=TOTAL,
                  reserve_bytes=2 * GIB, needs_bytes=66 * GIB,
                  phases_bytes={"trusted_prepare": 40 * GIB, "candidate_trials": 22 * GIB,
                                "candidate_windows": 16 * GIB})


def _oom_text(tried: float, free: float, held: float) -> str:
    return (f"CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of 79.18 GiB of which "
            f"{free:.2f} GiB is free. Including non-PyTorch memory, this process has {held:.2f} GiB memory in use. "
            "Of the allocated memory 12.00 GiB is allocated by PyTorch.")


# The message an honest A/A copy of level1/96 raised on an H100 while the trusted side held about 64 GiB.
LEVEL1_96 = _oom_text(4.0, 1.77, 12.69)


def _obs(message: str = LEVEL1_96, seen: GpuMemoryAtFailure | None = None, plan: MemoryPlan | None = PLAN,
         exc_type: str = "OutOfMemoryError") -> Observations:
    return Observations(memory_plan=plan, gpu_memory_at_failure=seen,
                        candidate_error=ChildError(phase=Phase.correctness, exc_type=exc_type, message=message),
                        candidate_exit=ChildExit(finished=True, phase=Phase.correctness))


def _nvml(candidate: float, free: float, trusted: float, others: float = 0.0) -> GpuMemoryAtFailure:
    return GpuMemoryAtFailure(total_bytes=TOTAL, free_bytes=int(free * GIB), candidate_bytes=int(candidate * GIB),
                              trusted_bytes=int(trusted * GIB), others_bytes=int(others * GIB),
                              others=[4242] if others else [])


def test_running_out_within_its_share_while_the_harness_held_the_rest_is_the_harnesss_with_the_figures():
    g = grade(_obs(seen=_nvml(candidate=12.69, free=1.77, trusted=64.0)), TOL)
    assert g.verdict == Verdict.infra_error
    assert g.message.startswith("the candidate ran out of device memory holding 12.69 GiB, within the 24.00 GiB the "
                                "memory plan gave it; the device had 1.77 GiB free; the harness's side held 64.00 GiB")
    assert "NVML at the failure" in g.message


def test_running_out_beyond_its_share_is_the_submissions():
    g = grade(_obs(_oom_text(8.0, 1.0, 30.0), seen=_nvml(candidate=30.0, free=1.0, trusted=40.0)), TOL)
    assert g.verdict == Verdict.runtime_error and g.message.startswith("OutOfMemoryError during a correctness trial")


def test_an_out_of_memory_message_on_a_device_with_room_for_its_share_is_the_submissions():
    """Most of its share allocated, then an OutOfMemoryError raised with a text that claims little: NVML saw 20 GiB
    free beside its 20, room for the rest of its share, so nothing of the harness's kept it from its memory."""
    g = grade(_obs(_oom_text(0.5, 0.2, 1.0), seen=_nvml(candidate=20.0, free=20.0, trusted=30.0)), TOL)
    assert g.verdict == Verdict.runtime_error


def test_an_allocation_beyond_its_share_is_the_submissions_even_on_a_device_the_harness_crowded():
    """Its own text says it asked for 40 GiB on top of the 2 it held: the claim counts against it."""
    g = grade(_obs(_oom_text(40.0, 1.0, 2.0), seen=_nvml(candidate=2.0, free=1.0, trusted=74.0)), TOL)
    assert g.verdict == Verdict.runtime_error


def test_other_processes_holding_memory_the_plan_left_no_room_for_make_it_the_harnesss():
    """A co-tenant took 30 GiB after the plan, which left 9.18 GiB outside the evaluation's 70: even a candidate past
    its share is not blamed for a device it did not have."""
    g = grade(_obs(_oom_text(2.0, 0.5, 26.0), seen=_nvml(candidate=26.0, free=0.5, trusted=20.0, others=30.0)), TOL)
    assert g.verdict == Verdict.infra_error
    assert "shared with other processes (host PIDs 4242), which held 30.00 GiB" in g.message


def test_other_processes_the_plan_counted_leave_it_the_submissions():
    g = grade(_obs(_oom_text(2.0, 0.5, 26.0), seen=_nvml(candidate=26.0, free=0.5, trusted=44.0, others=8.0)), TOL)
    assert g.verdict == Verdict.runtime_error


def test_without_nvml_its_own_account_of_a_use_within_its_share_is_the_harnesss():
    seen = GpuMemoryAtFailure(unknown="no NVML binding (the nvidia-ml-py package) in the harness's environment")
    g = grade(_obs(seen=seen), TOL)
    assert g.verdict == Verdict.infra_error
    assert "holding 12.69 GiB, within the 24.00 GiB" in g.message and "by its own account" in g.message
    assert "no NVML binding" in g.message
    assert grade(_obs(seen=None), TOL).verdict == Verdict.infra_error  # no figures recorded at all: the same


def test_without_nvml_an_out_of_memory_error_that_claims_no_figures_is_the_submissions():
    seen = GpuMemoryAtFailure(unknown="NVML did not start: Driver Not Loaded")
    g = grade(_obs("CUDA error: out of memory", seen=seen, exc_type="RuntimeError"), TOL)
    assert g.verdict == Verdict.runtime_error


def test_without_nvml_its_own_account_of_a_use_beyond_its_share_is_the_submissions():
    g = grade(_obs(_oom_text(4.0, 1.0, 30.0), seen=GpuMemoryAtFailure(unknown="no NVML binding")), TOL)
    assert g.verdict == Verdict.runtime_error


def test_without_a_memory_plan_for_a_device_nothing_changes():
    assert grade(_obs(plan=None, seen=_nvml(12.69, 1.77, 64.0)), TOL).verdict == Verdict.runtime_error
    host = PLAN.model_copy(update={"total_bytes": None, "budget_bytes": None})
    assert grade(_obs(plan=host), TOL).verdict == Verdict.runtime_error


def test_an_error_that_is_not_out_of_memory_is_untouched_by_the_figures():
    g = grade(_obs("index 7 is out of bounds", seen=_nvml(12.69, 1.77, 64.0), exc_type="IndexError"), TOL)
    assert g.verdict == Verdict.runtime_error


def test_the_classifier_reads_pytorchs_figures_and_the_cuda_runtimes_words():
    claim = device_out_of_memory("OutOfMemoryError", LEVEL1_96)
    assert claim is not None
    assert (claim.tried, claim.free, claim.held) == (4 * GIB, int(1.77 * GIB), int(12.69 * GIB))
    raw = device_out_of_memory("RuntimeError", "CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")
    assert raw is not None and raw.held is None
    assert device_out_of_memory("RuntimeError", "DefaultCPUAllocator: can't allocate memory") is None
    assert device_out_of_memory("OutOfResources", "out of resource: shared memory, Required: 262144") is None


def test_the_share_is_the_plans_own_candidate_figure_where_it_has_one():
    """A plan that names the candidate's share (`candidate_bytes`: its peak over trials and windows, counted by the
    plan itself) gives that share, not the largest of its phases: 30 GiB held within 32 + 2 is the harness's; the
    same figures under a plan whose phases alone say 22 GiB are the submission's."""
    named = PLAN.model_copy(update={"candidate_bytes": 32 * GIB})
    seen = _nvml(candidate=30.0, free=1.0, trusted=46.0)
    assert grade(_obs(_oom_text(1.0, 1.0, 30.0), seen=seen, plan=named), TOL).verdict == Verdict.infra_error
    assert grade(_obs(_oom_text(1.0, 1.0, 30.0), seen=seen), TOL).verdict == Verdict.runtime_error


# The trusted side's own out-of-memory error, as the runner stores it (TrustedFailed's text): level1/39's, on an H100.
TRUSTED_OOM = ("the trusted process failed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. "
               "GPU 0 has a total capacity of 79.18 GiB of which 3.75 GiB is free.")


def _trusted_failed(seen: GpuMemoryAtFailure | None, error: str = TRUSTED_OOM) -> Observations:
    return Observations(memory_plan=PLAN, gpu_memory_at_failure=seen, reference_error=error)


def test_the_harness_crowded_out_by_a_candidate_past_its_share_is_the_submissions():
    """A candidate that keeps 40 GiB of device memory, where the plan gave it 24, and the trusted side runs out beside
    it: the submission made the harness fail, and it is told so, never the harness's fault."""
    g = grade(_trusted_failed(_nvml(candidate=40.0, free=1.0, trusted=36.0)), TOL)
    assert g.verdict == Verdict.runtime_error
    assert g.message.startswith("the harness's side ran out of device memory while the candidate's processes held "
                                "40.00 GiB, more than the 24.00 GiB the memory plan gave them")


def test_the_harness_running_out_beside_a_candidate_within_its_share_is_the_harnesss():
    """The honest twin: level1/39's A/A copy held 26.7 GiB, its share then 26; now within its share, the plan's
    miscount is the harness's own (infra_error), as are a trusted failure that is no out-of-memory error, one where
    NVML could not say what the candidate held, and one on a GPU where other processes took the room the plan left."""
    for obs in (_trusted_failed(_nvml(candidate=20.0, free=3.75, trusted=48.7)),
                _trusted_failed(_nvml(candidate=40.0, free=1.0, trusted=36.0), "the trusted process failed: KeyError"),
                _trusted_failed(GpuMemoryAtFailure(unknown="NVML could not be started")),
                _trusted_failed(None),
                # Past its share, but beside a co-tenant holding more than the plan left outside the evaluation's 70.
                _trusted_failed(_nvml(candidate=30.0, free=0.5, trusted=20.0, others=28.0))):
        g = grade(obs, TOL)
        assert g.verdict == Verdict.infra_error and g.message.startswith("the harness's reference side failed")


# The plan the trusted side made while a candidate held most of the device: too little was free to plan on.
UNPLANNED = PLAN.model_copy(update={"fits": False, "free_bytes": int(0.6 * GIB), "budget_bytes": int(0.6 * GIB),
                                    "message": "needs 2.90 GiB (...), has 0.60 GiB"})
UNPLANNED_ERROR = f"the trusted process failed: the evaluation does not fit on the device: {UNPLANNED.message}"


def _before_plan(seen: GpuMemoryAtFailure | None, plan: MemoryPlan | None = None, error: str = TRUSTED_OOM,
                 parameters: float | None = 0.25, reserve: float | None = 2.0) -> Observations:
    return Observations(memory_plan=plan, gpu_memory_at_failure=seen, reference_error=error,
                        reference_parameter_bytes=None if parameters is None else int(parameters * GIB),
                        memory_reserve_bytes=None if reserve is None else int(reserve * GIB))


def test_a_candidate_that_takes_the_device_while_it_constructs_crowds_out_the_harness_on_its_own_account():
    """Before the plan exists (the trusted side's first trial runs beside the candidate's constructor) a candidate may
    hold twice the reference's parameters and the reserve (2.5 GiB here): one that took 70 GiB in its constructor,
    and the trusted side then ran out of memory, or found too little to plan on, is the submission's runtime_error."""
    g = grade(_before_plan(_nvml(candidate=70.0, free=0.3, trusted=8.5)), TOL)
    assert g.verdict == Verdict.runtime_error
    assert g.message.startswith("the harness's side ran out of device memory while the candidate's processes held "
                                "70.00 GiB, more than the 2.50 GiB a candidate may hold before the memory plan is "
                                "made (twice the reference's parameters, 0.25 GiB, and the reserve)")
    g = grade(_before_plan(_nvml(candidate=78.0, free=0.6, trusted=0.6), UNPLANNED, UNPLANNED_ERROR), TOL)
    assert g.verdict == Verdict.runtime_error
    assert g.message.startswith("the harness's side found too little device memory to plan while the candidate's "
                                "processes held 78.00 GiB")


def test_a_candidate_within_what_constructing_needs_leaves_a_failure_before_the_plan_the_harnesss():
    """The honest twins: a candidate holding its CUDA context and its weights twice over (a kernel that keeps them in
    a second layout), 2.4 GiB; the same past its share beside a co-tenant holding more than the reserve; figures
    that NVML could not give; and a result stored before the reserve was recorded. Each stays infra_error."""
    for obs in (_before_plan(_nvml(candidate=2.4, free=0.3, trusted=76.0)),
                _before_plan(_nvml(candidate=2.4, free=0.6, trusted=0.6), UNPLANNED, UNPLANNED_ERROR),
                _before_plan(_nvml(candidate=30.0, free=0.3, trusted=20.0, others=28.0)),
                _before_plan(GpuMemoryAtFailure(unknown="NVML could not be started")),
                _before_plan(_nvml(candidate=70.0, free=0.3, trusted=8.5), reserve=None)):
        g = grade(obs, TOL)
        assert g.verdict == Verdict.infra_error and g.message.startswith("the harness's reference side failed"), obs
    # A plan that did not fit still says what it would have given the candidate (24 GiB): holding that much, a
    # kernel that allocated its trials' buffers as it constructed, is not blamed; past it, it is.
    assert grade(_before_plan(_nvml(candidate=23.0, free=0.3, trusted=40.0), UNPLANNED, UNPLANNED_ERROR),
                 TOL).verdict == Verdict.infra_error
    g = grade(_before_plan(_nvml(candidate=30.0, free=0.3, trusted=40.0), UNPLANNED, UNPLANNED_ERROR), TOL)
    assert g.verdict == Verdict.runtime_error and "more than the 24.00 GiB the memory plan would have given" in \
        g.message
    # Before the reference was built its parameters are not known: the reserve alone is the share.
    assert grade(_before_plan(_nvml(candidate=2.4, free=0.3, trusted=76.0), parameters=None), TOL).verdict == \
        Verdict.runtime_error
