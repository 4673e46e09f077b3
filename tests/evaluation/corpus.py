"""The adversarial corpus: one submission per exploit class, the verdict (and flag) it must get, the
defence that catches it, and the honest twin that must pass. docs/integrity.md shows this table;
tests/evaluation/test_corpus.py runs it (CPU entries in CI, GPU entries on a GPU host).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class Exploit:
    name: str  # the class, as issue 6 names it
    fixture: str  # relative to the repository root
    verdict: str
    flag: str | None  # the flag check it must carry (None: the verdict alone)
    defence: str
    twin: str  # the honest submission closest to it
    gpu: bool = False  # needs CUDA to show the exploit (or the defence)
    problem: str = "level2/30"
    message_has: str | None = None  # a phrase the verdict's message must contain ("a|b": one of them)
    problems_dir: str | None = None  # where `problem` lives when it is not a built-in (relative to the root)
    alone: bool = False  # its check needs the GPU to itself (the GPU suite's one-at-a-time stage)
    # The least time a timed call may be credited with (ms): a floor its forward sleeps, less the host's noise, that
    # holds wherever the work was moved (out of its window, into its fingerprints).
    least_call_ms: float | None = None


A = "tests/fixtures/adversarial/"
S = "tests/fixtures/submissions/"
HONEST = S + "l30_pytorch_correct.py"
SOLUTION = "reference_solutions/level2_30_gemm_groupnorm_hardtanh.py"

CORPUS: tuple[Exploit, ...] = (
    Exploit("stale-buffer reuse", A + "stale_buffer_reuse.py", "wrong_answer", None,
            "reference computed in the trusted process only; fresh allocations NaN-poisoned (CUDA)", HONEST),
    Exploit("stale-buffer reuse, NaN-poisoned", A + "stale_buffer_reuse.py", "wrong_answer", None,
            "the CUDA caching allocator's free memory is filled with NaN before each correctness call", HONEST,
            gpu=True, message_has="NaN/Inf"),
    Exploit("pointer-keyed cache", A + "pointer_keyed_cache.py", "wrong_answer|nondeterministic|flagged",
            "timed_outputs?",
            "fresh inputs for every trial and timed call (recycled addresses hit stale entries); determinism "
            "re-run; timed outputs checked", HONEST,
            gpu=True),  # CUDA's caching allocator recycles addresses every time; host malloc only sometimes
    Exploit("content-keyed cache", A + "content_keyed_cache.py", "passed", None,
            "fresh input contents for every timed call: every lookup misses, the slow path (20 ms) is timed",
            A + "content_keyed_cache_honest.py", least_call_ms=19.0),
    Exploit("call-counting fast path", A + "call_counting_fast_path.py", "flagged", "timed_outputs",
            "outputs of timed calls, picked after each window closed, judged element by element by the trusted side",
            HONEST),
    Exploit("side stream", A + "side_stream.py", "flagged", "deferred_output",
            "output snapshotted in stream order at return vs after a device-wide sync; timing syncs the device",
            HONEST, gpu=True),
    Exploit("background thread", A + "background_thread.py", "flagged|wrong_answer", "deferred_output?",
            "output snapshotted at return vs after a pause and a sync (a thread slower than the pause leaves "
            "an unfinished output: wrong_answer)", HONEST),
    Exploit("lazy tensor subclass", A + "lazy_tensor_subclass.py", "shape_mismatch", None,
            "the output must be plain torch.Tensors: a subclass is not saved for the judge, who loads plain tensors "
            "only (weights_only)", HONEST, message_has="torch.Tensor subclass"),
    Exploit("timer patch", A + "timer_patch.py", "flagged", "static:monkey_patch",
            "timing primitives captured before the import; static pre-check", HONEST),
    Exploit("forged window: no work, computed when asked", A + "lazy_window.py", "flagged", "static:harness_patch",
            "a window's time is the parent's clock; so are the fingerprints of all its outputs, under a key drawn "
            "after it closed, and what they take beyond the trusted side's is charged to the window: its 10 ms a "
            "call is paid; static pre-check",
            A + "lazy_window_honest.py", least_call_ms=8.0),
    Exploit("half a window computed, the rest when asked", A + "lazy_half_window.py", "flagged",
            "static:harness_patch",
            "every output of every timed window is fingerprinted on the parent's clock, right after it, and what "
            "the fingerprints take beyond the trusted side's is charged to that window: the skipped half (4 ms a "
            "call) is paid there, whatever a bound would have allowed; static pre-check",
            A + "lazy_half_window_honest.py", least_call_ms=3.2),
    Exploit("forged fingerprints", A + "forged_fingerprints.py", "flagged", "timed_outputs",
            "eager's process fingerprints eager's outputs of the same seeds under the same key; a number off by "
            "more than an error within the tolerance is a wrong output", HONEST),
    Exploit("fake result on the result channel", A + "fake_result_channel.py", "flagged", "protocol",
            "the parent takes only the reply its command names, with the command's nonce", HONEST),
    Exploit("the protocol spoken by the submission", A + "fake_replies.py", "flagged", "protocol",
            "replies are evidence, not verdicts: the parent takes one reply per command it sent, and a window "
            "answered without work still has to hand over outputs judged element by element", HONEST),
    Exploit("seed read to tell trials from timed calls", A + "seed_reader.py", "wrong_answer", None,
            "inputs made under a forked RNG state from seeds sent only when a window opens; every forward runs after "
            "torch.manual_seed of a fresh seed of its own, trials included: the seed it reads changes on every "
            "call, so its answer 'ahead' is judged in the trials", HONEST),
    Exploit("profile hook inflating the subtracted overhead", A + "profile_hook_spin.py", "flagged",
            "static:profile_hook",
            "the empty window is timed in a process of the harness's (eager's own, or the trusted one), out of the "
            "hook's reach; static pre-check", HONEST),
    Exploit("timing module patched through an alias", A + "timing_alias_patch.py", "flagged", "timed_outputs",
            "the window's outputs are judged element by element in the trusted process; static pre-check", HONEST),
    Exploit("constant with the right sums once timed", A + "constant_once_timed.py", "flagged", "timed_outputs",
            "timed outputs compared element by element, not by sums", A + "constant_once_timed_honest.py",
            problem="level1/23", problems_dir="tests/fixtures/problems"),
    Exploit("low precision once timed", A + "precision_once_timed.py", "flagged", "timed_outputs",
            "timed outputs compared element by element at the problem's tolerance", HONEST),
    Exploit("output layout: data past the segment's end", A + "output_layout_outside.py", "runtime_error", None,
            "everything read from the candidate is hostile data: its output's layout is checked against the segment "
            "before a byte is copied out (untrusted.plan), and the copy is read, never mapped", HONEST,
            message_has="no integer in"),
    Exploit("output layout: fifteen thousand tensors", A + "output_layout_bomb.py", "runtime_error", None,
            "a layout must list as many tensors as the reference's output has, checked before any is read", HONEST,
            message_has="entries"),
    Exploit("output layout: on the meta device", A + "output_layout_device.py", "shape_mismatch", None,
            "an output must live on the reference's kind of device; the judge reads its own copy, not a claim",
            HONEST, message_has="lives on"),
    Exploit("output a sparse tensor", A + "output_sparse.py", "shape_mismatch", None,
            "an output must be dense, strided, plain torch.Tensors on a real device: sparse, meta, quantized and "
            "nested tensors and subclasses are described, not packed, and refused before any comparison", HONEST,
            message_has="sparse_coo tensor"),
    Exploit("malformed reply to a command", A + "malformed_reply.py", "flagged", "protocol",
            "every reply the parent reads is validated against its command's reply model: one that does not fit is "
            "the candidate's protocol violation, never the harness's fault", HONEST),
    Exploit("fake result on stdout", A + "fake_result_stdout.py", "wrong_answer", None,
            "stdout is a log, never parsed; verdicts come from the trusted judge", HONEST),
    Exploit("early exit", A + "early_exit.py", "crashed", None,
            "a child that ends before its final message has crashed, whatever its exit status", HONEST,
            message_has="exited with code 0"),
    Exploit("input mutation", A + "input_mutation.py", "flagged", "input_mutation",
            "inputs compared with a copy after each correctness call", A + "input_mutation_honest.py"),
    Exploit("redefined problem sizes", A + "redefined_problem_sizes.py", "flagged", "static:introspection",
            "inputs come from the harness's problem file under its seed: staged, the trusted side makes the timed "
            "windows' inputs and its copy of the problem is no use; else timed outputs judged element by element "
            "(timed_outputs)", HONEST),
    Exploit("global TF32 switch", S + "l30_tf32_flags.py", "flagged", "global_torch_flags",
            "torch numerics flags snapshotted after import, construction and the trials", HONEST),
    Exploit("precision downgrade to bf16", A + "precision_downgrade_bf16.py", "wrong_answer", None,
            "fp32 tolerance 1e-4; error vs float64 next to the reference's own (precision_below_fp32)", HONEST),
    Exploit("the reference's own rounding, made coarser", A + "coarser_than_reference.py", "wrong_answer", None,
            "an element passes within the tolerance of the fp32 reference or of its float64 truth, never by the "
            "reference's own error: the exact twin passes where the reference rounds", S + "l150_exact.py",
            problem="level1/150", problems_dir="tests/fixtures/problems"),
    Exploit("constant output", A + "constant_output.py", "wrong_answer", None,
            "elementwise tolerance against the reference on 5 random inputs", HONEST),
    Exploit("input-range shortcut", A + "input_range_shortcut.py", "wrong_answer", None,
            "an extra trial on randn*2+0.5 inputs", HONEST, message_has="randn*2+0.5 inputs"),
    Exploit("pure PyTorch wrapper", S + "l30_pytorch_correct.py", "passed", "no_custom_kernel",
            "its source builds nothing and imports only torch: no kernel of its own can run", SOLUTION, gpu=True),
    Exploit("inductor's kernels, unique names off", A + "inductor_anonymous_kernels.py", "passed", "no_custom_kernel",
            "a traced kernel is its own only where its build's device code or a @triton.jit function of its own file "
            "compiled it: inductor's `triton_` kernels come from files of its cache", SOLUTION, gpu=True),
    Exploit("inductor's kernels beside a @triton.jit decoy of their name", A + "inductor_beside_triton_decoy.py",
            "passed", "no_custom_kernel",
            "a Triton launch is its own only where its CUfunction is a compiled kernel of a @triton.jit function of "
            "its own file: the name `triton_` its text also defines claims none of inductor's",
            S + "l151_triton_add.py", gpu=True, problem="level1/151", problems_dir="tests/fixtures/problems"),
    Exploit("a library's kernel that looks like no library's (cuFFT)", A + "cufft_beside_pytorch.py", "passed",
            "no_custom_kernel", "no name counts for looking like no library's: cuFFT's kernels are in no build of its "
            "own and no @triton.jit function of its text", SOLUTION, gpu=True),
    Exploit("own kernel only on inputs seen before", A + "own_kernel_on_seen_inputs.py", "passed", "no_custom_kernel",
            "the trace is of a timed window's own calls, drawn among the timed rounds, on inputs made fresh from the "
            "window's seeds: no replay of inputs it has seen", SOLUTION, gpu=True),
    Exploit("GPU work left running after the reply", A + "leftover_gpu_work.py", "flagged", "leftover_gpu_work",
            "the candidate's processes are stopped once its turn is over, and the trusted side waits for an idle GPU "
            "before each reference window, off its clock; static pre-check", HONEST, gpu=True, alone=True),
    Exploit("SIGCONT timer lifting the pause", A + "sigcont_timer.py", "passed|flagged", "ran_while_paused?",
            "between its turns the candidate is frozen by its cgroup (else ptrace-stopped), which no signal of its own "
            "lifts; after every reference window its CPU time must not have moved (and on CUDA the GPU must be idle): "
            "a window it disturbed is timed again; flagged where the pause never wakes a held task (v1, ptrace), not "
            "where v2's freezer woke it for the kernel to park it again (kernel microseconds, counted)", HONEST),
    Exploit("device memory taken while constructing", A + "device_memory_hoard.py", "runtime_error", None,
            "NVML's figures at the failure of whichever side runs out first: before the memory plan a candidate may "
            "hold twice the reference's parameters and the reserve, after it the plan's share; its own process's "
            "next allocation (on an H200, the harness's L2 flush buffer as it took its parameters) fails as its "
            "own", A + "device_memory_hoard_honest.py", gpu=True, alone=True,
            message_has="while the candidate's processes held|OutOfMemoryError while"),
    Exploit("try/except fallback", A + "try_except_fallback.py", "passed", "no_custom_kernel",
            "the kernel trace of a timed window: the compiled kernel never ran", SOLUTION, gpu=True),
    Exploit("affine step dropped (default parameters)", S + "l30_drops_affine.py", "wrong_answer", None,
            "the reference's parameters are drawn fresh for each evaluation (GroupNorm's weight is no longer 1, its "
            "bias no longer 0) and reach ModelNew by name, or by shape and likeness of name",
            S + "l30_renamed_affine.py"),
    Exploit("frame walk", A + "frame_walk.py", "flagged", "static:introspection",
            "the candidate's process holds no expected output, seed or judge; static pre-check", HONEST),
)


def markdown_table() -> str:
    """The corpus as docs/integrity.md shows it (a test checks the doc holds exactly this)."""
    rows = ["| class | fixture | expected | defence that catches it | honest twin | runs on |",
            "|---|---|---|---|---|---|"]
    for e in CORPUS:
        expected = " or ".join(f"`{v}`" for v in e.verdict.split("|"))
        if e.flag:
            expected += f" `{e.flag.rstrip('?')}`" + (" (if flagged)" if e.flag.endswith("?") else "")
        if e.least_call_ms is not None:
            expected += f", at least {e.least_call_ms:g} ms a call"
        where = "GPU" if e.gpu else "CPU + GPU"
        fixture = e.fixture.rsplit("/", 1)[-1] + (f" on `{e.problem}`" if e.problem != "level2/30" else "")
        rows.append(f"| {e.name} | `{fixture}` | {expected} | {e.defence} | `{e.twin.rsplit('/', 1)[-1]}` | "
                    f"{where} |")
    return "\n".join(rows) + "\n"
