"""Extraction of the code to evaluate from sources and raw LLM replies; static constructor checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.submission import InvalidSubmission, check_constructor, extract

from .conftest import FIXTURES, SUBMISSIONS

SEEDS = sorted((FIXTURES / "seeds").glob("*.txt"))


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.stem)
def test_every_truncated_seed_reply_is_invalid_with_a_reason(seed: Path):
    with pytest.raises(InvalidSubmission) as e:
        extract(seed.read_text())
    message = str(e.value)
    assert "ModelNew" in message or "no code found" in message
    assert len(SEEDS) == 5


def test_seed_with_only_cpp_blocks_names_their_language():
    with pytest.raises(InvalidSubmission, match=r"code blocks are: cpp"):
        extract((FIXTURES / "seeds" / "001_971e5b2359cfe71d.txt").read_text())


def test_seed_cut_off_before_any_code_says_no_code_found():
    with pytest.raises(InvalidSubmission, match="no code found"):
        extract((FIXTURES / "seeds" / "000_c9a2099a227291ba.txt").read_text())


def test_plain_python_source_is_taken_whole():
    text = (SUBMISSIONS / "l30_pytorch_correct.py").read_text()
    sub = extract(text)
    assert sub.source == text and not sub.from_reply


def test_reply_uses_the_last_block_that_defines_modelnew_not_the_first():
    sub = extract((SUBMISSIONS / "l30_reply_two_blocks.md").read_text())
    assert sub.from_reply
    assert "torch.clamp" in sub.source and "TODO" not in sub.source
    assert "model = ModelNew(8192" not in sub.source  # the later usage block defines no ModelNew


def test_reply_cut_off_inside_the_modelnew_block_is_invalid():
    text = "Here you go:\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
    with pytest.raises(InvalidSubmission, match="cut off"):
        extract(text)


def test_syntax_error_in_the_chosen_block_names_the_line():
    text = "```python\nclass ModelNew:\n    def forward(self x):\n        return x\n```\n"
    with pytest.raises(InvalidSubmission, match=r"syntax error .* line 2"):
        extract(text)


_MISSING_COLON = ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                  "    def forward(self, x)\n        return x\n")


def test_plain_source_with_a_syntax_error_names_the_line_not_missing_code_blocks():
    with pytest.raises(InvalidSubmission, match=r"syntax error .*at line 5: .*'def forward\(self, x\)'"):
        extract(_MISSING_COLON)


@pytest.mark.parametrize("text", [
    '"""My kernel."""\nimport torch\nx = (\n',  # opens with a docstring
    "# kernel.py\nfrom torch import nn\nclass ModelNew(nn.Module) pass\n",  # a comment, then imports
    "Here it is:\nimport torch\nclass ModelNew(torch.nn.Module):\n  def f(self x): pass\n",  # unfenced ModelNew
])
def test_any_unparseable_python_file_reports_its_syntax_error(text):
    with pytest.raises(InvalidSubmission, match=r"syntax error .*at line \d+"):
        extract(text)


def test_prose_without_code_still_says_no_code_found():
    with pytest.raises(InvalidSubmission, match="no code found"):
        extract("# Plan\nFirst I will fuse the GEMM; then:\ndef forward(self, x) calls the kernel.\n")


def test_source_without_modelnew_is_invalid():
    with pytest.raises(InvalidSubmission, match="no top-level `class ModelNew`"):
        extract("import torch\nclass Model(torch.nn.Module):\n    pass\n")


@pytest.mark.parametrize("text", ["", "   \n", "\x00\x00garbage"])
def test_empty_or_binary_text_is_invalid(text):
    with pytest.raises(InvalidSubmission):
        extract(text)


def test_constructor_with_too_few_parameters_is_rejected_naming_the_arguments():
    source = (SUBMISSIONS / "l30_wrong_signature.py").read_text()
    names = ["in_features", "out_features", "num_groups", "hardtanh_min", "hardtanh_max"]
    with pytest.raises(InvalidSubmission, match=r"takes \(in_features, out_features\).*5 positional"):
        check_constructor(source, names)


def test_constructor_with_defaults_or_varargs_is_accepted():
    ok = "class ModelNew:\n    def __init__(self, a, b, c, eps=1e-5, slope=0.01):\n        pass\n"
    check_constructor(ok, ["a", "b", "c"])
    check_constructor("class ModelNew:\n    def __init__(self, *args):\n        pass\n", ["a", "b"])
    check_constructor("class ModelNew(Base):\n    pass\n", ["a"])  # inherited: the sandbox decides
