"""Turn a submitted text (Python source or a raw LLM reply) into the source to evaluate.

Static only: the text is parsed, never imported. Every rejection says what to fix.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass

from harness import python_ast

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)[^\n]*$", re.MULTILINE)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_DEFINES_MODELNEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)
# How a Python file opens, as against prose (`#` lines are skipped: in a reply they are markdown headings).
_OPENS_LIKE_PYTHON = re.compile(r"(import\s|from\s+[\w.]+\s+import\s|class\s|def\s|async\s+def\s|@\w|\"\"\"|''')")


class InvalidSubmission(ValueError):
    """The text cannot be evaluated; the message says why."""


@dataclass(frozen=True)
class Submission:
    source: str
    from_reply: bool  # extracted from a fenced block of a longer reply
    sha256: str


@dataclass(frozen=True)
class _Block:
    lang: str
    body: str
    line: int  # 1-based line of the opening fence
    closed: bool


def _fenced_blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if not m:
            return blocks
        fence, lang = m.group(1), m.group(2).lower()
        start = m.end() + 1
        line = text.count("\n", 0, m.start()) + 1
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = close.search(text, start)
        if end is None:
            blocks.append(_Block(lang, text[start:], line, closed=False))
            return blocks
        blocks.append(_Block(lang, text[start : end.start()], line, closed=True))
        pos = end.end()


def _defines_modelnew(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)


def _parse(source: str, where: str) -> ast.Module:
    try:
        return python_ast.parse(source)
    except SyntaxError as e:
        line = (e.text or "").rstrip()
        shown = f": {line.strip()!r}" if line else ""
        raise InvalidSubmission(f"syntax error in {where} at line {e.lineno}: {e.msg}{shown}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, absurd nesting
        raise InvalidSubmission(f"{where} cannot be parsed as Python: {type(e).__name__}: {e}") from None


def extract(text: str) -> Submission:
    """Pick the code to evaluate: the whole text if it is Python defining ModelNew, else the last
    fenced block of the reply that defines ModelNew."""
    if not text.strip():
        raise InvalidSubmission("the submission is empty")
    try:
        whole = python_ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        whole = None
    if whole is not None:
        if _defines_modelnew(whole):
            return _done(text, from_reply=False)
        if not _FENCE.search(text):
            raise InvalidSubmission("the source defines no top-level `class ModelNew`")

    blocks = [b for b in _fenced_blocks(text) if b.lang in _PY_LANGS]
    candidates = [b for b in blocks if _DEFINES_MODELNEW.search(b.body)]
    if not candidates:
        if whole is None and _is_python_source(text):
            _parse(text, "the source")  # raises: its syntax error, with the line
        if any(not b.closed for b in blocks):
            b = next(b for b in blocks if not b.closed)
            raise InvalidSubmission(
                f"the reply was cut off: the code block opened at line {b.line} is never closed, "
                "and no complete code block defines `class ModelNew`"
            )
        if not _fenced_blocks(text):
            raise InvalidSubmission(
                "no code found: the reply has no fenced code block and is not itself Python source "
                "(a reply cut off before its code, or prose only)"
            )
        return_langs = sorted({b.lang or "plain" for b in _fenced_blocks(text)})
        raise InvalidSubmission(
            f"no Python code block defines `class ModelNew` (the reply's code blocks are: "
            f"{', '.join(return_langs)})"
        )
    last = candidates[-1]
    if not last.closed:
        raise InvalidSubmission(
            f"the reply was cut off: the code block defining ModelNew (opened at line {last.line}) "
            "is never closed"
        )
    tree = _parse(last.body, f"the code block at line {last.line}")
    if not _defines_modelnew(tree):
        raise InvalidSubmission(
            f"the code block at line {last.line} mentions ModelNew but defines no top-level `class ModelNew`"
        )
    return _done(last.body, from_reply=True)


def _is_python_source(text: str) -> bool:
    """Whether a text that does not parse was meant as a Python file, so that its syntax error is the
    news, rather than prose: it opens like one, or it defines ModelNew outside any fenced block."""
    if _DEFINES_MODELNEW.search(text) and not _fenced_blocks(text):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return _OPENS_LIKE_PYTHON.match(stripped) is not None
    return False


def _done(source: str, from_reply: bool) -> Submission:
    return Submission(source=source, from_reply=from_reply, sha256=hashlib.sha256(source.encode()).hexdigest())


def check_constructor(source: str, init_arg_names: list[str]) -> None:
    """Fail when ModelNew.__init__ visibly cannot take the problem's init arguments positionally.

    `init_arg_names` are what get_init_inputs() passes (positional), named after Model.__init__.
    A ModelNew without its own __init__ (or with *args) is left to the sandbox's binding check.
    """
    tree = python_ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None or init.args.vararg is not None:
        return
    params = [a.arg for a in init.args.posonlyargs + init.args.args][1:]
    n_defaults = len(init.args.defaults)
    required = len(params) - n_defaults
    given = len(init_arg_names)
    if required <= given <= len(params):
        return
    expected = ", ".join(init_arg_names)
    raise InvalidSubmission(
        f"ModelNew.__init__ takes ({', '.join(params)}) but the problem constructs it with "
        f"{given} positional argument{'s' if given != 1 else ''} ({expected}): use the reference "
        "Model's constructor signature"
    )
