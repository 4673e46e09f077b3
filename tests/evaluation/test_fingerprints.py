"""Fingerprints of timed outputs (timing.fingerprints, timing.fingerprint_scales, windows.fingerprint_mismatches):
what binds every output of a timed window to that window. On the CPU, with the module's own functions."""

from __future__ import annotations

import pytest
import torch

from harness.evaluation import timing, windows

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


def test_outputs_larger_than_a_slice_are_fingerprinted_in_slices_and_still_tell_right_from_wrong(monkeypatch):
    """KernelBench's level1 files at their own sizes hand back outputs of gigabytes: their fingerprints go a slice
    of columns at a time (and small outputs many calls at a time), both sides in the same order."""
    reference = _outputs(4)
    whole = timing.fingerprint_scales(reference, ATOL, RTOL)
    monkeypatch.setattr(timing, "FINGERPRINT_CHUNK_BYTES", 8 * 100)  # 100 elements: a 32 x 64 output in 21 slices
    assert [row[0] for row in timing.fingerprint_scales(reference, ATOL, RTOL)] == \
        pytest.approx([row[0] for row in whole], rel=1e-12)
    assert timing.fingerprints(reference, 3, CPU) == timing.fingerprints([r.clone() for r in reference], 3, CPU)
    near = [r + 0.5 * (ATOL + RTOL * r.abs()) for r in reference]
    assert _mismatches(near, reference) == []
    wrong = [r.clone() for r in reference]
    wrong[1][31, 63] += 1.0  # the last slice's last element
    assert [f.split(":")[0] for f in _mismatches(wrong, reference)] == ["timed call 1 output 0"]


def test_errors_alike_in_every_call_are_drawn_against_anew(monkeypatch):
    """The draws are new for every call: an error the same in every call (a bias added in another order) gives
    fingerprint errors that do not move together."""
    reference = _outputs(8, (16, 16))
    shifted = [r + 0.9 * ATOL for r in reference]
    got, ref = timing.fingerprints(shifted, 4, CPU), timing.fingerprints(reference, 4, CPU)
    diffs = [g[0] - r[0] for g, r in zip(got, ref, strict=True)]
    assert len({round(d, 12) for d in diffs}) > 1 and min(diffs) < 0 < max(diffs)
    # The same output in every call is fingerprinted against other signs in every call.
    same = timing.fingerprints([reference[0].clone() for _ in range(8)], 4, CPU)
    assert len({row[0] for row in same}) == 8


def test_the_signs_are_fair_at_every_byte_of_a_random_word():
    """Each sign is a random byte's top bit. torch's plain `random_()` on int64 never sets a word's top bit, which
    would make every eighth sign +1: an error there would move the fingerprint alike in every call."""
    negative = timing._random_signs((1, 80_000), torch.Generator().manual_seed(0), CPU).reshape(-1, 8).double()
    assert negative.mean(dim=0).sub(0.5).abs().max() < 0.02


def test_an_output_that_is_not_floating_point_is_fingerprinted_as_float64():
    """Integer and bool outputs (argmax, a mask) are counted as float64, as every output was before the signs."""
    a = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([True, False, True])]
    b = [t.double() for t in a]
    assert timing.fingerprints(a, 2, CPU) == timing.fingerprints(b, 2, CPU)
    assert all(row[0] is not None for row in timing.fingerprints(a, 2, CPU))


def _deviation(got: list, reference: list, key: int) -> tuple[float, int]:
    return windows.fingerprint_deviation(timing.fingerprints(got, key, CPU), timing.fingerprints(reference, key, CPU),
                                         timing.fingerprint_scales(reference, ATOL, RTOL))


@pytest.mark.parametrize(("factor", "caught"), [(0.95, False), (2.0, True)])
def test_outputs_a_little_outside_the_tolerance_pass_one_by_one_but_not_all_together(factor, caught):
    """A window computed at a lower precision whose error is twice the tolerance at every element: each output's
    fingerprint is off by about two scales (inside the six allowed, one output at a time), but over an evaluation's
    15 windows the squares add up past what outputs within the tolerance reach; at 95% of the tolerance, not."""
    from harness.grading import fingerprint_deviation_bound

    total, terms, single = 0.0, 0, []
    for window in range(15):
        reference = _outputs(19, (8, 32), seed=window)
        gen = torch.Generator().manual_seed(100 + window)
        got = [r + factor * (ATOL + RTOL * r.abs()) * torch.randint(0, 2, r.shape, generator=gen).mul(2).sub(1)
               for r in reference]
        single += _mismatches(got, reference, key=window)
        deviation, n = _deviation(got, reference, key=window)
        total, terms = total + deviation, terms + n
    assert terms == 15 * 19 and (total > fingerprint_deviation_bound(terms)) == caught
    assert len(single) < 3  # one output at a time, hardly any is beyond six scales
