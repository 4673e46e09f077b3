"""The candidate's process: `python -m harness.sandbox.child --channel-fd N --request FILE`.

The only module that imports a submission. It records raw figures and saves outputs for the
trusted judge; it decides nothing. Everything it reports is a claim the parent checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# torch and the harness's timing primitives are imported before the submission is.
import torch

from harness.sandbox import problem_module, timing, torchflags
from harness.sandbox.protocol import CandidateRequest, Channel, ConstructCommand, TimeCommand, WarmupCommand
from harness.verdicts import Phase


def import_submission(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("submission", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return module


def copy_matching_state(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Copy each reference tensor into the candidate's entry of the same name, shape and dtype."""
    own = model.state_dict()
    matching = {k: v for k, v in reference.items()
                if k in own and own[k].shape == v.shape and own[k].dtype == v.dtype}
    if matching:
        model.load_state_dict(matching, strict=False)
    return {"copied": sorted(matching), "not_copied": sorted(k for k in own if k not in matching)}


def _saveable(out: Any) -> Any:
    """Plain tensors (or sequences of them) are saved as they are; anything else, a tensor subclass
    included (it could compute lazily, or lie, when saved), as a description the judge rejects."""
    if type(out) is torch.Tensor:
        return out
    if isinstance(out, (tuple, list)) and all(type(o) is torch.Tensor for o in out):
        return out
    if isinstance(out, torch.Tensor):
        return f"<{type(out).__name__} (a torch.Tensor subclass)>"
    return f"<{type(out).__name__}>"


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [o for o in obj if isinstance(o, torch.Tensor)]
    return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.nan_to_num(), b.nan_to_num())))


