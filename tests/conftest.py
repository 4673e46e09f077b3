from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.config import Settings
from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems import get_registry
from harness.schema import EvalResult

FIXTURES = Path(__file__).parent / "fixtures"
SUBMISSIONS = FIXTURES / "submissions"


@functools.cache
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_generate_tests(metafunc):
    """A test marked `both_databases` runs once on SQLite and once on PostgreSQL (see `database_url`)."""
    if metafunc.definition.get_closest_marker("both_databases") and "database_url" in metafunc.fixturenames:
        metafunc.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)


def _evaluates_a_build(item) -> bool:
    """Whether a test evaluates a source with a load_inline build, by its parameters (a fixture path, a corpus
    entry) or its file (the reference solutions)."""
    if "reference_solutions" in str(item.path):
        return True
    for value in getattr(getattr(item, "callspec", None), "params", {}).values():
        rel = getattr(value, "fixture", value)
        path = FIXTURES.parent.parent / rel if isinstance(rel, str) and rel.endswith(".py") else None
        if path is not None and path.is_file() and "load_inline" in path.read_text(errors="replace"):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        # One evaluation at a time, the GPU suite's first stage runs beside the builds of every load_inline source
        # (scripts/gpu-suite.sh): those that need no build go first, so that the GPU does not wait for a compiler.
        # In its parallel stage the long tests go first: started last, one of them would end the stage alone.
        items.sort(key=lambda item: ("alone" in item.keywords and _evaluates_a_build(item),
                                     "long" not in item.keywords))
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def required_capabilities() -> set[str]:
    """What this run must not skip: HARNESS_TEST_REQUIRE=browser,postgres (CI sets it, see .ci/run)."""
    return {c.strip() for c in os.environ.get("HARNESS_TEST_REQUIRE", "").split(",") if c.strip()}


def skip_or_fail(capability: str, reason: str):
    """Skip a test whose system dependency is missing, unless the run requires that capability."""
    if capability in required_capabilities():
        pytest.fail(f"HARNESS_TEST_REQUIRE names {capability!r} but {reason}", pytrace=False)
    pytest.skip(reason)


def import_psycopg():
    """psycopg, a core dependency, absent only on a GPU host that runs the gpu tests beside a preinstalled
    torch: there a module that needs it is skipped; where PostgreSQL is required (CI) its absence fails."""
    try:
        import psycopg
    except ImportError:
        if "postgres" in required_capabilities():
            raise
        pytest.skip("psycopg is not installed", allow_module_level=True)
    return psycopg


@pytest.fixture(scope="session")
def settings(tmp_path_factory) -> Settings:
    """A private data dir (build cache, job logs) and quick CPU timing for the whole session. HARNESS_TEST_DATA_DIR
    names a shared one instead: the GPU suite's stages and parallel workers then find the CUDA sources it built
    beforehand (scripts/build_cuda_sources.py)."""
    shared = os.environ.get("HARNESS_TEST_DATA_DIR")
    root = Path(shared) if shared else tmp_path_factory.mktemp("harness-data")
    root.mkdir(parents=True, exist_ok=True)
    return Settings(data_dir=root, scratch_dir=root / "scratch", timing_windows_cpu=3, window_ms_cpu=20.0,
                    window_fixed_cost_factor=0, correctness_trials=5, kill_grace_s=2.0)


