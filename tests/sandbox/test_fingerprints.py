"""Fingerprints of timed outputs (timing.fingerprints, timing.fingerprint_scales, windows.fingerprint_mismatches):
what binds every output of a timed window to that window. On the CPU, with the module's own functions."""

from __future__ import annotations

import pytest
import torch

from harness.sandbox import timing, windows

CPU = torch.device("cpu")
ATOL = RTOL = 1e-4


def _outputs(n: int = 6, shape: tuple[int, ...] = (32, 64), seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(n)]


def _mismatches(got: list, reference: list, key: int = 11) -> list[str]:
    return windows.fingerprint_mismatches(0, len(reference), timing.fingerprints(got, key, CPU),
                                          timing.fingerprints(reference, key, CPU),
                                          timing.fingerprint_scales(reference, ATOL, RTOL))


def test_the_same_outputs_under_the_same_key_give_the_same_numbers_and_another_key_others():
    outs = _outputs()
    a, b = timing.fingerprints(outs, 5, CPU), timing.fingerprints([o.clone() for o in outs], 5, CPU)
    assert a == b and len(a) == 6 and all(len(row) == 1 and row[0] is not None for row in a)
    assert timing.fingerprints(outs, 6, CPU) != a


def test_outputs_within_the_tolerance_match_under_any_key():
    """An honest kernel's outputs differ from the reference's within the tolerance, here by up to 90% of it at
    every element, signs at random: off by at most one scale's standard deviation, far inside the six allowed."""
    reference = _outputs()
    gen = torch.Generator().manual_seed(1)
    honest = [r + 0.9 * (ATOL + RTOL * r.abs()) * torch.randint(0, 2, r.shape, generator=gen).mul(2).sub(1)
              for r in reference]
    for key in range(40):
        assert _mismatches(honest, reference, key) == []


@pytest.mark.parametrize("wrong", ["bf16", "one element", "zeros", "one call"])
def test_wrong_outputs_do_not_match(wrong):
    reference = _outputs()
    got = [r.clone() for r in reference]
    if wrong == "bf16":  # a precision downgrade once timed: 0.4% off everywhere
        got = [r.bfloat16().float() for r in reference]
    elif wrong == "one element":
        got[2][5, 7] += 1.0
    elif wrong == "zeros":
        got = [torch.zeros_like(r) for r in reference]
    else:  # a call computed on other inputs (a cache keyed on the wrong thing)
        got[4] = _outputs(seed=9)[0]
    found = _mismatches(got, reference)
    assert found and all("fingerprint" in f for f in found)
    if wrong in ("one element", "one call"):
        assert len(found) == 1 and found[0].startswith(f"timed call {2 if wrong == 'one element' else 4} output 0")


def test_tuple_outputs_other_structures_and_non_finite_values():
    reference = [(r, r.sum(dim=1)) for r in _outputs(3)]
    assert _mismatches([(a.clone(), b.clone()) for a, b in reference], reference) == []
    found = _mismatches([a.clone() for a, _ in reference], reference)  # one tensor where the reference has two
    assert len(found) == 3 and "1 output tensor(s) fingerprinted, the reference has 2" in found[0]
    assert timing.fingerprints(["not a tensor", (torch.ones(3), 4)], 1, CPU)[0] == [None]
    assert timing.fingerprints([(torch.ones(3), 4)], 1, CPU)[0][1] is None
    nan_reference = [torch.tensor([1.0, float("nan")])]  # a reference with NaN decides nothing by its fingerprint
    assert timing.fingerprint_scales(nan_reference, ATOL, RTOL) == [[None]]
    assert _mismatches([torch.tensor([5.0, 5.0])], nan_reference) == []
    assert _mismatches([torch.tensor([1.0, float("nan")])], [torch.tensor([1.0, 2.0])])  # NaN where it is finite
    assert windows.fingerprint_mismatches(3, 2, [[1.0]], [[1.0], [2.0]], [[0.1], [0.1]]) == \
        ["window 3: 1 fingerprints for 2 calls"]
    assert windows.fingerprint_mismatches(3, 2, [[1.0], [float("nan")]], [[1.0], [2.0]], [[0.1], [0.1]]) == \
        ["timed call 7 output 0: fingerprint nan where the reference's is 2 (within 0.6 for an output within the "
         "tolerance)"]


def test_many_outputs_fingerprinted_a_few_at_a_time_give_the_numbers_of_one_product(monkeypatch):
    outs = _outputs(7, (16, 16))
    whole = timing.fingerprints(outs, 3, CPU)
    monkeypatch.setattr(timing, "FINGERPRINT_CHUNK_BYTES", 3 * 16 * 16 * 8)  # three outputs at a time
    chunked = timing.fingerprints(outs, 3, CPU)
    assert [row[0] for row in chunked] == pytest.approx([row[0] for row in whole], rel=1e-12)