def poison_allocator(device: torch.device, inputs: list[Any]) -> None:
    """Fill the CUDA caching allocator's free memory with 0xFF bytes (NaN in every float dtype), so a
    kernel that leaves part of a fresh `torch.empty` unwritten returns NaN there instead of whatever
    an earlier tensor left behind. CUDA only: host malloc gives no such hook."""
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # free blocks holding stale tensors go back to the driver first
    in_bytes = sum(t.numel() * t.element_size() for t in _tensors(inputs))
    free, _ = torch.cuda.mem_get_info(device)
    big = min(max(256 << 20, 4 * in_bytes), free // 4)
    blocks = [torch.empty(big, dtype=torch.uint8, device=device)]
    blocks += [torch.empty(512 << 10, dtype=torch.uint8, device=device) for _ in range(16)]  # small pool
    for b in blocks:
        b.fill_(0xFF)
    torch.cuda.synchronize(device)
    del blocks


def checked_call(model: torch.nn.Module, inputs: list[Any], device: torch.device, chan: Channel,
                 trial: int | None) -> Any:
    """One correctness call, watched: allocator poisoned before it; the inputs compared with a copy
    after it; the output snapshotted in stream order right after it returns and compared again
    after a device-wide sync and a pause, so work left running on another stream or thread shows."""
    poison_allocator(device, inputs)
    before = [t.clone() for t in _tensors(inputs)]
    out = model(*inputs)
    snapshot = [t.clone() for t in _tensors(out)]  # queued on the current stream: sees its order only
    problem_module.synchronize(device)
    time.sleep(0.02)  # a deferred writer on another thread gets its chance to show itself
    problem_module.synchronize(device)
    after = _tensors(out)
    if len(snapshot) != len(after) or not all(_same(a, b) for a, b in zip(snapshot, after, strict=True)):
        chan.send("output_changed", trial=trial)
    mutated = [k for k, (a, b) in enumerate(zip(before, _tensors(inputs), strict=True)) if not _same(a, b)]
    if mutated:
        chan.send("inputs_mutated", trial=trial, inputs=mutated)
    return out


def kernels_of_one_call(model: torch.nn.Module, inputs: list[Any]) -> list[str]:
    """The names of the GPU kernels one forward launches, from the torch profiler (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(*inputs)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    return sorted(names)[:500]


def run(req: CandidateRequest, chan: Channel) -> None:
    device = torch.device(req.device)
    phase = Phase.compile
    flags = torchflags.snapshot()

    def check_flags(when: str) -> None:
        nonlocal flags
        now = torchflags.snapshot()
        for name, before, after in torchflags.changes(flags, now):
            chan.send("flag_change", name=name, before=before, after=after, when=when)
        flags = now

    try:
        chan.send("started", pid=os.getpid())
        t0 = time.perf_counter()
        module = import_submission(req.submission_path)
        chan.send("imported", seconds=time.perf_counter() - t0)
        check_flags("import")
        # The import ran while the trusted side prepared the problem; the exchange dir is complete once the
        # parent says so. Anything else on stdin (or its end: the parent stopped this evaluation) ends here.
        line = sys.stdin.readline()
        if not line.strip().startswith("{"):
            return
        trials = ConstructCommand.model_validate_json(line).trials
        model_cls = getattr(module, "ModelNew", None)
        if not isinstance(model_cls, type):
            chan.send("invalid", message="the module defines no class ModelNew after import")
            return
        init = torch.load(req.exchange_dir / "init.pt", weights_only=True)
        try:
            inspect.signature(model_cls).bind(*init["init_args"])
        except TypeError as e:
            chan.send("invalid", message=f"ModelNew cannot be constructed with the problem's "
                                         f"{len(init['init_args'])} init arguments: {e}")
            return
        except ValueError:
            pass  # no introspectable signature: let the call decide
        torch.manual_seed(req.param_seed)
        model = model_cls(*init["init_args"])
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ModelNew is not a torch.nn.Module (got {type(model).__name__})")
        state = copy_matching_state(model, init["state_dict"])
        model = model.to(device)
        check_flags("construct")
        chan.send("constructed", state_dict=state, seconds=time.perf_counter() - t0)

        phase = Phase.correctness
        problem = problem_module.load_problem(req.problem)  # for timing: loaded before the envelope opens
        req.outputs_dir.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            for i in range(trials):
                inputs = problem_module.to_device(
                    torch.load(req.exchange_dir / f"inputs_{i}.pt", weights_only=True), device)
                out = checked_call(model, inputs, device, chan, trial=i)
                torch.save(_saveable(out), req.outputs_dir / f"out_{i}.pt")
                chan.send("trial", trial=i)
            # The same inputs again: an uninitialised or racy read shows up as a difference.
            inputs = problem_module.to_device(torch.load(req.exchange_dir / "inputs_0.pt", weights_only=True), device)
            out = checked_call(model, inputs, device, chan, trial=None)
            torch.save(_saveable(out), req.outputs_dir / "det.pt")
            del out
        check_flags("run")
        # The parent has the outputs judged before it lets a candidate spend time on timing; the
        # seed of the timed inputs comes only with its go-ahead.
        chan.send("trials_done")
        command = sys.stdin.readline().strip()
        if command.startswith("{") and req.timing is not None:
            cfg = req.timing
            warm = WarmupCommand.model_validate_json(command)
            phase = Phase.timing
            timing.warm_up(model, lambda i: problem_module.seeded_inputs(problem, warm.seed + i, device), device,
                           cfg.warmup)
            chan.send("warmed")
            go = TimeCommand.model_validate_json(sys.stdin.readline())
            chan.send("timing_started")

            def make_inputs(i: int) -> list[Any]:
                return problem_module.seeded_inputs(problem, go.seed + i, device)

            prints: list[Any] = []
            stats = timing.time_calls(model, make_inputs, device, calls=cfg.calls, flush_l2=cfg.flush_l2,
                                      fingerprints=prints)
            chan.send("timing", **stats)
            chan.send("timed_outputs", fingerprints=prints)
        if command.startswith("{") and device.type == "cuda":
            # Which kernels one forward launches, profiled last: CUPTI may leave a per-launch cost behind,
            # which must not land in the timing (and only a candidate judged correct gets this far).
            try:
                with torch.no_grad():
                    chan.send("kernels", names=kernels_of_one_call(model, inputs))
            except Exception as e:  # no CUPTI: the check is skipped, not failed
                chan.send("kernels", names=None, error=f"{type(e).__name__}: {e}"[:500])
        chan.send("done")
    except BaseException as e:  # SystemExit and KeyboardInterrupt from submission code included
        message = str(e) if not isinstance(e, SystemExit) else f"the submission called sys.exit({e.code!r})"
        chan.send("error", phase=phase.value, exc_type=type(e).__name__, message=message[:20000],
                  traceback=traceback.format_exc()[-20000:])


def compile_only(path: Path, chan: Channel) -> None:
    t0 = time.perf_counter()
    try:
        import_submission(path)
        chan.send("imported", seconds=time.perf_counter() - t0)
    except BaseException as e:
        chan.send("error", phase=Phase.compile.value, exc_type=type(e).__name__, message=str(e)[:20000],
                  traceback=traceback.format_exc()[-20000:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel-fd", type=int, required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--request", type=Path, help="evaluate: a CandidateRequest JSON file")
    mode.add_argument("--compile-only", type=Path, metavar="SUBMISSION",
                      help="import the submission (running its load_inline builds) and stop")
    args = parser.parse_args(argv)
    chan = Channel(args.channel_fd)
    if args.compile_only is not None:
        compile_only(args.compile_only, chan)
    else:
        run(CandidateRequest.model_validate_json(args.request.read_text()), chan)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: atexit hooks and finalizers of submission code decide nothing.
    os._exit(0)


if __name__ == "__main__":
    main()
