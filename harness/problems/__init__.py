"""Problem specs: KernelBench-format model files plus the metadata the harness needs."""

from harness.problems.registry import (
    Registry,
    UnknownProblem,
    find_problem,
    get_registry,
    load_kernelbench_dir,
    load_problem_file,
)
from harness.problems.spec import DEFAULT_TOLERANCE, V01_TOLERANCE, ProblemSpec, SizeVariant

__all__ = [
    "DEFAULT_TOLERANCE",
    "V01_TOLERANCE",
    "ProblemSpec",
    "Registry",
    "SizeVariant",
    "UnknownProblem",
    "find_problem",
    "get_registry",
    "load_kernelbench_dir",
    "load_problem_file",
]
