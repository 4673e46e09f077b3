"""/api/problems: what can be submitted to, with reference source, sizes, tolerance, baseline times."""

from __future__ import annotations

from fastapi import APIRouter

from harness.api.deps import RegistryDep, SessionDep
from harness.api.routes.submissions import find_problem
from harness.api.schemas import ErrorBody, ProblemDetail, ProblemPublic
from harness.api.views import problem_public
from harness.db import queries
from harness.problems.spec import module_constants

router = APIRouter(prefix="/api/problems", tags=["problems"])


@router.get("", response_model=list[ProblemPublic])
def list_problems(registry: RegistryDep) -> list[ProblemPublic]:
    return [problem_public(spec) for spec in registry.all()]


# `path` lets ids with a slash (level2/75) be given as they are.
@router.get("/{problem:path}", response_model=ProblemDetail, responses={404: {"model": ErrorBody}})
def get_problem(problem: str, registry: RegistryDep, session: SessionDep) -> ProblemDetail:
    spec = find_problem(registry, problem)
    source = spec.source()
    try:
        constants = module_constants(source)
    except SyntaxError:
        constants = {}
    return ProblemDetail(**problem_public(spec).model_dump(), source=source, constants=constants,
                         baseline_times=queries.baseline_times(session, spec.id, spec.version),
                         degenerate=queries.degenerate_at(session, spec.id, spec.version))
