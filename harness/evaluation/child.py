"""The candidate's process: `python -m harness.evaluation.child --channel-fd N --request FILE`.

The only module that imports a submission. It answers the parent's commands (protocol.py): construct,
trials (outputs packed into the exchange for the trusted judge), timed windows (the parent's clock times them),
hand-overs of the outputs the parent picks, the kernel trace of the timed window the parent names. The submission
owns this process and can change any of this code, so it decides nothing: what it reports is at most a claim against
itself (an output that changed after the call, a flag switched, a kernel launched), and its outputs are judged in the
trusted process.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# torch and the harness's timing primitives are imported before the submission is (and before the parent's Import:
# a process started ahead of its evaluation has them ready, load_inline's module too).
import torch
import torch.utils.cpp_extension

from harness.evaluation import exchange, launches, parameters, problem_module, timing, torchflags
from harness.evaluation.protocol import (
    REPLIES,
    CandidateCommand,
    CandidateRequest,
    Channel,
    Construct,
    Fingerprint,
    Handover,
    Import,
    LeadIn,
    LoadParameters,
    Pin,
    RunTrial,
    Scales,
    Trace,
    Window,
)
from harness.sandbox.stacks import DUMP_SIGNAL
from harness.verdicts import Phase


def import_submission(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("submission", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return module


def copy_matching_state(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Copy the reference's tensors (drawn fresh for this evaluation) into the candidate's: by name, then among
    tensors of one shape and dtype by likeness of name, then in order (parameters.match)."""
    own = model.state_dict()
    pairs = parameters.match(own, reference)
    if pairs:
        model.load_state_dict({k: reference[r] for k, r in pairs.items()}, strict=False)
    return {"copied": sorted(pairs), "by_position": {k: r for k, r in sorted(pairs.items()) if k != r},
            "not_copied": sorted(k for k in own if k not in pairs),
            "reference_unused": [r for r in reference if r not in set(pairs.values())]}


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


def _dense(obj: Any) -> list[torch.Tensor]:
    """The output's tensors the judge can take (dense, strided, plain): only those are watched for later writes; the
    others (sparse, meta, subclasses) are described to the judge, which refuses them (exchange.not_dense)."""
    return [t for t in _tensors(obj) if exchange.not_dense(t) is None]


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


def checked_call(model: torch.nn.Module, inputs: list[Any], device: torch.device,
                 forward_seed: int, originals: list[Any] | None = None) -> tuple[Any, bool, list[int]]:
    """One correctness call, watched: allocator poisoned before it; the inputs compared after it with `originals`
    (where `inputs` were copied from them), else with a copy made before it; the output snapshotted in stream order
    right after it returns and compared again after a device-wide sync and a pause, so work left running on another
    stream or thread shows. Returns the output, whether it changed after the return, and which inputs changed."""
    poison_allocator(device, inputs)
    before = list(_tensors(originals)) if originals is not None else [t.clone() for t in _tensors(inputs)]
    problem_module.manual_seed(forward_seed, device)  # as the trusted side did before the reference's call
    out = model(*inputs)
    snapshot = [t.clone() for t in _dense(out)]  # queued on the current stream: sees its order only
    problem_module.synchronize(device)
    time.sleep(0.02)  # a deferred writer on another thread gets its chance to show itself
    problem_module.synchronize(device)
    after = _dense(out)
    changed = len(snapshot) != len(after) or not all(_same(a, b) for a, b in zip(snapshot, after, strict=True))
    mutated = [k for k, (a, b) in enumerate(zip(before, _tensors(inputs), strict=True)) if not _same(a, b)]
    return out, changed, mutated


def own_triton_kernels(path: Path) -> dict[str, list[int]]:
    """The handles (`CUfunction`) of the compiled kernels of every `@triton.jit` function whose code lives in the
    submission's file, by function name: what ties a traced Triton launch to the submission's own text. Inductor's
    generated functions live in files of its cache. Empty where Triton was never imported."""
    jit = sys.modules.get("triton.runtime.jit")
    cls = getattr(jit, "JITFunction", None)
    if not isinstance(cls, type):
        return {}
    own: dict[str, list[int]] = {}
    for obj in gc.get_objects():
        code = getattr(getattr(obj, "fn", None), "__code__", None) if issubclass(type(obj), cls) else None
        if code is None or code.co_filename != str(path):
            continue
        for caches in list(getattr(obj, "device_caches", {}).values()):
            compiled = caches[0] if isinstance(caches, tuple) and caches and isinstance(caches[0], dict) else {}
            handles = [k.function for k in compiled.values() if isinstance(getattr(k, "function", None), int)]
            own.setdefault(obj.fn.__name__, []).extend(handles)
    return own


