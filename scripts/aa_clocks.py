"""Where an A/A ratio comes from: each problem of a selfcheck report, its candidate's and eager's windows side by side.

    python3 scripts/aa_clocks.py REPORT.json [--copy DIR]

For each row whose job dir still holds result.json (else the clocks the report's row keeps): the A/A, then per kind
(candidate, eager) the parent's time per call, the process's own CUDA-event time per call (the calls alone), its
time making inputs per call, the empty window per call, the round trip, and the spread over windows. A ratio that is
off on the parent's clock but not on the device's points at what surrounds the calls (inputs, waking, the round
trip); one off on both, at the calls. With --copy, each job's result.json and logs are copied to DIR/<problem>/ (to
keep a run's evidence).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def describe(problem: str, result: dict) -> list[str]:
    obs = result.get("observations") or {}
    rows = [f"{problem}: {result.get('verdict')} A/A {_f(result.get('speedup_vs_eager'), 3)} "
            f"flags {[f.get('check') for f in result.get('flags') or []]}"]
    kinds = {k: obs.get(f"{k}_timing") for k in ("candidate", "eager")}
    for kind, t in kinds.items():
        if not t:
            continue
        windows = t.get("windows_ms") or []
        rows.append(
            f"  {kind:<9} parent {_f(t.get('median_ms'))} device {_f(t.get('device_median_ms'))} inputs "
            f"{_f(t.get('inputs_median_ms'))} empty {_f(t.get('overhead_ms'))} rt {_f(t.get('round_trip_ms'), 3)} "
            f"spread {_f(t.get('spread'), 3)} calls {t.get('calls_per_window')} n {t.get('n')} "
            f"window median {_f(statistics.median(windows) if windows else None, 2)}")
    c, e = kinds["candidate"], kinds["eager"]
    if c and e:
        ratios = []
        for key in ("median_ms", "device_median_ms", "inputs_median_ms"):
            a, b = c.get(key), e.get(key)
            ratios.append(f"{key.removesuffix('_ms')} {b / a:.3f}" if a and b else f"{key} -")
        rows.append("  eager/candidate: " + ", ".join(ratios))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--copy", type=Path)
    args = ap.parse_args()
    report = json.loads(args.report.read_text())
    for row in report.get("rows", []):
        job = Path(row["job_dir"]) if row.get("job_dir") else None
        if job is None or not (job / "result.json").is_file():
            if row.get("clocks"):  # the report's own copy of the clocks (no window list: "window median -")
                flags = [{"check": f} for f in row.get("flags") or []]
                print("\n".join(describe(row["problem"], {
                    "verdict": row["verdict"], "speedup_vs_eager": row.get("speedup_vs_eager"), "flags": flags,
                    "observations": {f"{k}_timing": v for k, v in row["clocks"].items()}})))
            else:
                print(f"{row['problem']}: {row['verdict']} (no job dir) {row.get('message', '')[:200]}")
            continue
        print("\n".join(describe(row["problem"], json.loads((job / "result.json").read_text()))))
        if args.copy is not None:
            dest = args.copy / row["problem"].replace("/", "-")
            dest.mkdir(parents=True, exist_ok=True)
            for f in job.iterdir():
                if f.is_file() and f.suffix in (".json", ".log") and f.stat().st_size < (4 << 20):
                    shutil.copy(f, dest / f.name)


if __name__ == "__main__":
    main()