class GpuSlot:
    """The gpu tests' slot, as a worker's (harness/service/worker.py): its probed target, one pool of warm trusted
    processes (one per problem, `harness/evaluation/warm.py`), and the next test's candidate process started ahead, in
    that pool as a worker's is: the pool's idle processes are the slot's own, not other processes' GPU work
    (`gpu_sharing`), so a pool per problem would make every other problem's warm process a stranger. The tests
    that run one at a time (the GPU suite's stage "alone") then pay each reference's start, probe and build once per
    problem and each candidate's start beside the test before it, not in turn; and they test the path a worker
    takes."""

    def __init__(self, settings: Settings, device: str = "cuda"):
        self.settings, self.device = settings, device
        self._pool: Any = None
        self._target = None

    def target(self):
        if self._target is None:
            from harness.evaluation.prebuild import probe_device

            self._target = probe_device(self.device, self.settings)
        return self._target

    def options(self, spec, **options) -> EvalOptions:
        from harness.evaluation.warm import TrustedPool

        if self._pool is None:
            self._pool = TrustedPool(self.settings)
        return EvalOptions(device=self.device, target=self.target(), trusted_pool=self._pool, **options)

    def evaluate(self, spec, text: str, **options) -> EvalResult:
        return evaluate(spec, text, self.options(spec, **options), self.settings)

    def start_ahead(self, item) -> bool:
        """Start the candidate process of `item`'s evaluation (see `evaluates`), if it is a gpu test that declares
        one: it imports torch while this test evaluates, and `item` takes it (starts.prestart)."""
        plan = planned_evaluation(item) if item is not None and "gpu" in item.keywords else None
        if plan is None:
            return False
        from harness.evaluation import starts

        spec, text, options = plan
        return starts.prestart(spec, text, self.options(spec, **options), self.settings)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def evaluates(plan: Callable[..., tuple[Any, str, dict[str, Any]]]):
    """Declares the one evaluation a gpu test makes on the session's slot: `plan(**its parameters)` gives the
    problem's spec, the submission's text and the evaluation's options (besides device, target and pool). The test
    takes the result as the fixture `evaluated`; the test before it starts its candidate's process ahead."""

    def mark(test):
        test.evaluation_plan = plan
        return test

    return mark


def planned_evaluation(item) -> tuple[Any, str, dict[str, Any]] | None:
    plan = getattr(getattr(item, "function", None), "evaluation_plan", None)
    if plan is None:
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    names = inspect.signature(plan).parameters
    return plan(**{k: v for k, v in params.items() if k in names})


_NEXT_ITEM = pytest.StashKey[Any]()
_STARTED_AHEAD = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_NEXT_ITEM] = nextitem  # the test this process runs next, if known (None where it is the last)


@pytest.fixture(scope="session")
def gpu_slot(settings):
    slot = GpuSlot(settings)
    yield slot
    slot.close()


@pytest.fixture
def evaluated(request, gpu_slot) -> EvalResult:
    """This test's evaluation (declared with `evaluates`) on the session's GPU slot, the next test's candidate
    started ahead beside it."""
    plan = planned_evaluation(request.node)
    assert plan is not None, f"{request.node.name} uses `evaluated` but declares no evaluation (@evaluates)"
    nextitem = request.node.stash.get(_NEXT_ITEM, None)
    if gpu_slot.start_ahead(nextitem):
        nextitem.stash[_STARTED_AHEAD] = True
    spec, text, options = plan
    r = gpu_slot.evaluate(spec, text, **options)
    if request.node.stash.get(_STARTED_AHEAD, False):  # the path a worker takes: it must be taken here
        assert r.observations.candidate_ahead, "the candidate's process started ahead for this test was not used"
    return r


@pytest.fixture(scope="session")
def registry():
    return get_registry()


@pytest.fixture(scope="session")
def run_fixture(settings, registry):
    """Evaluate tests/fixtures/submissions/<name> against a problem on the CPU at the small size."""

    def run(problem: str, name: str, **options) -> EvalResult:
        options.setdefault("device", "cpu")
        options.setdefault("size", "small")
        text = (SUBMISSIONS / name).read_text()
        return evaluate(registry.get(problem), text, EvalOptions(**options), settings)

    return run


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the session: HARNESS_TEST_POSTGRES_URL's, or a throwaway one started here."""
    from .postgres_server import PostgresServer, find_bindir  # psycopg only where PostgreSQL is tested

    url = os.environ.get("HARNESS_TEST_POSTGRES_URL")
    if url:
        yield PostgresServer(url)
        return
    bindir = find_bindir()
    if bindir is None:
        skip_or_fail("postgres", "PostgreSQL's server (initdb, pg_ctl) is not installed: "
                     "bash scripts/ci-system-deps.sh installs it")
    server = PostgresServer.start(bindir)
    yield server
    server.stop()


@pytest.fixture
def database_url(request) -> str | None:
    """The database a test's settings name: None is the SQLite file in its data dir. Under `both_databases`
    the PostgreSQL run gets a fresh, empty database of the session's server."""
    return database_for(request, getattr(request, "param", "sqlite"))


def database_for(request, backend: str) -> str | None:
    return None if backend == "sqlite" else request.getfixturevalue("postgres").create_database()
