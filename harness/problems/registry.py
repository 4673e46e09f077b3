"""Find problems by slug, KernelBench id or file stem; suggest near names for typos."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path

from harness.problems.catalog import builtin_problems
from harness.problems.spec import ProblemSpec, model_init_arg_names

_KB_FILE = re.compile(r"^(\d+)_(\w+)\.py$")
_LEVEL_DIR = re.compile(r"^level(\d+)$")


class UnknownProblem(KeyError):
    def __init__(self, name: str, suggestions: list[str], why: str = ""):
        self.name = name
        self.suggestions = suggestions
        hint = f"; did you mean: {', '.join(suggestions)}" if suggestions else ""
        super().__init__(f"unknown problem {name!r}{f' ({why})' if why else ''}{hint}")

    def __str__(self) -> str:
        return self.args[0]


def _is_subsequence(short: str, long: str) -> bool:
    it = iter(long)
    return all(ch in it for ch in short)


def load_kernelbench_dir(path: Path) -> list[ProblemSpec]:
    """Problems from a KernelBench-format folder: `level2/` itself or a folder holding `levelN/` folders.

    Nothing is imported here: the files are read as text. Ids are `levelN/<number>`; a folder not
    named `levelN` gives ids `<folder name>/<number>`.
    """
    path = Path(path).expanduser().resolve()  # children run elsewhere: a relative path would not reach them
    if not path.is_dir():
        raise FileNotFoundError(f"problems folder {str(path)!r} does not exist or is not a folder")
    folders = [path] if not any(_LEVEL_DIR.match(p.name) for p in path.iterdir() if p.is_dir()) else sorted(
        p for p in path.iterdir() if p.is_dir() and _LEVEL_DIR.match(p.name)
    )
    specs: list[ProblemSpec] = []
    for folder in folders:
        for file in sorted(folder.glob("*.py")):
            m = _KB_FILE.match(file.name)
            if not m:
                continue
            kb_id = f"{folder.name}/{int(m.group(1))}"
            specs.append(_spec_of_file(file, kb_id, kb_id))
    return specs


def _spec_of_file(file: Path, problem_id: str, kernelbench_id: str | None) -> ProblemSpec:
    try:
        arg_names = model_init_arg_names(file.read_text())
    except SyntaxError:
        arg_names = []
    return ProblemSpec(id=problem_id, kernelbench_id=kernelbench_id, name=file.stem, source_path=file,
                       init_arg_names=arg_names)


def load_problem_file(path: Path) -> ProblemSpec:
    """One KernelBench-format problem file given by its path. `level1/1_Add.py` gets the id `level1/1` (its
    KernelBench id), as from its folder; any other file is known by its stem."""
    file = Path(path).expanduser().resolve()
    m = _KB_FILE.match(file.name)
    kb_id = f"{file.parent.name}/{int(m.group(1))}" if m and _LEVEL_DIR.match(file.parent.name) else None
    return _spec_of_file(file, kb_id or file.stem, kb_id)


class Registry:
    def __init__(self, specs: Iterable[ProblemSpec]):
        self._specs: list[ProblemSpec] = []
        self._by_alias: dict[str, ProblemSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ProblemSpec) -> None:
        """Later additions win on alias clashes: an explicitly given folder overrides the built-ins."""
        self._specs = [s for s in self._specs if s.id != spec.id]
        self._specs.append(spec)
        for alias in spec.aliases:
            self._by_alias[alias.lower()] = spec

    def all(self) -> list[ProblemSpec]:
        return list(self._specs)

    def get(self, name: str) -> ProblemSpec:
        spec = self._by_alias.get(name.strip().lower())
        if spec is None:
            raise UnknownProblem(name, self.suggest(name))
        return spec

    def suggest(self, name: str, n: int = 3) -> list[str]:
        lowered = sorted({a.lower() for s in self._specs for a in s.aliases})
        close = difflib.get_close_matches(name.lower(), lowered, n=3 * n, cutoff=0.5)
        if not close:  # abbreviations such as "gemm_gn": every word a subsequence of some alias word
            words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
            hits = [a for a in lowered if words and all(
                any(_is_subsequence(w, aw) for aw in re.split(r"[^a-z0-9]+", a)) for w in words)]
            close = sorted(hits, key=lambda a: -difflib.SequenceMatcher(None, name.lower(), a).ratio())
        shown: list[str] = []  # one entry per problem: its id, with its KernelBench id beside it
        for alias in close:
            spec = self._by_alias[alias]
            label = spec.id if spec.kernelbench_id in (None, spec.id) else f"{spec.id} ({spec.kernelbench_id})"
            if label not in shown:
                shown.append(label)
        return shown[:n]


def get_registry(problems_dir: Path | None = None) -> Registry:
    registry = Registry(builtin_problems())
    if problems_dir is not None:
        for spec in load_kernelbench_dir(problems_dir):
            registry.add(spec)
    return registry


def find_problem(registry: Registry, name: str) -> ProblemSpec:
    """A problem by id, KernelBench id or stem, or by the path of its file (`-p myprob/level1/1_Add.py`).

    For the command line only: a server never reads a path its client names (the API uses `Registry.get`)."""
    try:
        return registry.get(name)
    except UnknownProblem:
        if not name.strip().endswith(".py"):
            raise
    file = Path(name.strip()).expanduser()
    if not file.is_file():
        raise UnknownProblem(name, [], f"no such file: {file.resolve()}")
    return load_problem_file(file)
