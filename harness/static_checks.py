"""A static pre-check of submission source (AST, never imported): a second layer behind the
structural defences, naming the rule a suspicious construct breaks. It never replaces them: whatever
it misses (a name built at run time, C++ that does the same) the structural defences must still hold.

Names are resolved through the module's aliases (`import os as o`, `from sys import setprofile`,
`w = os.write`, `getattr(os, "write")`, `vars(t)["x"]`: `source_names`) before any rule looks at them,
so an alias breaks the rule its target breaks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from harness import python_ast
from harness.source_names import Names, module_name, text

# Attribute chains whose assignment rewrites torch or the clocks (`torch.backends` flags are checked
# at run time instead: global_torch_flags).
_PATCHABLE_ROOTS = ("torch", "time", "numpy", "np", "builtins")

# Rules broken by any reference to these names: a call, an alias, a name passed on. A name also matches
# any attribute path that ends in it (`torch.os.write` is `os.write`: a module's imports are attributes).
_REFERENCES: dict[str, str] = {
    **dict.fromkeys(("sys._getframe", "inspect.currentframe", "inspect.stack", "inspect.getouterframes",
                     "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.modules"), "introspection"),
    **dict.fromkeys(("importlib.import_module", "marshal.loads", "pickle.loads", "base64.b64decode",
                     "zlib.decompress", "codecs.decode"), "dynamic_code"),
    **dict.fromkeys(("os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
                     "os.execl", "os.execle", "os.execlp", "os.execlpe", "os.execv", "os.execve", "os.execvp",
                     "os.execvpe", "os.spawnl", "os.spawnle", "os.spawnlp", "os.spawnlpe", "os.spawnv",
                     "os.spawnve", "os.spawnvp", "os.spawnvpe", "pty.spawn", "pty.fork"), "subprocess"),
    **dict.fromkeys(("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream"), "streams"),
    # A hook that runs inside the harness's own calls (its empty-call calibration, its clock reads).
    **dict.fromkeys(("sys.setprofile", "sys.settrace", "sys._setprofileallthreads", "sys._settraceallthreads",
                     "sys.monitoring", "threading.setprofile", "threading.settrace",
                     "threading.setprofile_all_threads", "threading.settrace_all_threads"), "profile_hook"),
    # Bytes written past Python's file objects: the result channel is an inherited fd.
    **dict.fromkeys(("os.write", "os.writev", "os.pwrite", "os.pwritev", "os.sendfile", "os.splice",
                     "os.copy_file_range", "os.fdopen", "os.dup", "os.dup2", "socket.fromfd"), "raw_fd"),
}
_BUILTIN_CALLS = {"exec": "dynamic_code", "eval": "dynamic_code", "compile": "dynamic_code",
                  "__import__": "dynamic_code"}
_MODULES = {**dict.fromkeys(("subprocess", "_posixsubprocess", "pip", "multiprocessing"), "subprocess"),
            **dict.fromkeys(("threading", "concurrent", "_thread"), "threads"),
            **dict.fromkeys(("gc", "inspect"), "introspection"),
            **dict.fromkeys(("ctypes", "_ctypes", "cffi"), "ctypes")}
_SETATTR = {"setattr", "delattr", "builtins.setattr", "builtins.delattr", "object.__setattr__",
            "object.__delattr__", "type.__setattr__", "type.__delattr__"}
_DICT_WRITES = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"}
_OPENERS = {"open", "io.open", "io.FileIO", "builtins.open"}
_FD_PATHS = ("/proc/self/fd", "/proc/thread-self/fd", "/dev/fd")
_FRAME_ATTRS = {"f_back", "f_locals", "f_globals", "gi_frame", "tb_frame", "cr_frame"}


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    detail: str


def _is_harness(name: str) -> bool:
    """The harness's modules in the evaluating process: its package, the child (run as `__main__`)
    and the problem module it loads under a private name."""
    top = name.split(".")[0]
    return top in ("harness", "__main__") or top.startswith("_harness")


def _reference_rule(name: str) -> str | None:
    parts = name.split(".")
    if "ctypes" in parts or "_ctypes" in parts:
        return "ctypes"
    for i in range(len(parts)):
        rule = _REFERENCES.get(".".join(parts[i:]))
        if rule is not None:
            return rule
    return None


def _patch_rule(name: str) -> str | None:
    if _is_harness(name):
        return "harness_patch"
    if name.split(".")[0] in _PATCHABLE_ROOTS and not name.startswith("torch.backends."):
        return "monkey_patch"
    return None


def _written_attribute(target: ast.AST, names: Names) -> str | None:
    """The attribute an assignment target writes: `a.b.c`, or `vars(a)["c"]` / `a.__dict__["c"]`."""
    if isinstance(target, ast.Attribute):
        return names.resolve(target)
    if isinstance(target, ast.Subscript):
        owner = names.dict_of(target.value)
        return f"{owner}.{text(target.slice) or '*'}" if owner else None
    return None


def _attribute_written_by_call(node: ast.Call, names: Names) -> str | None:
    """`setattr(a, "c", v)`, `a.__setattr__(...)`, `vars(a).update(...)`: the attribute it writes."""
    fn, func = names.resolve(node.func), node.func
    if fn in _SETATTR and node.args:
        owner = names.resolve(node.args[0])
        return f"{owner}.{text(node.args[1]) if len(node.args) > 1 and text(node.args[1]) else '*'}" \
            if owner else None
    if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
        owner = names.resolve(func.value)
        return f"{owner}.*" if owner else None
    if isinstance(func, ast.Attribute) and func.attr in _DICT_WRITES:
        owner = names.dict_of(func.value)
        return f"{owner}.*" if owner else None
    return None


def _imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [module_name(a.name) for a in node.names]
    if node.level or not node.module:
        return []
    module = module_name(node.module)
    return [f"{module}.{a.name}" for a in node.names] + [module]


def _check_import(node: ast.Import | ast.ImportFrom, add: Callable[[str, ast.AST, str], None]) -> None:
    for name in _imported_names(node):
        for rule in (_MODULES.get(name.split(".")[0]), "harness_import" if _is_harness(name) else None,
                     _reference_rule(name)):
            if rule:
                add(rule, node, f"imports {name}")


def _check_call(node: ast.Call, names: Names, add: Callable[[str, ast.AST, str], None]) -> None:
    fn = names.resolve(node.func) or ""
    written = _attribute_written_by_call(node, names)
    rule = _patch_rule(written) if written else None
    if rule:
        add(rule, node, f"{ast.unparse(node.func)}(...) writes {written}")
    if fn in _BUILTIN_CALLS:
        add(_BUILTIN_CALLS[fn], node, f"calls {fn}")
    file = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in ("file", "fd")), None)
    if fn in _OPENERS and file is not None and names.is_fd(file):
        add("raw_fd", node, f"calls {fn} on a file descriptor")


def _check_string(node: ast.Constant, add: Callable[[str, ast.AST, str], None]) -> None:
    text = str(node.value)
    if any(p in text for p in _FD_PATHS):
        add("raw_fd", node, "a string names a file descriptor under " + next(p for p in _FD_PATHS if p in text))
    elif "/proc/" in text:
        add("introspection", node, "a string mentions /proc/")
    if "cudaStreamCreate" in text:
        add("streams", node, "a string mentions cudaStreamCreate")


def _check_class(node: ast.ClassDef, names: Names, add: Callable[[str, ast.AST, str], None]) -> None:
    bases = {names.resolve(b) for b in node.bases}
    if bases & {"torch.Tensor", "Tensor"}:
        add("tensor_subclass", node, f"class {node.name} subclasses torch.Tensor")
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name in ("__torch_function__", "__torch_dispatch__"):
            add("tensor_subclass", item, f"defines {item.name}")


def check(source: str) -> list[Finding]:
    tree = python_ast.parse(source)
    names = Names(tree)
    found: dict[tuple[str, int], Finding] = {}

    def add(rule: str, node: ast.AST, detail: str) -> None:
        line = getattr(node, "lineno", 0)
        found.setdefault((rule, line), Finding(rule, line, detail))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _check_import(node, add)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            verb = "deletes" if isinstance(node, ast.Delete) else "assigns"
            for t in targets:
                for elt in t.elts if isinstance(t, ast.Tuple) else [t]:
                    written = _written_attribute(elt, names)
                    rule = _patch_rule(written) if written else None
                    if rule:
                        add(rule, node, f"{verb} {written}")
        elif isinstance(node, ast.Call):
            _check_call(node, names, add)
        elif isinstance(node, ast.ClassDef):
            _check_class(node, names, add)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            _check_string(node, add)
        if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and \
                not isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
            name = names.resolve(node)
            rule = _reference_rule(name) if name else None
            if rule:
                text = ast.unparse(node)
                add(rule, node, f"uses {name}" if text == name else f"uses {name} (as {text})")
        if isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
            add("introspection", node, f"reads .{node.attr}")
    return sorted(found.values(), key=lambda f: (f.line, f.rule))
