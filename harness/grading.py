"""Pure grading: (observations, tolerance) -> verdict. No GPU, no DB, no subprocess.

Re-grading a stored result under another tolerance is `grade(result.observations, tolerance)`.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from harness.schema import (
    RTOL_GRID,
    ChildError,
    Flag,
    KernelTrace,
    MemoryPlan,
    Observations,
    OutputFigures,
    TimedOutputCheck,
    TimingStats,
    Tolerance,
)
from harness.verdicts import Phase, Verdict, classify_exception, device_out_of_memory

# A candidate whose error against float64 exceeds the reference's own by this factor (and the
# absolute floor below) computes in lower precision than fp32 (TF32, bf16, fast-math).
PRECISION_RATIO = 10.0
PRECISION_FLOOR = 1e-5

_EXCERPT_LINES = 30

# What a candidate's fingerprints of a window's outputs took beyond the trusted side's of the same outputs is charged
# to that window's time (windows.fingerprint_charges): work moved there is paid for where it is credited, and no
# bound on it decides a verdict. Results stored before that charge (no TimingStats.charged_ms) allowed the excess,
# net of the host's round trip, the slack (obs.timed_outputs.handover_slack_ms) plus this share of the trusted side's
# time, and flagged it beyond (handover_time); they are re-graded so.
FINGERPRINT_SHARE = 0.5
# The tail of the evaluation's fingerprint deviation (the sum of squared differences over scales) that outputs within
# their tolerance reach with the chance e**-x at most: each term's moment generating function is at most a squared
# standard normal's (a sum of random signs is sub-Gaussian), the terms are independent (the signs are new for every
# call), and Laurent and Massart's bound for a chi-square of M terms, M + 2*sqrt(M*x) + 2*x, is Chernoff's from that
# function alone. x = 20: 2e-9.
FINGERPRINT_TAIL_X = 20.0


def fingerprint_deviation_bound(terms: int) -> float:
    return terms + 2 * math.sqrt(terms * FINGERPRINT_TAIL_X) + 2 * FINGERPRINT_TAIL_X


# Results graded before fingerprints: a candidate's hand-over of picked outputs may exceed the trusted side's save
# of the same outputs by its slack
# (obs.timed_outputs.handover_slack_ms) or by this share of the credited time of the picked calls, whichever is
# larger: an honest hand-over only saves; one that computes the output only when asked pays its full time there.
HANDOVER_CALL_SHARE = 0.5
# ... plus this share of the trusted side's own save: writing tens of MB varies by that much from run to run.
HANDOVER_SAVE_SHARE = 0.5
# The host's round-trip latency taken off a fingerprint (in results stored before fingerprints, a hand-over), at
# most this many times the slack: a submission that loads the host right after its reply delays the trusted side's
# wake-up too, and gains no more than this.
HANDOVER_LATENCY_CREDIT = 3.0
# The longest the trusted side may wait for the GPU to run nothing of another process's before a reference window
# (obs.gpu_idle_waits_ms): a probe behind a busy host's scheduler may take a few; queued work takes its own time.
LEFTOVER_GPU_MS = 20.0
# Speedups paired by round that spread wider than this (the interquartile range of their logs; in results stored
# before them, timed windows whose times per call spread wider, interquartile range over median) are too noisy to
# rank: the result stands, marked timing_unreliable.
SPREAD_LIMIT = 0.10
# A median below this share of the speed-of-light floor is physically impossible (the floor uses
# measured peaks, which real kernels rarely beat by more than measurement noise).
SOL_FACTOR = 0.8
# A speedup beyond this over torch.compile is held for a person to look at before it is ranked.
REVIEW_SPEEDUP_VS_COMPILE = 10.0


@dataclass
class Grade:
    verdict: Verdict
    message: str
    log_excerpt: str = ""
    flags: list[Flag] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None

    def result_fields(self) -> dict[str, Any]:
        """The fields an EvalResult takes from its grade: where a result is made or re-graded, these are them."""
        return {"verdict": self.verdict, "message": self.message, "log_excerpt": self.log_excerpt,
                "flags": self.flags, "speedup_vs_eager": self.speedup_vs_eager,
                "speedup_vs_compile": self.speedup_vs_compile}


def required_atol(fig: OutputFigures, rtol: float) -> float:
    """An upper bound of max(|a-b| - rtol*|b|): exact on the grid, interpolated between its points.

    That function of rtol is convex and decreasing, so the chord between grid points lies above it
    and the bound never passes what allclose would fail.
    """
    table = fig.min_atol_at_rtol or {}
    points = [(r, table[f"{r:g}"]) for r in RTOL_GRID if f"{r:g}" in table]
    if not points:
        return float("inf")
    for (r0, a0), (r1, a1) in itertools.pairwise(points):
        if r0 <= rtol <= r1:
            return a0 + (a1 - a0) * (rtol - r0) / (r1 - r0) if r1 > r0 else a0
    return points[-1][1] if rtol > points[-1][0] else points[0][1]


def _required_atol_or_fp64(fig: OutputFigures, rtol: float) -> float:
    """An upper bound of max(min(|a-b| - rtol*|b|, |a-g| - rtol*|g|)): that function of rtol is decreasing but,
    a max of minima, not convex, so the bound is its value at the grid point at or below rtol, not a chord."""
    table = fig.min_atol_at_rtol_or_fp64 or {}
    below = [table[f"{r:g}"] for r in RTOL_GRID if r <= rtol and f"{r:g}" in table]
    return below[-1] if below else float("inf")


def within_reference_tolerance(fig: OutputFigures, tol: Tolerance) -> bool:
    """allclose against the reference, element by element."""
    if fig.nonfinite_mismatches:
        return False
    if fig.max_abs_err is None:
        return fig.numel == 0
    if tol.atol == tol.rtol and fig.max_rel_err is not None:
        return fig.max_rel_err <= tol.atol  # |a-b| <= t(1+|b|), exactly allclose's test
    return fig.max_abs_err <= tol.atol or required_atol(fig, tol.rtol) <= tol.atol


def within_tolerance(fig: OutputFigures, tol: Tolerance) -> bool:
    """Every element within the tolerance of the reference or of the float64 truth. The reference's own
    rounding can put a correct element outside the first (two fp32 orders of a sum of 8192 products, magnified by a
    normalisation, differ by about the tolerance at one element in millions); an element within the tolerance of
    neither is wrong whichever the reference computed. Results stored without the truth's figures are judged
    against the reference alone."""
    if within_reference_tolerance(fig, tol):
        return True
    if fig.nonfinite_mismatches or fig.max_rel_err_or_fp64 is None:
        return False
    if tol.atol == tol.rtol:
        return fig.max_rel_err_or_fp64 <= tol.atol
    return _required_atol_or_fp64(fig, tol.rtol) <= tol.atol


def _shape(shape: list[int] | None) -> str:
    return "(" + ", ".join(map(str, shape or [])) + ("," if shape and len(shape) == 1 else "") + ")"


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_TRACEBACK_HEAD = "Traceback (most recent call last):"


def summarise_traceback(text: str) -> str:
    """One line for a failure report: the exception and where it was raised (the innermost frame's
    file:line), after the text's first line where that is context rather than the traceback. A text
    that holds no traceback is summarised by its first line."""
    lines = text.strip().splitlines()
    frames = [(i, m) for i, ln in enumerate(lines) if (m := _FRAME.match(ln))]
    if not frames or not any(ln.startswith(_TRACEBACK_HEAD) for ln in lines):
        return lines[0] if lines else "(no message)"
    last, frame = frames[-1]
    # After the innermost frame come its indented source and caret lines, then the exception.
    exception = next((ln.strip() for ln in lines[last + 1:] if ln.strip() and not ln[0].isspace()),
                     "the traceback ends before its exception")
    path = frame["file"].split("site-packages/")[-1]  # an installed package's path from its package name
    where = f"{path}:{frame['line']}" + (f" in {frame['func']}" if frame["func"] else "")
    # A line of context above the traceback ("the trusted process ended (code 1) during ...") is kept.
    context = "" if lines[0].startswith(_TRACEBACK_HEAD) or lines[0] == exception else lines[0].rstrip(": ") + ": "
    return f"{context}{exception} (at {where})"


def _tail(text: str, n: int = _EXCERPT_LINES) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def _compiler_excerpt(message: str) -> tuple[str, str]:
    lines = message.splitlines()
    errors = [ln for ln in lines if re.search(r"\berror\b", ln, re.IGNORECASE)
              and not ln.startswith("ninja: build stopped")]
    first = next((ln.strip() for ln in errors if "Error building extension" not in ln), None)
    if first is None:
        first = lines[0].strip() if lines else "the build failed"
    return first, "\n".join(errors[:_EXCERPT_LINES]) or _tail(message)


def _speedup(base: TimingStats | None, cand: TimingStats | None) -> float | None:
    """The candidate's speedup over a baseline: paired by round where the baseline's figures hold it (windows.
    paired_ratio), else (results stored before) the ratio of the two medians."""
    if base is None or cand is None or cand.median_ms <= 0:
        return None
    if base.paired_speedup is not None:
        return base.paired_speedup
    return base.median_ms / cand.median_ms


def _flagged(check: str, message: str, detail: str) -> Grade:
    return Grade(Verdict.flagged, message, detail, flags=[Flag(check=check, detail=detail)])


def grade(obs: Observations, tol: Tolerance) -> Grade:
    """The verdict, and its flags: a result flagged by what it did carries what the static pre-check found as well
    (a reviewer sees both; a submission needs only one to be held)."""
    g = _grade(obs, tol)
    if g.verdict != Verdict.flagged or not obs.static_findings or any(f.check.startswith("static:") for f in g.flags):
        return g
    static = _static_flags(obs)
    return replace(g, flags=[*g.flags, *static],
                   log_excerpt="\n".join([g.log_excerpt, *(f"{f.check} {f.detail}" for f in static)]).strip())


def _static_flags(obs: Observations) -> list[Flag]:
    return [Flag(check=f"static:{f.rule}", detail=f"line {f.line}: {f.detail}") for f in obs.static_findings]


def _grade(obs: Observations, tol: Tolerance) -> Grade:
    if obs.static_error:
        return Grade(Verdict.invalid_submission, obs.static_error)
    if obs.reference_error:
        crowded = _crowded_out(obs)
        if crowded is not None:
            return Grade(Verdict.runtime_error, crowded, obs.reference_error.strip())
        return Grade(Verdict.infra_error, "the harness's reference side failed: "
                     + summarise_traceback(obs.reference_error), obs.reference_error.strip())
    if obs.protocol_violations:
        detail = "; ".join(obs.protocol_violations)
        return _flagged("protocol", "the candidate's process broke the harness's message protocol (submission code "
                        f"wrote to the result channel?): {obs.protocol_violations[0]}", detail)
    # Before how the process ended: either one stopped the evaluation there, and the harness ended the process.
    if obs.pause_error:
        return _flagged("pause_refused", "the candidate's processes could not be paused between its turns, so nothing "
                        f"would keep them from running beside the reference's windows: {obs.pause_error}",
                        obs.pause_error)
    if _pause_did_not_hold(obs):
        detail = "; ".join(obs.ran_while_paused)
        return _flagged("ran_while_paused", "the candidate ran while it was paused, during "
                        f"{len(obs.ran_while_paused)} reference window(s), each timed again: {obs.ran_while_paused[0]}",
                        detail)
    err, ex = obs.candidate_error, obs.candidate_exit
    if err is not None:
        harness_memory = _harness_out_of_memory(obs, err)
        if harness_memory is not None:
            return Grade(Verdict.infra_error, harness_memory, _tail(err.traceback or err.message))
        verdict = classify_exception(err.phase, err.exc_type, err.message)
        if verdict == Verdict.compile_error:
            first, excerpt = _compiler_excerpt(err.message)
            return Grade(verdict, f"compilation failed: {first}", excerpt)
        first_line = (err.message.strip().splitlines() or [""])[0][:300]
        where = {Phase.compile: "while importing or constructing ModelNew",
                 Phase.correctness: "during a correctness trial", Phase.timing: "during timing"}.get(err.phase, "")
        return Grade(verdict, f"{err.exc_type} {where}: {first_line}".strip(),
                     _tail(err.traceback or err.message))
    if ex is not None and ex.timed_out and ex.idle_s is not None:
        return Grade(Verdict.timeout, f"the import ran {ex.idle_s:g} s with no compiler running and did not finish "
                     "(a hang outside any build); the process group was killed", _tail(obs.log_tail))
    if ex is not None and ex.timed_out:
        limit = f"{ex.deadline_s:g} s " if ex.deadline_s else ""
        return Grade(Verdict.timeout, f"the {ex.phase.value} phase exceeded its {limit}limit; the process group "
                     "was killed", _tail(obs.log_tail))
    if ex is not None and not ex.finished:
        how = f"killed by {ex.signal}" if ex.signal else f"exited with code {ex.returncode} before finishing"
        return Grade(Verdict.crashed, f"the candidate's process {how} during the {ex.phase.value} phase",
                     _tail(obs.log_tail))
    if obs.flag_changes:
        detail = "; ".join(f"{c.name}: {c.before!r} -> {c.after!r} (at {c.when})" for c in obs.flag_changes)
        return Grade(Verdict.flagged, "the submission changed global torch numerics settings: " + detail,
                     detail, flags=[Flag(check="global_torch_flags", detail=detail)])
    if len(obs.trials) < obs.trials_expected:
        return Grade(Verdict.infra_error, f"only {len(obs.trials)} of {obs.trials_expected} trials were judged")
    for trial in obs.trials:
        label = str(trial.trial) if trial.inputs == "get_inputs" else f"{trial.trial} ({trial.inputs} inputs)"
        g = _grade_trial(label, trial.structure_error, trial.outputs, tol, trial.file_error)
        if g is not None:
            return _with_parameter_hint(g, obs)
    g = _timed_outputs(obs, tol) or _leftover_gpu_work(obs)
    if g is not None:
        return g
    if obs.outputs_changed:
        detail = ", ".join(obs.outputs_changed)
        return _flagged("deferred_output", "the output changed after forward returned (" + detail + "): work left "
                        "running on another stream or thread, outside the call", detail)
    if obs.inputs_mutated:
        detail = "; ".join(obs.inputs_mutated)
        return _flagged("input_mutation", "forward changed its inputs (" + detail + ")", detail)
    det = obs.determinism
    if det is not None and not det.bitwise_equal and (det.max_rel_diff is None or det.max_rel_diff > tol.atol):
        diff = "different structure" if det.max_rel_diff is None else f"max |o1-o2|/(1+|o2|) = {det.max_rel_diff:.3g}"
        return Grade(Verdict.nondeterministic, f"the same inputs gave different outputs on two calls ({diff}, "
                     f"beyond {tol}): a race or a read of uninitialised memory")
    return _passed(obs, tol)


def _candidate_share(plan: MemoryPlan) -> int | None:
    """The device memory the plan gave the candidate, as NVML counts a process's: the peak of its phases and the
    plan's reserve, the margin for what the phases do not count (its CUDA context, library workspaces, the
    allocator's rounding), all of which NVML's figure holds."""
    if plan.candidate_bytes:
        return plan.candidate_bytes + plan.reserve_bytes
    phases = [v for k, v in plan.phases_bytes.items() if k.startswith("candidate_")]  # a plan stored before
    return max(phases) + plan.reserve_bytes if phases else None


def _crowded_out(obs: Observations) -> str | None:
    """Why the trusted side's running out of device memory is the submission's, where it is (None: the harness's).

    The parent read the GPU's memory from NVML when the trusted side failed (obs.gpu_memory_at_failure), the
    candidate paused and holding what it held. It is the submission's where the candidate's processes held more
    than the memory plan gave them (its phases' peak and the reserve): a process that keeps device memory it no
    longer uses, or takes more than its kernels need, cannot make the harness blame itself. Within its share, where
    NVML gave no figures, or where other processes held more than the plan left outside the evaluation's budget (a
    GPU shared with work that came after the plan), the failure stays the harness's.

    Before the plan is made (the trusted side's first trial, while the candidate constructs), or where the plan it
    made did not fit (it counted what the candidate held then as taken), the candidate's share is what constructing
    needs (`_share_before_plan`), or the share that plan would have given it where that is more (a kernel that
    allocates its output buffers as it constructs holds what its trials would), and other processes may hold no
    more than the reserve."""
    plan, seen = obs.memory_plan, obs.gpu_memory_at_failure
    unplanned = plan is not None and not plan.fits
    if seen is None or seen.candidate_bytes is None or (
            not unplanned and device_out_of_memory("", obs.reference_error or "") is None):
        return None
    if plan is None or unplanned:
        share, why = _share_before_plan(obs)
        outside = obs.memory_reserve_bytes
        planned = _candidate_share(plan) if plan is not None else None
        if planned is not None and share is not None and planned > share:  # its own figures gave it more
            share, why = planned, "the memory plan would have given them"
    else:
        share, why = _candidate_share(plan), "the memory plan gave them"
        total = seen.total_bytes or plan.total_bytes
        outside = total - plan.budget_bytes if total is not None and plan.budget_bytes is not None else None
    if share is None or seen.candidate_bytes <= share:
        return None
    if seen.others_bytes and (outside is None or seen.others_bytes > outside):
        return None
    ran_out = "found too little device memory to plan" if unplanned else "ran out of device memory"
    return (f"the harness's side {ran_out} while the candidate's processes held {_gib(seen.candidate_bytes)}, more "
            f"than the {_gib(share)} {why} (NVML at the failure; the harness's side held "
            f"{_gib(seen.trusted_bytes or 0)}, {_gib(seen.free_bytes or 0)} free)")


def _share_before_plan(obs: Observations) -> tuple[int | None, str]:
    """What a candidate may hold on the device before the memory plan is made, and its wording: twice the
    reference's parameters and buffers (its own, and the reference's as it loads them, or a second layout of its
    weights a kernel keeps) and the plan's reserve (its CUDA context, library workspaces). A candidate that takes
    more while it constructs, before anything has told it what a call needs, crowds out the harness's side on its
    own account. None where the reserve was not recorded (a result stored before)."""
    if obs.memory_reserve_bytes is None:
        return None, ""
    params = obs.reference_parameter_bytes or 0
    return 2 * params + obs.memory_reserve_bytes, (f"a candidate may hold before the memory plan is made (twice the "
                                                    f"reference's parameters, {_gib(params)}, and the reserve)")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _harness_out_of_memory(obs: Observations, err: ChildError) -> str | None:
    """Why the candidate's running out of device memory is the harness's, where it is (None: the submission's).

    The parent read the GPU's memory from NVML when the candidate reported it (obs.gpu_memory_at_failure). It is the
    harness's where the device could not give the candidate the memory plan's share: what it held and what was free
    came to less (the rest held by the trusted side or other processes), and the allocation its text says failed was
    within the share; or where other processes held more than the plan left outside the evaluation's budget (a GPU
    shared with work that came after the plan). Its own memory and the free memory add up the same whether or not it
    kept its memory until NVML was read, so a submission that only says it ran out of memory, on a device with room
    for its share, stays the submission's.

    Where NVML gave no figures, the candidate's own text stands in ("this process has N GiB memory in use", "of which
    N GiB is free"). Believing it can only move the verdict from runtime_error to infra_error: never ranked, never
    passed, retried a bounded number of times (the job's attempts) and then stored as infra_error, so a submission
    that lies there loses its result; it gains no verdict, flag or time. Without a plan for a device, nothing
    changes."""
    claim = device_out_of_memory(err.exc_type, err.message)
    plan = obs.memory_plan
    if claim is None or plan is None or plan.total_bytes is None:
        return None
    share = _candidate_share(plan)
    if share is None:
        return None
    seen = obs.gpu_memory_at_failure
    if seen is not None and seen.unknown is None and seen.candidate_bytes is not None and seen.free_bytes is not None:
        held, free, trusted, others = seen.candidate_bytes, seen.free_bytes, seen.trusted_bytes or 0, \
            seen.others_bytes or 0
        source = "NVML at the failure"
        outside = (seen.total_bytes or plan.total_bytes) - plan.budget_bytes if plan.budget_bytes is not None else None
        if others and outside is not None and others > outside:
            return (f"the candidate ran out of device memory on a GPU shared with other processes (host PIDs "
                    f"{', '.join(map(str, seen.others))}), which held {_gib(others)}, more than the "
                    f"{_gib(outside)} the memory plan left outside the evaluation's {_gib(plan.budget_bytes or 0)}; "
                    f"the candidate held {_gib(held)}, the harness's side {_gib(trusted)} ({source})")
    elif claim.held is not None and claim.free is not None:
        held, free, trusted, others = claim.held, claim.free, None, 0
        why = seen.unknown if seen is not None and seen.unknown else "no NVML figures were recorded"
        source = f"by its own account; NVML could not say: {why}"
    else:
        return None
    if held + free >= share or (claim.tried is not None and held + claim.tried > share):
        return None
    return (f"the candidate ran out of device memory holding {_gib(held)}, within the {_gib(share)} the memory plan "
            f"gave it; the device had {_gib(free)} free"
            + (f"; the harness's side held {_gib(trusted)}" if trusted is not None else "")
            + (f", other processes {_gib(others)}" if others else "") + f" ({source})")


def _timed_outputs(obs: Observations, tol: Tolerance) -> Grade | None:
    """The outputs handed over from timed windows, judged like trials; and what the hand-over cost."""
    timed = obs.timed_outputs
    if timed is None:
        return None
    problem: str | None = None
    if timed.fingerprint_mismatches:
        shown = "; ".join(timed.fingerprint_mismatches[:3])
        more = len(timed.fingerprint_mismatches) - 3
        problem = f"{len(timed.fingerprint_mismatches)} of {timed.fingerprinted} fingerprinted outputs: {shown}" + \
            (f"; {more} more" if more > 0 else "")
    elif timed.fingerprint_terms and timed.fingerprint_deviation > fingerprint_deviation_bound(timed.fingerprint_terms):
        bound = fingerprint_deviation_bound(timed.fingerprint_terms)
        problem = (f"the fingerprints of {timed.fingerprint_terms} timed outputs are off the reference's by "
                   f"{timed.fingerprint_deviation:.4g} squared scales in all, over the {bound:.4g} that outputs within "
                   "the tolerance stay under but with a chance of 2e-9: outside the tolerance, though none alone by "
                   "six scales")
    elif timed.reported != timed.expected:
        problem = f"the candidate handed over {timed.reported} of the {timed.expected} outputs asked for"
    elif timed.mismatches:  # results stored before outputs were judged element by element
        problem = "; ".join(timed.mismatches)
    for call in timed.calls:
        g = _grade_trial(f"of timed call {call.trial}", call.structure_error, call.outputs, tol, call.file_error)
        if g is not None and problem is None:
            problem = (g.log_excerpt or g.message).removeprefix("trial ")
    if problem is not None:
        return _flagged("timed_outputs", "outputs of timed calls differ from the reference: the fast path that was "
                        "timed is not the one that was checked", problem)
    ct = obs.candidate_timing
    if ct is not None and ct.charged_ms:
        return None  # the fingerprints' excess is in the windows' time: what they did beyond an honest one's is paid
    if timed.fingerprint_ms and timed.reference_fingerprint_ms and timed.handover_slack_ms is not None:
        return _fingerprint_time(timed)
    if timed.handover_ms and timed.handover_slack_ms is not None and ct is not None:
        picks = timed.expected / len(timed.handover_ms)
        save = statistics.median(timed.reference_save_ms or [0.0])
        # Net of the host's round-trip latency at each hand-over (the trusted side's, measured right after it): on
        # a loaded host (an H100's 16 cores busy with nvcc and 8 evaluations) an honest hand-over's wake-up alone
        # took 5 ms more than the save. Results stored before it was measured have none.
        cap = HANDOVER_LATENCY_CREDIT * timed.handover_slack_ms
        paired = len(timed.latency_ms) == len(timed.handover_ms)
        latency = [min(lat, cap) for lat in timed.latency_ms] if paired else [0.0] * len(timed.handover_ms)
        excess = statistics.median(h - lat for h, lat in zip(timed.handover_ms, latency, strict=True)) - save
        allowed = max(timed.handover_slack_ms + HANDOVER_SAVE_SHARE * save, HANDOVER_CALL_SHARE * picks * ct.median_ms)
        if excess > allowed:
            detail = (f"handing over {picks:g} output(s) took {excess:.3g} ms more than saving them takes (median "
                      f"over {len(timed.handover_ms)} windows, net of the host's round-trip latency, median "
                      f"{statistics.median(latency):.3g} ms; allowed {allowed:.3g} ms), with {ct.median_ms:.4g} ms "
                      "credited per call: the outputs were computed when asked for, not in the window")
            return _flagged("handover_time", "the timed window did not compute what it handed over", detail)
    return None


def _pause_did_not_hold(obs: Observations) -> bool:
    """Whether the reference windows the paused candidate disturbed (`ran_while_paused`, each timed again) show that
    its pause did not hold.

    - Every try of a window disturbed: timing stopped there.
    - GPU work after a window, where leftover_gpu_work (the work it queued before its pause) does not name it.
    - CPU time in a window, except under cgroup v2's freezer (`cgroup_freeze`). While its cgroup is frozen a task
      runs no code of its own: whatever wakes it (a signal, a timer of its own, the kernel) finds the freeze still
      set, and the kernel parks it again before it returns to user space. The microseconds that costs are counted
      (a few µs, a few threads, in a few windows of an evaluation among others on a loaded host, none of which sent
      itself anything); the window was timed again, so none counted, and they prove nothing of the submission's.
      Held by v1's freezer, a ptrace-stop or SIGSTOP, a task is not woken at all: CPU time there is the pause
      failing.
    """
    if not obs.ran_while_paused:
        return False
    if obs.paused_timing_stopped:
        return True
    gpu_windows = len(obs.ran_while_paused) - obs.paused_cpu_windows
    if gpu_windows and _leftover_gpu_work(obs) is None:
        return True
    return bool(obs.paused_cpu_windows) and obs.pause_method != "cgroup_freeze"


def _leftover_gpu_work(obs: Observations) -> Grade | None:
    """GPU work of the candidate's still queued after its turn (its processes stopped), which the trusted side had
    to wait out before a reference window: an honest reply comes after the device is synchronised."""
    waits = obs.gpu_idle_waits_ms
    if not obs.gpu_busy_windows and (not waits or max(waits) <= LEFTOVER_GPU_MS):
        return None
    detail = (f"before {sum(w > LEFTOVER_GPU_MS for w in waits)} of {len(waits)} reference windows the GPU was still "
              f"running another process's work after the candidate's reply (longest wait {max(waits):.4g} ms, "
              f"allowed {LEFTOVER_GPU_MS:g} ms; busy still at the wait's limit: {obs.gpu_busy_windows}): it would "
              "have run beside the reference's windows")
    return _flagged("leftover_gpu_work", "the candidate left GPU work running after its reply", detail)


def _fingerprint_time(timed: TimedOutputCheck) -> Grade | None:
    """Results stored before the fingerprints' excess was charged to the windows: what the candidate's fingerprints
    took beyond the trusted side's of the same outputs, window by window: the candidate's on the parent's clock less
    the host's round trip right after it (at most HANDOVER_LATENCY_CREDIT slacks), against the trusted side's on its
    own clock. Beyond the slack, outputs were computed when asked for, not in the window. Results stored before the
    round trips compare both sides on the parent's clock."""
    assert timed.handover_slack_ms is not None
    n = len(timed.fingerprint_ms)
    if len(timed.fingerprint_latency_ms) == n and len(timed.reference_fingerprint_own_ms) == n:
        cap = HANDOVER_LATENCY_CREDIT * timed.handover_slack_ms
        latency = [min(lat, cap) for lat in timed.fingerprint_latency_ms]
        pairs = [(c - lat, r) for c, lat, r in zip(timed.fingerprint_ms, latency, timed.reference_fingerprint_own_ms,
                                                     strict=True)]
        net = f", net of the host's round-trip latency (median {statistics.median(latency):.3g} ms)"
    else:
        pairs = list(zip(timed.fingerprint_ms, timed.reference_fingerprint_ms, strict=False))
        net = ""
    excess = statistics.median(c - r for c, r in pairs)
    own = statistics.median(r for _, r in pairs)
    allowed = timed.handover_slack_ms + FINGERPRINT_SHARE * own
    if excess <= allowed:
        return None
    detail = (f"fingerprinting a window's outputs took {excess:.3g} ms more{net} than the trusted side's "
              f"fingerprints of the same outputs ({own:.3g} ms; median over {len(pairs)} windows, allowed "
              f"{allowed:.3g} ms): the outputs were computed when asked for, not in the window")
    return _flagged("handover_time", "the timed window did not compute what it was asked for", detail)


def _unreliable_timing(obs: Observations) -> str | None:
    """Why the timed windows cannot rank this result: the speedups, paired by round, spread too wide (in results
    stored before them, each kind's windows), or a time is within the empty windows' noise. A speedup paired by
    round is what ranks, and a host that slows both windows of a round alike moves it not at all, however far each
    kind's windows drift together."""
    kinds = (("candidate", obs.candidate_timing), ("eager", obs.eager_timing), ("torch.compile", obs.compile_timing))
    paired = [(name, t) for name, t in kinds[1:] if t is not None and t.paired_spread is not None]
    if paired:
        noisy = [f"over {name} {t.paired_spread:.1%}" for name, t in paired if t.paired_spread > SPREAD_LIMIT]
        what, measure = "the candidate's speedups, paired by round, spread", "interquartile range of their logs"
    else:
        noisy = [f"{name} {t.spread:.1%}" for name, t in kinds if t is not None and t.spread is not None
                 and t.spread > SPREAD_LIMIT]
        what, measure = "the timed windows spread", "interquartile range over median"
    lost = [name for name, t in kinds[:2] if t is not None and t.clock == "parent_window"
            and t.median_ms <= (t.noise_ms or 0.0)]
    why = [f"{what} {', '.join(noisy)} ({measure}; limit {SPREAD_LIMIT:.0%})"] if noisy else []
    why += [f"the {' and '.join(lost)} time is within the empty windows' noise"] if lost else []
    why += [obs.windows_sized_down] if obs.windows_sized_down else []
    return "; ".join(why) or None


def _shared_gpu(obs: Observations) -> str | None:
    """Why the windows were timed on a GPU shared with work that may not be the candidate's: waits for an idle GPU
    that other processes' work (or work that could not be told apart) made long. Not the candidate's doing, so never
    leftover_gpu_work; but what it did beside that work cannot be checked, and the GPU was not its alone."""
    waits = obs.gpu_shared_waits_ms
    if not waits and not obs.gpu_shared_busy:
        return None
    whose = (f"other processes on the GPU (host PIDs {', '.join(map(str, obs.gpu_sharers))})" if obs.gpu_sharers
             else "work that could not be told apart from the candidate's"
             + (f" ({obs.gpu_unattributed})" if obs.gpu_unattributed else ""))
    return (f"timed on a shared GPU: {len(waits)} wait(s) for an idle GPU around reference windows outlasted "
            f"{LEFTOVER_GPU_MS:g} ms (longest {max(waits, default=0.0):.4g} ms; busy still at the wait's limit: "
            f"{obs.gpu_shared_busy}) with {whose}")


def degenerate_at(obs: Observations, tol: Tolerance) -> list[str]:
    """The outputs that compute nothing (zeros, a constant, each row's mean) that would pass at `tol`."""
    return [t.kind for t in obs.trivial_outputs if t.outputs and all(within_tolerance(f, tol) for f in t.outputs)]


def correct_so_far(obs: Observations, tol: Tolerance) -> bool:
    """Right answers, whatever the static pre-check says: such a candidate is still timed and checked,
    so a submission held for review carries its figures."""
    return grade(obs.model_copy(update={"static_findings": []}), tol).verdict == Verdict.passed


def _with_parameter_hint(g: Grade, obs: Observations) -> Grade:
    """A wrong answer from a model some of whose tensors got none of the reference's (drawn fresh for each
    evaluation) says which: the likeliest cause for code that computes the right thing."""
    sd = obs.state_dict
    if g.verdict != Verdict.wrong_answer or sd is None or not (sd.not_copied or sd.reference_unused):
        return g
    hint = (f"the reference's tensors are drawn fresh for each evaluation and reach ModelNew by name, or by shape "
            f"and likeness of name; these got none: {', '.join(sd.not_copied[:6]) or 'none'}; reference tensors "
            f"unused: {', '.join(sd.reference_unused[:6]) or 'none'} (values derived from parameters in __init__ "
            "go stale too)")
    return replace(g, message=f"{g.message}; {hint}", log_excerpt=f"{g.log_excerpt}\n{hint}".strip())


def _grade_trial(i: str, structure_error: str | None, outputs: list[OutputFigures], tol: Tolerance,
                 file_error: str | None = None) -> Grade | None:
    if file_error:  # the submission put something else where its output file belongs: its fault, never ours
        return Grade(Verdict.runtime_error, f"trial {i}: {file_error}")
    if structure_error:
        return Grade(Verdict.shape_mismatch, f"trial {i}: {structure_error}")
    for o in outputs:
        name = f"output {o.index}" if len(outputs) > 1 else "output"
        if o.got_type != "Tensor":
            return Grade(Verdict.shape_mismatch, f"trial {i}: {name} is a {o.got_type}, not a plain torch.Tensor")
        if o.got_shape != o.expected_shape:
            return Grade(Verdict.shape_mismatch, f"trial {i}: {name} has shape {_shape(o.got_shape)}, the "
                         f"reference's has shape {_shape(o.expected_shape)}")
        if o.got_dtype != o.expected_dtype:
            return Grade(Verdict.dtype_mismatch, f"trial {i}: {name} has dtype {o.got_dtype}, the reference's "
                         f"has dtype {o.expected_dtype}")
        if o.nonfinite_mismatches:
            return Grade(Verdict.wrong_answer, f"trial {i}: {name} has NaN/Inf in {o.nonfinite_mismatches} of "
                         f"{o.numel} elements where the reference has finite values")
        if not within_tolerance(o, tol):
            line = (f"trial {i} {name}: max abs err {o.max_abs_err:.4g}, max rel err {o.max_rel_err:.4g}; worst at "
                    f"{o.worst_index}: got {o.worst_got:.6g}, expected {o.worst_expected:.6g}")
            if o.mismatches_at_eval_tolerance is not None:
                line += f"; {o.mismatches_at_eval_tolerance} of {o.numel} elements outside the tolerance at eval time"
            if o.max_rel_err_or_fp64 is not None:
                line += (f"; within it of neither the reference nor the float64 truth (max rel err to the nearer "
                         f"{o.max_rel_err_or_fp64:.4g})")
            return Grade(Verdict.wrong_answer, f"trial {i}: {name} differs from the reference beyond {tol} "
                         f"(max abs err {o.max_abs_err:.3g})", line)
    return None


def _passed(obs: Observations, tol: Tolerance) -> Grade:
    if obs.static_findings:  # right answers, suspicious means: held for review, never ranked
        flags = _static_flags(obs)
        rules = sorted({f.rule for f in obs.static_findings})
        return Grade(Verdict.flagged, f"correct, but the static pre-check flagged: {', '.join(rules)}",
                     "\n".join(f"{f.check} {f.detail}" for f in flags), flags=flags)
    s_eager = _speedup(obs.eager_timing, obs.candidate_timing)
    s_compile = _speedup(obs.compile_timing, obs.candidate_timing)
    sol, ct = obs.speed_of_light, obs.candidate_timing
    # Parent-clock windows give the time per call net of the empty window, averaged over a window's calls. Results
    # timed in-process before them are judged on their raw median (an honest tiny kernel's net median there could
    # round to ~0 after its overhead was taken off).
    # A window's net time is only known to within the empty windows' noise: the time may be that much longer.
    seen = None if ct is None else ct.median_ms + (ct.noise_ms or 0.0) if ct.clock == "parent_window" \
        or ct.raw_median_ms is None else ct.raw_median_ms
    if sol is not None and seen is not None and seen < SOL_FACTOR * sol.floor_ms():
        detail = (f"median {seen:.4g} ms (with its noise), the floor {sol.floor_ms():.4g} ms "
                  f"({sol.flops or 0:.3g} FLOP at "
                  f"{sol.flops_per_s / 1e12:.0f} TFLOP/s, {sol.min_bytes or 0:.3g} B at "
                  f"{sol.bytes_per_s / 1e9:.0f} GB/s)")
        return _flagged("speed_of_light", "the reported time is below what this GPU can physically do", detail)
    unreliable = _unreliable_timing(obs)
    shared = _shared_gpu(obs)
    # A speedup the windows cannot vouch for is neither ranked nor evidence: it is marked below, not held.
    if s_compile is not None and s_compile > REVIEW_SPEEDUP_VS_COMPILE and unreliable is None and shared is None:
        detail = f"{s_compile:.1f}x vs torch.compile (over {REVIEW_SPEEDUP_VS_COMPILE:g}x)"
        return _flagged("review_speedup", f"correct, {detail}: held for review before it is ranked", detail)
    figs = [o for t in obs.trials for o in t.outputs]
    max_abs = max((o.max_abs_err or 0.0 for o in figs), default=0.0)
    flags: list[Flag] = []
    if obs.kernels is not None and not obs.kernels.custom:
        flags.append(Flag(check="no_custom_kernel", detail=f"{_no_own_kernel(obs.kernels)}: passed, not ranked"))
    if unreliable is not None:
        flags.append(Flag(check="timing_unreliable", detail=unreliable + ": shown, not ranked"))
    if shared is not None:
        flags.append(Flag(check="shared_gpu", detail=shared + ": shown, not ranked"))
    trivial = degenerate_at(obs, tol)
    if trivial:
        flags.append(Flag(check="degenerate_tolerance", detail=f"{', '.join(trivial)} would pass at {tol} too: "
                          "at this size and tolerance passing proves nothing; shown, not ranked"))
    cand = max((o.err_vs_fp64 or 0.0 for o in figs), default=0.0)
    ref = max((o.ref_err_vs_fp64 or 0.0 for o in figs), default=0.0)
    if cand > PRECISION_FLOOR and cand > PRECISION_RATIO * ref:
        flags.append(Flag(check="precision_below_fp32", detail=f"error vs float64 {cand:.3g}, the reference's "
                          f"{ref:.3g}: lower-precision arithmetic (TF32, bf16, fast math)"))
    extra = sum(t.inputs != "get_inputs" for t in obs.trials)
    parts = [f"{len(obs.trials)} trials within {tol}" + (f" ({extra} on other inputs)" if extra else "")
             + f", max abs err {max_abs:.3g}"]
    by_truth = [t.trial for t in obs.trials if any(not within_reference_tolerance(o, tol) for o in t.outputs)]
    if by_truth:
        parts.append(f"trial{'s' if len(by_truth) > 1 else ''} {', '.join(map(str, by_truth))} within the tolerance "
                     "of the float64 truth where outside the reference's (its own rounding)")
    if obs.state_dict is not None and obs.state_dict.copied:
        parts.append(f"reference parameters copied into {len(obs.state_dict.copied)} tensors")
    if s_eager is not None:
        parts.append(f"{s_eager:.3f}x vs eager")
    if s_compile is not None:
        parts.append(f"{s_compile:.3f}x vs torch.compile")
    if ct is not None and ct.charged_ms and ct.calls_per_window and ct.median_ms > 0 and statistics.median(
            ct.charged_ms) > 0:
        share = statistics.median(ct.charged_ms) / ct.calls_per_window / ct.median_ms
        parts.append(f"its fingerprints took {share:.1%} of its time beyond the trusted side's (median over windows; "
                     "charged to them)")
    return Grade(Verdict.passed, "; ".join(parts), flags=flags, speedup_vs_eager=s_eager, speedup_vs_compile=s_compile)


def _no_own_kernel(trace: KernelTrace) -> str:
    """Why a traced result has no kernel of its own: what its timed window launched, or why that is not known."""
    if trace.from_source:
        return "forward launched only library kernels (not traced: its source builds nothing and imports only torch)"
    if trace.error:
        return f"its timed window's launches could not be traced ({trace.error}): no kernel shown to be its own"
    shown = ", ".join((trace.names or [])[:5]) or "none"
    graph = "; a CUDA graph was launched, whose kernels are not named" if trace.graph else ""
    return (f"no kernel its build's device code or its own @triton.jit functions define ran in timed window "
            f"{trace.window} ({shown}){graph}")
