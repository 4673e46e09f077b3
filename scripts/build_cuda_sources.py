#!/usr/bin/env python3
"""Build every load_inline source the GPU tests evaluate, all at once, into the build cache they share.

    HARNESS_TEST_DATA_DIR=/tmp/kh-data python3 scripts/build_cuda_sources.py

The reference solutions (both designs) and the CUDA fixtures each take a minute of nvcc; built one after another
inside their evaluations, they leave the GPU idle for most of a suite run. Here they build side by side, one per
core, into the build dirs their evaluations on this GPU will find (prebuild.precompile), and the suite's evaluations
only load them.
A source that fails to build here builds (and fails) again in its own evaluation: nothing is decided here.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import Settings  # noqa: E402
from harness.evaluation.prebuild import precompile_all, probe_device  # noqa: E402


def sources() -> list[Path]:
    found = [*sorted((ROOT / "reference_solutions").rglob("*.py")),
             *sorted((ROOT / "tests" / "fixtures").rglob("*.py"))]
    return [p for p in found if "load_inline" in p.read_text(errors="replace")]


def main() -> int:
    data_dir = os.environ.get("HARNESS_TEST_DATA_DIR")
    if not data_dir:
        print("set HARNESS_TEST_DATA_DIR: the build cache the GPU tests will use", file=sys.stderr)
        return 2
    settings = Settings(data_dir=Path(data_dir), scratch_dir=Path(data_dir) / "scratch")
    target = probe_device("cuda", settings)
    paths = sources()
    t0 = time.monotonic()
    results = list(zip(paths, precompile_all([p.read_text() for p in paths], target, settings), strict=True))
    built = sum(r.ok for _, r in results)
    print(f"built {built} of {len(paths)} load_inline sources in {time.monotonic() - t0:.0f} s "
          f"({sum(r.seconds for _, r in results):.0f} s of builds)")
    for p, r in results:
        if not r.ok:
            print(f"  not built here (builds in its evaluation): {p.relative_to(ROOT)}: {r.log_tail[-200:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
