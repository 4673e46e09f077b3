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
from harness.sandbox.protocol import CandidateRequest, Channel
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
    """Tensors (or sequences of them) are saved as they are; anything else as a description."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return out
    return f"<{type(out).__name__}>"


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
        req.outputs_dir.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            for i in range(req.trials):
                inputs = problem_module.to_device(
                    torch.load(req.exchange_dir / f"inputs_{i}.pt", weights_only=True), device)
                out = model(*inputs)
                problem_module.synchronize(device)
                torch.save(_saveable(out), req.outputs_dir / f"out_{i}.pt")
                chan.send("trial", trial=i)
            # The same inputs again: an uninitialised or racy read shows up as a difference.
            inputs = problem_module.to_device(torch.load(req.exchange_dir / "inputs_0.pt", weights_only=True), device)
            out = model(*inputs)
            problem_module.synchronize(device)
            torch.save(_saveable(out), req.outputs_dir / "det.pt")
        check_flags("run")
        # The parent has the outputs judged before it lets a candidate spend time on timing.
        chan.send("trials_done")
        if sys.stdin.readline().strip() == "time" and req.timing is not None:
            phase = Phase.timing
            chan.send("timing_started")
            problem = problem_module.load_problem(req.problem)
            cfg = req.timing

            def make_inputs(i: int) -> list[Any]:
                return problem_module.seeded_inputs(problem, cfg.seed + i, device)

            prints: list[Any] = []
            stats = timing.time_calls(model, make_inputs, device, warmup=cfg.warmup, calls=cfg.calls,
                                      flush_l2=cfg.flush_l2, fingerprints=prints)
            chan.send("timing", **stats)
            chan.send("timed_outputs", fingerprints=prints)
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
