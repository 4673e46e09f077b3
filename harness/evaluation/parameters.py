"""The reference's parameters, drawn fresh for each evaluation, and how they reach the candidate's model.

Every problem's reference is built with its layers' default initialisation, so GroupNorm's weight is always
1 and its bias 0, and a kernel that drops the affine step would pass. So the trusted side draws the
reference's tensors anew after building it (`draw_fresh`), with each tensor's own scale and sign kept, and
the candidate's model receives them (`match`): by name first (the reference's own layout), then, for
what is left, among tensors of one shape and dtype, by the last part of the name and its usual aliases (an
honest kernel that calls GroupNorm's weight `gamma` still gets it), then in order. A problem spec can keep a
tensor at its own initialisation (`ProblemSpec.fixed_parameters`) where its domain matters.

Imported by both children: the trusted side draws, the candidate's process copies (what it says it copied
is its own claim; its outputs are judged either way).
"""

from __future__ import annotations

import torch

BIAS_SCALE = 0.1  # the spread given to an all-zero parameter (a bias): it has no scale of its own to keep
LOG_SPREAD = 0.5  # the spread of the log-normal factor for tensors of one sign (weights of 1, variances)


def draw_fresh(model: torch.nn.Module, seed: int, fixed: list[str]) -> list[str]:
    """Redraw the model's floating-point parameters and buffers in place; the names drawn.

    Parameters: a tensor of one sign is scaled element-wise by a log-normal factor (1 stays positive, -1
    negative); a mixed-sign tensor is redrawn normally with its own mean and standard deviation (Linear's
    uniform weights keep their scale); an all-zero one (a bias) gets normal values of spread BIAS_SCALE.
    Buffers (running statistics, masks, tables) only get the log-normal factor, so zeros stay zero and
    signs stay: a mask keeps its pattern, a running variance stays positive. Names in `fixed`, or under a
    prefix `name.` there, keep the problem's own values."""
    generators: dict[torch.device, torch.Generator] = {}  # drawn where each tensor lives: on a GPU, not the host
    params = {name for name, _ in model.named_parameters()}
    drawn = []
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if torch.nn.parameter.is_lazy(t) or not t.is_floating_point() or t.numel() == 0 or _is_fixed(name, fixed):
                continue  # a lazy module's tensors have no values yet
            if t.device not in generators:
                generators[t.device] = torch.Generator(t.device).manual_seed(seed)
            t.copy_(_fresh(t.detach(), generators[t.device], parameter=name in params))
            drawn.append(name)
    return drawn


def _is_fixed(name: str, fixed: list[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in fixed)


def _fresh(t: torch.Tensor, g: torch.Generator, *, parameter: bool) -> torch.Tensor:
    x = t.to(torch.float64)
    noise = torch.randn(x.shape, generator=g, dtype=torch.float64, device=x.device)
    one_sign = bool((x > 0).all() or (x < 0).all())
    if not parameter or one_sign:
        out = x * torch.exp(LOG_SPREAD * noise)
    elif not bool((x != 0).any()):
        out = BIAS_SCALE * noise
    else:
        std = float(x.std()) if x.numel() > 1 else abs(float(x.mean()))
        out = float(x.mean()) + (std or BIAS_SCALE) * noise
    return out.to(t.dtype)


# Leaf names a rewritten model commonly gives a layer's weight and bias (GroupNorm's as gamma and beta).
_ALIASES = ({"weight", "gamma", "scale", "alpha", "w", "g"}, {"bias", "beta", "shift", "b"})


def match(own: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, str]:
    """Which reference tensor each of the candidate's state entries receives: {candidate name: reference name}.

    Only between tensors of one shape and dtype, in passes, each in the reference's order, each taking the first
    candidate tensor left that it allows: the same name; the same last name part (`gemm.weight` and `fc.weight`);
    a last part of the same kind (`group_norm.weight` and `gamma`, `gn_beta` for a bias); then any, in state-dict
    order. A model that renames both of two equal-shaped tensors to names none of these tell apart can be given
    them swapped: its answer is then wrong, and the verdict shows the pairing (`by_position`)."""
    pairs: dict[str, str] = {}
    tests = (lambda o, r: o == r, lambda o, r: _leaf(o) == _leaf(r), _alike, lambda o, r: True)
    for same in tests:
        for ref_name, ref_t in reference.items():
            if ref_name in pairs.values():
                continue
            for name, t in own.items():
                if name not in pairs and _same_kind(t, ref_t) and same(name, ref_name):
                    pairs[name] = ref_name
                    break
    return pairs


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _alike(own_name: str, ref_name: str) -> bool:
    """The last parts name the same kind of tensor: one is a weight (or bias) and the other has a part that is."""
    tokens = set(_leaf(own_name).lower().split("_"))
    return any(_leaf(ref_name) in group and tokens & group for group in _ALIASES)


def _same_kind(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype
