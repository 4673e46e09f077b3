"""The trusted side of an evaluation: `python -m harness.sandbox.trusted --channel-fd N`.

It never imports a submission. It builds the reference Model, draws the correctness inputs from a
secret seed, keeps the expected outputs (fp32 and a float64 ground truth) in its own memory, judges
the candidate's saved outputs, and times the reference. Commands arrive as JSON lines on stdin.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

import harness
from harness.sandbox import problem_module, timing, torchflags
from harness.sandbox.protocol import (
    Channel,
    CheckTimedCommand,
    JudgeCommand,
    PrepareCommand,
    TimeReferenceCommand,
)
from harness.schema import RTOL_GRID


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def probe(device_name: str) -> dict[str, Any]:
    device = problem_module.resolve_device(device_name)
    info: dict[str, Any] = {
        "harness_version": harness.__version__, "device": device.type, "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda, "python_version": platform.python_version(),
        "hostname": socket.gethostname(), "reference_torch_flags": torchflags.snapshot(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    driver_version=_driver_version())
    else:
        info.update(device_name=platform.processor() or platform.machine(), compute_capability=None)
    return info


def _as_list(obj: Any) -> list[Any] | None:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return list(obj)
    return None


def _describe(obj: Any) -> str:
    if isinstance(obj, (tuple, list)):
        return f"{type(obj).__name__} of {len(obj)}"
    if isinstance(obj, str) and obj.startswith("<"):
        return obj.strip("<>")  # the child's description of an object it could not save
    return type(obj).__name__


def _double(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor) and obj.is_floating_point():
        return obj.double()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_double(o) for o in obj)
    return obj


def _fingerprint_mismatch(got: Any, want: list[list[float]] | None, atol: float, rtol: float) -> str | None:
    """Why the candidate's fingerprint cannot come from an output within tolerance, or None."""
    if want is None:
        return None
    if not isinstance(got, list) or len(got) != len(want):
        return f"fingerprint {str(got)[:80]} does not match the reference's structure"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if not (isinstance(g, list) and len(g) == 3 and all(isinstance(v, (int, float)) for v in g)):
            return f"output {k}: malformed fingerprint"
        s, a, n = (float(v) for v in g)
        ws, wa, wn = w
        bound = atol * wn + rtol * wa + 1e-9 * wa  # allclose summed over elements, plus float64 summation slack
        if n != wn or not (abs(s - ws) <= bound and abs(a - wa) <= bound):
            return (f"output {k}: sum {s:.6g} / sum|x| {a:.6g} over {n:g} elements, the reference's {ws:.6g} / "
                    f"{wa:.6g} over {wn:g} (allowed difference {bound:.3g})")
    return None