class _Launches:
    """The kernel trace: CUPTI's launch callbacks, subscribed before the submission's code loads and on only for the
    window the parent asks to trace; each kernel first launched there goes to the parent at once ('launched')."""

    def __init__(self, chan: Channel):
        self.chan = chan
        self.error: str | None = None
        try:  # a host without CUPTI costs the submission its credit, never its verdict
            self.tracer = launches.Tracer.subscribe(self._emit)
        except Exception as e:
            self.tracer, self.error = None, f"CUPTI could not be subscribed: {type(e).__name__}: {e}"[:500]
        if self.tracer is None and self.error is None:
            self.error = "CUPTI is missing or refused a subscriber"

    def _emit(self, name: str | None, handle: int | None) -> None:
        if name is None:
            self.chan.send("launched", graph=True)
        else:
            self.chan.send("launched", name=name[:2000], handle=handle)

    def start(self) -> None:
        if self.tracer is None or not self.tracer.start():
            self.chan.send("launched", error=self.error or "CUPTI refused the launch callbacks")

    def stop(self) -> None:
        if self.tracer is not None:
            self.tracer.stop()

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()


class _Session:
    """The candidate's side of an evaluation, one method per command. Replies carry the command's nonce."""

    def __init__(self, req: CandidateRequest, chan: Channel, module: Any, flags_before_import: dict[str, Any],
                 traced: _Launches | None = None):
        self.req, self.chan, self.module = req, chan, module
        self.launches = traced
        self.device = torch.device(req.device)
        self.flags = flags_before_import
        self.flag_changes: list[dict[str, Any]] = []
        self.model: torch.nn.Module | None = None
        self.problem: Any = None
        self.flush: torch.Tensor | None = None
        self.kept: list[Any] = []
        self.link: exchange.FdLink | None = None  # where the exchange's descriptors come from (the parent's relay)
        self.segments: dict[str, exchange.Segment] = {}
        self.window_inputs: list[list[Any]] = []  # views of the window segment, one list per call (LeadIn's layout)
        self.retired: list[exchange.Segment] = []

    def attach(self, cmd: CandidateCommand) -> None:
        """The segments the command names, their descriptors taken from the fd socket (sent just before it)."""
        if not cmd.segments:
            return
        assert self.link is not None, "segments named, but no fd socket"
        for spec, fd in zip(cmd.segments, self.link.receive(len(cmd.segments)), strict=True):
            old = self.segments.pop(spec["name"], None)
            if old is not None:  # a larger one replaces it (the window segment, as windows grow): closed once the
                self.retired.append(old)  # lead-in has run on the inputs it holds
            self.segments[spec["name"]] = exchange.attach(spec, fd)

    def _pack(self, out: Any, seg: exchange.Segment, base: int = 0) -> dict[str, Any]:
        """An output into `seg` from `base` (a description where it is no plain tensor or sequence of them), its
        copy done on the device before the reply."""
        saved = _saveable(out)
        if isinstance(saved, str):
            return {"kind": "other", "description": saved}
        layout = exchange.pack(saved, seg, base, in_place=True)
        problem_module.synchronize(self.device)
        return layout

    def check_flags(self, when: str) -> None:
        now = torchflags.snapshot()
        self.flag_changes += [{"name": n, "before": b, "after": a, "when": when}
                              for n, b, a in torchflags.changes(self.flags, now)]
        self.flags = now

    def construct(self, cmd: Construct) -> dict[str, Any] | None:
        model_cls = getattr(self.module, "ModelNew", None)
        if not isinstance(model_cls, type):
            self.chan.send("invalid", nonce=cmd.nonce, message="the module defines no class ModelNew after import")
            return None
        init_args = list(exchange.unpack(cmd.init_args, self.segments.get("init_args"), torch.device("cpu")))
        try:
            inspect.signature(model_cls).bind(*init_args)
        except TypeError as e:
            self.chan.send("invalid", nonce=cmd.nonce, message=f"ModelNew cannot be constructed with the problem's "
                                                               f"{len(init_args)} init arguments: {e}")
            return None
        except ValueError:
            pass  # no introspectable signature: let the call decide
        torch.manual_seed(cmd.param_seed)
        model = model_cls(*init_args)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ModelNew is not a torch.nn.Module (got {type(model).__name__})")
        self.model = model
        self.check_flags("construct")
        return {"flag_changes": self.flag_changes}

    def parameters(self, cmd: LoadParameters) -> dict[str, Any]:
        assert self.model is not None
        reference = exchange.unpack(cmd.state_dict, self.segments.get("parameters"), torch.device("cpu"))
        # At the evaluation's precision before the copy, as the reference was (KernelBench casts ModelNew the same way):
        # its tensors then have the reference's dtypes, which matching requires.
        self.model = self.model.to(problem_module.dtype_of(self.req.problem.precision))
        state = copy_matching_state(self.model, reference)
        self.model = self.model.to(self.device)
        self.check_flags("construct")
        self.problem = problem_module.load_problem(self.req.problem)
        self.flush = timing.l2_flush_buffer(self.device)
        return {"state_dict": state, "flag_changes": self.flag_changes}

    def trial(self, cmd: RunTrial) -> dict[str, Any]:
        """One trial: its inputs as the trusted side staged them (trial None: trial 0's again, a racy read shows as a
        difference), the call watched, the output packed into the output segment."""
        assert self.model is not None
        with torch.no_grad():
            # Mapped copy-on-write on the host (no copy); on the device cloned off the segment, the process's own,
            # and compared with the segment after the call (one copy of the inputs, not two: level1/45's are 16 GiB).
            views = exchange.unpack(cmd.inputs, self.segments["inputs"], self.device)
            inputs, originals = views, None
            if self.device.type == "cuda":
                inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in views]
                originals = views
            out, changed, mutated = checked_call(self.model, inputs, self.device, cmd.forward_seed, originals)
            layout = self._pack(out, self.segments["output"])
            del out, inputs, views, originals
        if self.device.type == "cuda":
            # What the trial held (the poisoned block, its tensors) goes back to the driver before the reply: the
            # trusted side then makes the next trial's expected output beside this process (level1/39: the trusted
            # side ran out of device memory in its take while this process kept 26.7 GiB cached).
            torch.cuda.empty_cache()
        self.check_flags("run")
        return {"output": layout, "output_changed": changed, "inputs_mutated": mutated,
                "flag_changes": self.flag_changes}

    def window(self, cmd: Window) -> dict[str, Any]:
        assert self.model is not None
        self.kept = []
        traced = self.launches if cmd.trace else None
        if traced is not None:
            traced.start()
        elif cmd.trace:
            self.chan.send("launched", error="CUPTI was not subscribed when this process started")
        try:
            seen = timing.run_window(timing.empty_call if cmd.empty else self.model, self.problem, cmd.seeds,
                                     cmd.forward_seeds, self.device, self.flush if cmd.flush_l2 else None,
                                     keep=None if cmd.empty else self.kept,
                                     inputs=self.window_inputs if cmd.staged else None)
        finally:
            if traced is not None:
                traced.stop()
        return seen if isinstance(seen, dict) else {}  # a diagnostic: the parent believes none of it

    def lead_in(self, cmd: LeadIn) -> dict[str, Any]:
        """Untimed calls on the inputs of the last window (the window segment's now, seen already), right before the
        next window; with a layout, the views of where the next window's inputs will lie, made here rather than in the
        timed window."""
        assert self.model is not None
        # On the inputs of the last window (none before the first): the segment's other bytes may be no inputs yet.
        # The last window's outputs (kept for its fingerprint and hand-over, both done) let go here, off the clock, as
        # the trusted side lets eager's go when it fingerprints them. Let go at the start of the next window, on the
        # 2-core CPU VM, they put the candidate's round trip over 1 ms in 11 of 30 A/A runs (the trusted side's:
        # 0.32-0.50 ms); here, in 2 of 30.
        self.kept = []
        timing.lead_in(self.model, self.window_inputs, cmd.calls, self.device, self.flush if cmd.flush_l2 else None)
        if cmd.layout is not None:
            seg = self.segments["window"]
            self.window_inputs = [list(exchange.unpack(layout, seg, self.device)) for layout in cmd.layout]
        for old in self.retired:
            old.close()
        self.retired = []
        return {}

    def fingerprint(self, cmd: Fingerprint) -> dict[str, Any]:
        return {"sums": timing.fingerprints(self.kept, cmd.key, self.device)}

    def scales(self, cmd: Scales) -> dict[str, Any]:
        return {"scales": timing.fingerprint_scales(self.kept, cmd.atol, cmd.rtol)}

    def handover(self, cmd: Handover) -> dict[str, Any]:
        seg = self.segments["handover"]
        slot = seg.nbytes // max(len(cmd.picks), 1)  # the segment holds as many slots as a window picks
        return {"layouts": [self._pack(self.kept[j], seg, k * slot) for k, j in enumerate(cmd.picks)]}

    def pin(self, cmd: Pin) -> dict[str, Any]:
        return {"cores": timing.pin_thread(cmd.cores), "threads": timing.keep_threads(cmd.threads)}

    def trace(self, cmd: Trace) -> dict[str, Any]:
        """After the timed rounds: CUPTI let go, and the handles of the kernels the submission defined."""
        if self.launches is not None:
            self.launches.close()
        builds = os.environ.get("TORCH_EXTENSIONS_DIR")
        return {"own_triton": own_triton_kernels(self.req.submission_path),
                "own_build": launches.build_kernel_handles(Path(builds)) if builds else {}}


