#!/usr/bin/env python3
"""Wall time of one evaluation with the candidate's process started after the trusted child's probe (what
`harness eval` does) against started beside the trusted child (what a worker does: it passes its slot's probed
target), interleaved, same submission, its build cached.

    python benchmarks/eval_overlap_probe.py [--device cpu|cuda] [--problem level2/30]
        [--submission tests/fixtures/submissions/l30_cpp_correct.py] [--size small] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.config import Settings  # noqa: E402
from harness.evaluation.prebuild import probe_device  # noqa: E402
from harness.evaluation.runner import EvalOptions, evaluate  # noqa: E402
from harness.problems import get_registry  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--problem", default="level2/30")
    ap.add_argument("--submission", type=Path, default=REPO / "tests/fixtures/submissions/l30_cpp_correct.py")
    ap.add_argument("--size", default="small")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kh-overlap-"))
    settings = Settings(data_dir=root, scratch_dir=root / "scratch")
    spec = get_registry().get(args.problem)
    text = args.submission.read_text()
    target = probe_device(args.device, settings)
    first = evaluate(spec, text, EvalOptions(device=args.device, size=args.size), settings)  # builds once
    print(f"{args.problem} {args.submission.name} on {target.device} ({target.device_name}), size {args.size}, "
          f"torch {target.torch_version}; first evaluation (build included) {first.provenance.wall_s:.1f} s")
    modes = {"after the probe (harness eval)": None, "with the slot's target (worker)": target}
    walls: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, tgt in modes.items():
            r = evaluate(spec, text, EvalOptions(device=args.device, size=args.size, target=tgt), settings)
            if r.verdict.value != "passed":
                print(f"{name}: {r.verdict.value}: {r.message}", file=sys.stderr)
                return 1
            walls[name].append(r.provenance.wall_s)
    for name, w in walls.items():
        print(f"candidate started {name:<33} median {statistics.median(w):.2f} s   runs "
              + " ".join(f"{x:.2f}" for x in w))
    return 0


if __name__ == "__main__":
    sys.exit(main())