class Trusted:
    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.expected: list[Any] = []
        self.ground_truth: list[Any] = []
        self.model: torch.nn.Module | None = None
        self.module: Any = None

    def prepare(self, cmd: PrepareCommand) -> dict[str, Any]:
        self.device = problem_module.resolve_device(cmd.device)
        self.module = problem_module.load_problem(cmd.problem)
        init_args = list(self.module.get_init_inputs())
        torch.manual_seed(cmd.param_seed)
        model = self.module.Model(*init_args)
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        cmd.exchange_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"init_args": init_args, "state_dict": state}, cmd.exchange_dir / "init.pt")
        self.model = model.to(self.device)
        model64 = copy.deepcopy(self.model).double()
        self.expected, self.ground_truth = [], []
        distributions = ["get_inputs"] * cmd.trials
        if cmd.extra_distribution:
            distributions.append(problem_module.EXTRA_DISTRIBUTION)
        with torch.no_grad():
            for i, dist in enumerate(distributions):
                torch.manual_seed(cmd.input_seed + i)
                inputs = list(self.module.get_inputs())  # on the CPU, as KernelBench makes them
                if dist != "get_inputs":
                    inputs = problem_module.redistribute(inputs)
                torch.save(inputs, cmd.exchange_dir / f"inputs_{i}.pt")
                on_device = problem_module.to_device(inputs, self.device)
                self.expected.append(self.model(*on_device))
                self.ground_truth.append(model64(*_double(on_device)))
        problem_module.synchronize(self.device)
        del model64
        outputs = _as_list(self.expected[0]) or []
        return {
            "device": self.device.type,
            "init_arg_count": len(init_args),
            "distributions": distributions,
            "output_shapes": [list(o.shape) for o in outputs if isinstance(o, torch.Tensor)],
            "reference_torch_flags": torchflags.snapshot(),
        }

    def judge(self, cmd: JudgeCommand) -> dict[str, Any]:
        trials = []
        for i, (exp, gt) in enumerate(zip(self.expected, self.ground_truth, strict=True)):
            trials.append({"trial": i, **self._judge_one(cmd.outputs_dir / f"out_{i}.pt", exp, gt, cmd)})
        return {"trials": trials, "determinism": self._determinism(cmd.outputs_dir)}

    def _load(self, path: Path) -> tuple[Any, list[str]]:
        locations: list[str] = []

        def record(storage: Any, location: str) -> Any:
            locations.append(location)
            return storage

        obj = torch.load(path, map_location=record, weights_only=True)
        return obj, locations

    def _judge_one(self, path: Path, exp: Any, gt: Any, cmd: JudgeCommand) -> dict[str, Any]:
        if not path.exists():
            return {"structure_error": "the candidate saved no output for this trial"}
        try:
            got, locations = self._load(path)
        except Exception as e:  # a tensor subclass or arbitrary object: not a plain tensor output
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return {"structure_error": f"the output is not made of plain torch.Tensors ({first[:300]})"}
        exp_list, gt_list = _as_list(exp), _as_list(gt)
        got_list = _as_list(got)
        assert exp_list is not None and gt_list is not None
        if isinstance(exp, torch.Tensor) and not isinstance(got, torch.Tensor):
            return {"structure_error": f"expected a Tensor, got {_describe(got)}"}
        if not isinstance(exp, torch.Tensor) and (got_list is None or isinstance(got, torch.Tensor)):
            return {"structure_error": f"expected {_describe(exp)} tensors, got {_describe(got)}"}
        assert got_list is not None
        if len(got_list) != len(exp_list):
            return {"structure_error": f"expected {len(exp_list)} outputs, got {len(got_list)}"}
        wrong_device = {loc for loc in locations if torch.device(loc).type != self.device.type}
        if wrong_device:
            return {"structure_error": f"the output lives on {', '.join(sorted(wrong_device))}, "
                                       f"the reference's on {self.device.type}"}
        outputs = [self._compare(k, g, e, t, cmd)
                   for k, (g, e, t) in enumerate(zip(got_list, exp_list, gt_list, strict=True))]
        return {"outputs": outputs}

    def _compare(self, index: int, got: Any, exp: torch.Tensor, gt: torch.Tensor, cmd: JudgeCommand) -> dict:
        fig: dict[str, Any] = {
            "index": index, "got_type": type(got).__name__,
            "expected_shape": list(exp.shape), "expected_dtype": str(exp.dtype).removeprefix("torch."),
        }
        if type(got) is not torch.Tensor:
            return fig
        fig.update(got_shape=list(got.shape), got_dtype=str(got.dtype).removeprefix("torch."),
                   got_device=self.device.type)
        if got.shape != exp.shape or got.dtype != exp.dtype:
            return fig
        a = got.to(self.device, torch.float64)
        b = exp.to(torch.float64)
        g = gt.to(torch.float64)
        finite = torch.isfinite(a) & torch.isfinite(b)
        same_nonfinite = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b))
        bad_nonfinite = ~finite & ~same_nonfinite
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        diff = torch.where(finite, (a - b).abs(), zero)
        absb = torch.where(finite, b.abs(), zero)
        rel = diff / (1 + absb)
        fig.update(numel=a.numel(), nonfinite_mismatches=int(bad_nonfinite.sum()))
        if a.numel() == 0:
            return fig
        worst = int(rel.reshape(-1).argmax())
        fig.update(
            max_abs_err=float(diff.max()), max_rel_err=float(rel.reshape(-1)[worst]),
            min_atol_at_rtol={f"{r:g}": float((diff - r * absb).clamp_min(0).max()) for r in RTOL_GRID},
            worst_index=[int(x) for x in torch.unravel_index(torch.tensor(worst), a.shape)],
            worst_got=float(a.reshape(-1)[worst]), worst_expected=float(b.reshape(-1)[worst]),
            mismatches_at_eval_tolerance=int(((diff > cmd.atol + cmd.rtol * absb) | bad_nonfinite).sum()),
        )
        gfin = torch.isfinite(g)
        for key, x in (("err_vs_fp64", a), ("ref_err_vs_fp64", b)):
            ok = gfin & torch.isfinite(x)
            d = torch.where(ok, (x - g).abs(), zero)
            fig[key] = float((d / (1 + torch.where(ok, g.abs(), zero))).max())
            norm = float(torch.where(ok, g, zero).norm())
            fig[key.replace("err", "rel_l2")] = float(d.norm()) / norm if norm > 0 else None
        return fig

    def _determinism(self, outputs_dir: Path) -> dict[str, Any] | None:
        first, second = outputs_dir / "out_0.pt", outputs_dir / "det.pt"
        if not (first.exists() and second.exists()):
            return None
        try:
            a, _ = self._load(first)
            b, _ = self._load(second)
        except Exception:
            return None  # the structure check reports unloadable outputs
        la, lb = _as_list(a), _as_list(b)
        if la is None or lb is None or len(la) != len(lb) or not all(
            type(x) is torch.Tensor and type(y) is torch.Tensor and x.shape == y.shape and x.dtype == y.dtype
            for x, y in zip(la, lb, strict=True)
        ):
            return {"bitwise_equal": False, "max_rel_diff": None}
        equal = all(torch.equal(x, y) or (x.is_floating_point() and torch.equal(x.nan_to_num(), y.nan_to_num()))
                    for x, y in zip(la, lb, strict=True))
        worst = 0.0
        for x, y in zip(la, lb, strict=True):
            if x.numel():
                xd, yd = x.double(), y.double()
                worst = max(worst, float(((xd - yd).abs() / (1 + yd.abs())).nan_to_num(nan=float("inf")).max()))
        return {"bitwise_equal": equal, "max_rel_diff": worst}

    def check_timed(self, cmd: CheckTimedCommand) -> dict[str, Any]:
        assert self.model is not None
        mismatches = []
        with torch.no_grad():
            for i, got in zip(cmd.indices, cmd.fingerprints, strict=True):
                inputs = problem_module.seeded_inputs(self.module, cmd.timing_seed + i, self.device)
                want = timing.fingerprint(self.model(*inputs))
                problem = _fingerprint_mismatch(got, want, cmd.atol, cmd.rtol)
                if problem:
                    mismatches.append(f"timed call {i}: {problem}")
        return {"mismatches": mismatches}

    def time_reference(self, cmd: TimeReferenceCommand) -> dict[str, Any]:
        assert self.model is not None
        module, device = self.module, self.device

        def make_inputs(i: int) -> list[Any]:
            return problem_module.seeded_inputs(module, cmd.seed + i, device)

        def warm_inputs(i: int) -> list[Any]:
            return make_inputs(-1 - i)

        kw = {"calls": cmd.timing.calls, "flush_l2": cmd.timing.flush_l2}
        timing.warm_up(self.model, warm_inputs, device, cmd.timing.warmup)
        result: dict[str, Any] = {"eager": timing.time_calls(self.model, make_inputs, device, **kw)}
        with torch.no_grad():
            example = self.model(*make_inputs(-1000))
        result["loop_ms"] = timing.calibrate_loop(make_inputs, device, example, calls=min(cmd.timing.calls, 50),
                                                  flush_l2=cmd.timing.flush_l2)
        if device.type == "cuda":
            result["peaks"] = timing.measure_peaks(device)
        if cmd.compile_baseline:
            try:
                compiled = torch.compile(self.model)
                timing.warm_up(compiled, warm_inputs, device, cmd.timing.warmup)
                result["compile"] = timing.time_calls(compiled, make_inputs, device, **kw)
            except Exception as e:
                result["compile_error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel-fd", type=int, required=True)
    args = parser.parse_args(argv)
    chan = Channel(args.channel_fd)
    trusted = Trusted()
    handlers = {
        "prepare": (PrepareCommand, trusted.prepare, "prepared"),
        "judge": (JudgeCommand, trusted.judge, "judged"),
        "time_reference": (TimeReferenceCommand, trusted.time_reference, "reference_timed"),
        "check_timed": (CheckTimedCommand, trusted.check_timed, "timed_checked"),
    }
    chan.send("ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        raw = json.loads(line)
        name = raw.get("cmd")
        try:
            if name == "probe":
                chan.send("probed", **probe(raw.get("device", "auto")))
            elif name == "exit":
                break
            elif name in handlers:
                model_cls, fn, reply = handlers[name]
                chan.send(reply, **fn(model_cls.model_validate(raw)))
            else:
                chan.send("failed", error=f"unknown command {name!r}")
        except Exception as e:
            chan.send("failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