_COMMANDS: dict[str, type[CandidateCommand]] = {"construct": Construct, "parameters": LoadParameters,
                                                "trial": RunTrial, "window": Window, "fingerprint": Fingerprint,
                                                "handover": Handover, "trace": Trace, "lead_in": LeadIn,
                                                "pin": Pin, "scales": Scales}


def run(req: CandidateRequest, chan: Channel, link: exchange.FdLink | None = None) -> None:
    """Wait for the parent's `Import`, import the submission, say so, then answer the parent's commands until it says
    exit (or stdin ends)."""
    phase = Phase.compile
    try:
        # Before any of the submission's code loads: it finds the tracer in place, and cannot keep it from starting.
        traced = _Launches(chan) if req.kernel_trace else None
        line = sys.stdin.readline()
        if not line.strip().startswith("{"):
            return  # "exit": the evaluation this process was started for will not run
        start = Import.model_validate_json(line)
        t0 = time.perf_counter()
        flags = torchflags.snapshot()
        module = import_submission(req.submission_path)
        session = _Session(req, chan, module, flags, traced)
        session.link = link
        session.check_flags("import")
        seconds = time.perf_counter() - t0
        if session.device.type == "cuda":  # the context now, while the trusted side writes the parameters: the
            torch.zeros(1, device=session.device)  # constructor would otherwise wait for it
        chan.send("imported", nonce=start.nonce, seconds=seconds, flag_changes=session.flag_changes)
        for line in sys.stdin:
            if not line.strip().startswith("{"):
                return  # "exit", or the parent stopped this evaluation
            raw = json.loads(line)
            cmd = _COMMANDS[raw["cmd"]].model_validate(raw)
            phase = {"construct": Phase.compile, "parameters": Phase.compile,
                     "trial": Phase.correctness}.get(cmd.cmd, Phase.timing)
            session.attach(cmd)
            reply = getattr(session, cmd.cmd)(cmd)
            if reply is None:
                return
            chan.send(REPLIES[cmd.cmd], nonce=cmd.nonce, **reply)
    except BaseException as e:  # SystemExit and KeyboardInterrupt from submission code included
        message = str(e) if not isinstance(e, SystemExit) else f"the submission called sys.exit({e.code!r})"
        chan.send("error", phase=phase.value, exc_type=type(e).__name__, message=message[:20000],
                  traceback=traceback.format_exc()[-20000:])
        # What it holds stays held (the traceback keeps the failed call's tensors, the allocator its blocks) until the
        # parent says exit: after a device out-of-memory error, the parent reads the GPU's memory first.
        sys.stdin.readline()


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
    parser.add_argument("--fd-socket", type=int, help="where the exchange's descriptors come from")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--request", type=Path, help="evaluate: a CandidateRequest JSON file")
    mode.add_argument("--compile-only", type=Path, metavar="SUBMISSION",
                      help="import the submission (running its load_inline builds) and stop")
    args = parser.parse_args(argv)
    # Before any submission code: on a timeout the parent asks for the stacks into the log (sandbox/stacks.py).
    faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True)
    chan = Channel(args.channel_fd)
    if args.compile_only is not None:
        compile_only(args.compile_only, chan)
    else:
        link = exchange.FdLink(args.fd_socket) if args.fd_socket is not None else None
        run(CandidateRequest.model_validate_json(args.request.read_text()), chan, link)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: atexit hooks and finalizers of submission code decide nothing.
    os._exit(0)


if __name__ == "__main__":
    main()
