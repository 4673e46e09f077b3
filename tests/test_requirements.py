"""What a submission needs of its worker, read from the source: a CUDA extension, a Triton kernel, tensors
placed on a GPU by a constant need a GPU worker; a C++ extension and code that asks where to run do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.requirements import accepted, describe, met, needs_of, needs_of_text, waiting_note

FIXTURES = Path(__file__).parent / "fixtures" / "submissions"
HEAD = "import torch\nfrom torch.utils.cpp_extension import load_inline\n"


@pytest.mark.parametrize(("source", "needs"), [
    (HEAD + "ext = load_inline(name='k', cpp_sources='', cuda_sources='__global__ void k() {}')\n", "cuda"),
    (HEAD + "src = ['x']\next = load_inline('k', cpp_sources='', cuda_sources=src, functions=['f'])\n", "cuda"),
    (HEAD + "import torch.utils.cpp_extension as ce\next = ce.load_inline('k', '', cuda_sources=s,\n"
            "    extra_cuda_cflags=['-O3', '-gencode=arch=compute_90a,code=sm_90a'])\n", "cuda sm_90a"),
    (HEAD + "ext = load_inline('k', '', cuda_sources=s, extra_cuda_cflags=['-arch=sm_80'])\n", "cuda sm_80"),
    (HEAD + "ext = load_inline('k', cpp, cuda)\n", "cuda"),  # cuda_sources passed by position
    ("import torch.utils.cpp_extension as ce\next = ce.load('k', sources=['k.cu'])\n", "cuda"),
    ("import triton\nimport triton.language as tl\n", "cuda"),
    ("from triton import jit\n", "cuda"),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.cuda()\n", "cuda"),
    ("import torch\nw = torch.zeros(3, device='cuda')\n", "cuda"),
    ("import torch\nw = torch.zeros(3).to('cuda:0')\n", "cuda"),
    ("import torch\nd = torch.device('cuda')\n", "cuda"),
    # The honest twins: a CPU-buildable extension, an empty cuda_sources, and code that picks its device.
    (HEAD + "ext = load_inline(name='k', cpp_sources='int f() { return 1; }')\n", None),
    (HEAD + "ext = load_inline(name='k', cpp_sources='x', cuda_sources=None)\n", None),
    ("import torch\nd = 'cuda' if torch.cuda.is_available() else 'cpu'\nw = torch.zeros(3, device=d)\n", None),
    ("import torch\nw = torch.zeros(3)\nif torch.cuda.is_available():\n    w = w.cuda()\n", None),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.to(x.device)\n",
     None),
])
def test_needs_are_read_from_the_source(source, needs):
    assert needs_of(source) == needs


def test_the_fixtures_cuda_extension_needs_a_gpu_and_the_cpp_one_does_not():
    assert needs_of_text((FIXTURES / "l30_cuda_correct.py").read_text()) == "cuda"
    assert needs_of_text((FIXTURES / "l30_cpp_correct.py").read_text()) is None
    assert needs_of_text((FIXTURES / "l30_pytorch_correct.py").read_text()) is None
    reply = "Here it is:\n```python\n" + (FIXTURES / "l30_cuda_correct.py").read_text() + "```\n"
    assert needs_of_text(reply) == "cuda"
    assert needs_of_text("no code at all") is None  # judged invalid_submission by any worker


def test_a_worker_accepts_what_its_slots_run():
    assert accepted("cpu", None) == []
    assert accepted("cuda", None) == ["cuda"]
    h100 = set(accepted("cuda", "9.0"))
    assert {"cuda", "cuda sm_80", "cuda sm_90", "cuda sm_90a"} <= h100
    assert not {"cuda sm_100", "cuda sm_100a", "cuda sm_89a", "cuda sm_120"} & h100
    assert "cuda sm_100f" in set(accepted("cuda", "10.3")) and "cuda sm_103a" in set(accepted("cuda", "10.3"))
    assert met(None, set()) and not met("cuda", set()) and met("cuda sm_80", h100)
    assert waiting_note("cuda") == "waits for a GPU worker; none is connected"
    assert describe("cuda sm_90a") == "a GPU worker that runs sm_90a"
