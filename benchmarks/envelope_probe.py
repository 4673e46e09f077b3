#!/usr/bin/env python3
"""What the timing-envelope check sees: evaluate submissions through the full pipeline and print the
candidate's reported times next to the parent's own clock, and the loop costs of both sides.

    python benchmarks/envelope_probe.py level2/30 tests/fixtures/submissions/l30_pytorch_correct.py --size small

Also (--cupti) times the bare loop in one process before and after a torch.profiler session, to see
whether profiling leaves a per-launch cost behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.config import get_settings  # noqa: E402
from harness.problems import get_registry  # noqa: E402
from harness.sandbox.runner import EvalOptions, evaluate  # noqa: E402


def cupti_probe(problem: str, size: str) -> None:
    import torch

    from harness.sandbox import problem_module, timing
    from harness.sandbox.child import kernels_of_one_call
    from harness.sandbox.protocol import ProblemLoad

    spec = get_registry().get(problem)
    module = problem_module.load_problem(ProblemLoad(path=spec.source_path, overrides=spec.size(size).overrides))
    device = torch.device("cuda")
    model = module.Model(*module.get_init_inputs()).to(device)

    def loop(tag: str) -> None:
        mk = lambda i: problem_module.seeded_inputs(module, 1000 + i, device)  # noqa: E731
        timing.warm_up(model, mk, device, 5)
        stats = timing.time_calls(model, mk, device, calls=50, fingerprints=[])
        print(f"{tag}: median {stats['median_ms']:.4f} ms, mean {stats['mean_ms']:.4f} ms, "
              f"loop wall {stats['loop_wall_ms']:.4f} ms/call", flush=True)

    loop("before profiler")
    kernels_of_one_call(model, problem_module.seeded_inputs(module, 1, device))
    loop("after profiler ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem")
    parser.add_argument("submissions", nargs="+", type=Path)
    parser.add_argument("--size", default="small")
    parser.add_argument("--cupti", action="store_true")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    settings = get_settings()
    spec = get_registry().get(args.problem)
    for path in args.submissions:
        options = EvalOptions(device=args.device, size=args.size, compile_baseline="off")
        r = evaluate(spec, path.read_text(), options, settings)
        o = r.observations
        ct, et, env = o.candidate_timing, o.eager_timing, o.envelope
        print(f"== {path.name}: {r.verdict.value} {[f.check for f in r.flags]} {r.message[:160]}")
        for f in r.flags:
            print(f"   flag {f.check}: {f.detail}")
        if ct and et:
            print(f"   candidate: median {ct.median_ms:.4f} raw {ct.raw_median_ms:.4f} mean {ct.mean_ms:.4f} "
                  f"overhead {ct.overhead_ms:.4f} loop wall {ct.loop_wall_ms:.4f} ms/call (n={ct.n})")
            print(f"   eager:     median {et.median_ms:.4f} raw {et.raw_median_ms:.4f} mean {et.mean_ms:.4f} "
                  f"overhead {et.overhead_ms:.4f} loop wall {et.loop_wall_ms:.4f} ms/call (n={et.n})")
        if o.kernels is not None:
            print(f"   kernels: {len(o.kernels.names or [])} names, custom {o.kernels.custom}, error {o.kernels.error}")
        if env:
            print(f"   envelope: wall {env.wall_ms:.2f} ms, calls {env.calls}+{env.overhead_calls}, "
                  f"trusted loop {env.loop_ms} ms/call, implied {env.implied_ms()} ms/call", flush=True)
    if args.cupti:
        cupti_probe(args.problem, args.size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
