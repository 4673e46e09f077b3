"""Fresh reference parameters and how they reach the candidate (harness/evaluation/parameters.py), in process."""

from __future__ import annotations

import torch
import torch.nn as nn

from harness.evaluation import parameters


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.gemm = nn.Linear(64, 32)
        self.group_norm = nn.GroupNorm(4, 32)
        self.bn = nn.BatchNorm1d(32)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)))


def test_every_floating_tensor_is_drawn_anew_keeping_its_scale_and_sign():
    torch.manual_seed(0)
    net, before = _Net(), {k: v.clone() for k, v in _Net().state_dict().items()}
    torch.manual_seed(0)
    net = _Net()
    drawn = parameters.draw_fresh(net, seed=7, fixed=[])
    sd = net.state_dict()
    assert "bn.num_batches_tracked" not in drawn and torch.equal(sd["bn.num_batches_tracked"],
                                                                  before["bn.num_batches_tracked"])
    for name in ("group_norm.weight", "group_norm.bias", "gemm.weight", "gemm.bias", "bn.running_var", "mask"):
        assert name in drawn and not torch.equal(sd[name], before[name]), name
    assert (sd["group_norm.weight"] > 0).all()  # ones: a positive scale, log-normally spread
    assert sd["group_norm.bias"].abs().max() > 1e-3  # zeros: a bias of spread BIAS_SCALE
    w, w0 = sd["gemm.weight"], before["gemm.weight"]
    assert 0.8 < float(w.std() / w0.std()) < 1.25  # Linear's scale kept
    assert (sd["bn.running_var"] > 0).all()  # a variance stays a variance
    assert torch.equal(sd["mask"] == 0, before["mask"] == 0)  # a buffer's zeros stay: a mask keeps its pattern


def test_draws_follow_the_seed_and_a_spec_can_keep_tensors_as_the_problem_makes_them():
    a, b, c = _Net(), _Net(), _Net()
    for net in (a, b, c):
        net.load_state_dict(a.state_dict())
    keep = b.state_dict()["bn.running_var"].clone()
    parameters.draw_fresh(a, seed=3, fixed=[])
    drawn = parameters.draw_fresh(b, seed=3, fixed=["bn"])
    assert torch.equal(a.state_dict()["gemm.weight"], b.state_dict()["gemm.weight"])
    assert not any(n.startswith("bn.") for n in drawn) and torch.equal(b.state_dict()["bn.running_var"], keep)
    parameters.draw_fresh(c, seed=4, fixed=[])
    assert not torch.equal(a.state_dict()["gemm.weight"], c.state_dict()["gemm.weight"])


def test_the_candidate_receives_by_name_then_by_likeness_of_name_among_tensors_of_one_shape():
    ref = {"gemm.weight": torch.zeros(32, 64), "gemm.bias": torch.zeros(32), "group_norm.weight": torch.zeros(32),
           "group_norm.bias": torch.zeros(32), "scale": torch.zeros(1)}
    # As state_dict() lists them: a module's own parameters before its submodules'.
    own = {"gamma": torch.zeros(32), "gn_beta": torch.zeros(32), "scale": torch.zeros(1),
           "w_t": torch.zeros(64, 32), "fc.weight": torch.zeros(32, 64), "fc.bias": torch.zeros(32)}
    assert parameters.match(own, ref) == {"scale": "scale", "fc.weight": "gemm.weight", "fc.bias": "gemm.bias",
                                          "gamma": "group_norm.weight", "gn_beta": "group_norm.bias"}
    # Nothing alike: state-dict order. Another shape or dtype never.
    assert parameters.match({"p": torch.zeros(4), "q": torch.zeros(4)}, {"x": torch.zeros(4), "y": torch.zeros(4)}) \
        == {"p": "x", "q": "y"}
    assert parameters.match({"w": torch.zeros(3, dtype=torch.float64)}, {"v": torch.zeros(3)}) == {}
    assert parameters.match({"b": torch.zeros(4), "a": torch.zeros(2, 2)},
                            {"x": torch.zeros(2, 2), "y": torch.zeros(4)}) == {"a": "x", "b": "y"}


def test_a_lazy_modules_uninitialised_tensors_are_left_alone():
    net = nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 2))
    assert parameters.draw_fresh(net, seed=1, fixed=[]) == ["1.weight", "1.bias"]
