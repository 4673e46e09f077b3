"""A static pre-check of submission source (AST, never imported): a second layer behind the
structural defences, naming the rule a suspicious construct breaks. It never replaces them: whatever
it misses (a name built at run time, C++ that does the same) the structural defences must still hold.

Names are resolved through the module's aliases (`import os as o`, `from sys import setprofile`,
`w = os.write`, `getattr(os, "write")`, `vars(t)["x"]`) before any rule looks at them, so an alias
breaks the rule its target breaks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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
# The same module under another name: os is posix on Linux.
_SAME_MODULE = {"posix": "os", "nt": "os", "_io": "io"}
_SETATTR = {"setattr", "delattr", "builtins.setattr", "builtins.delattr", "object.__setattr__",
            "object.__delattr__", "type.__setattr__", "type.__delattr__"}
_DICT_WRITES = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"}
_OPENERS = {"open", "io.open", "io.FileIO", "builtins.open"}
_FD_MAKERS = {"int", "os.open", "os.dup", "os.dup2"}  # calls whose result is (or names) a file descriptor
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


def _module(name: str) -> str:
    top, _, rest = name.partition(".")
    top = _SAME_MODULE.get(top, top)
    return f"{top}.{rest}" if rest else top


def _text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


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


def _bindings(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(name, value) for the simple bindings a node makes: `a = x`, `a, b = x, y`, `a := x`, and a loop
    variable over `range(...)` (bound to a stand-in int: it runs over candidate fds)."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id, node.value
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and \
                    len(target.elts) == len(node.value.elts):
                pairs = zip(target.elts, node.value.elts, strict=True)
                yield from ((t.id, v) for t, v in pairs if isinstance(t, ast.Name))
    elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and node.value:
        yield node.target.id, node.value
    elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call) \
            and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range":
        yield node.target.id, ast.Constant(3)


class _Names:
    """What the module's names stand for. Flow-insensitive: a name bound anywhere to `os.write` is
    `os.write` everywhere, which over-reaches only for code that rebinds a module's name."""

    def __init__(self, tree: ast.AST) -> None:
        self.alias: dict[str, str] = {}
        self.fds: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.alias[a.asname] = _module(a.name)
                    else:
                        top = a.name.split(".")[0]
                        self.alias[top] = _module(top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self.alias.update({a.asname or a.name: f"{_module(node.module)}.{a.name}" for a in node.names})
        bindings = [b for node in ast.walk(tree) for b in _bindings(node)]
        for _ in range(len(bindings) + 1):  # a chain `a = os; b = a.write` settles one link a round
            changed = False
            for target, value in bindings:
                name = self.resolve(value) if target not in self.alias and self._names_a_module(value) else None
                if name is not None:
                    self.alias[target], changed = name, True
                if target not in self.fds and self.is_fd(value):
                    self.fds.add(target)
                    changed = True
            if not changed:
                break

    def _names_a_module(self, node: ast.expr) -> bool:
        """An expression rooted in an imported (or aliased) name, or an explicit module lookup."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, (ast.Call, ast.Subscript)) or (isinstance(node, ast.Name) and node.id in self.alias)

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for, through aliases; None for anything else."""
        if isinstance(node, ast.Name):
            return self.alias.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            fn, args = self.resolve(node.func), node.args
            first = _text(args[0]) if args else None
            if fn in ("getattr", "builtins.getattr") and len(args) >= 2 and _text(args[1]):
                base = self.resolve(args[0])
                return f"{base}.{_text(args[1])}" if base else None
            if fn in ("__import__", "builtins.__import__") and first:
                return _module(first.split(".")[0])  # __import__("a.b") returns a
            if fn == "importlib.import_module" and first:
                return _module(first)
            return None
        if isinstance(node, ast.Subscript):
            key = _text(node.slice)
            if self.resolve(node.value) == "sys.modules":
                return _module(key) if key else None
            owner = self.dict_of(node.value)
            return f"{owner}.{key or '*'}" if owner else None
        return None

    def dict_of(self, node: ast.AST) -> str | None:
        """`vars(x)` or `x.__dict__`: the name of x, whose attributes that dict holds."""
        if isinstance(node, ast.Call) and len(node.args) == 1 and self.resolve(node.func) in ("vars", "builtins.vars"):
            return self.resolve(node.args[0])
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return self.resolve(node.value)
        return None

    def is_fd(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return type(node.value) is int
        if isinstance(node, ast.Name):
            return node.id in self.fds
        if isinstance(node, ast.BinOp):
            return self.is_fd(node.left) or self.is_fd(node.right)
        if isinstance(node, ast.Call):
            return self.resolve(node.func) in _FD_MAKERS or (
                isinstance(node.func, ast.Attribute) and node.func.attr == "fileno")
        return False


def _written_attribute(target: ast.AST, names: _Names) -> str | None:
    """The attribute an assignment target writes: `a.b.c`, or `vars(a)["c"]` / `a.__dict__["c"]`."""
    if isinstance(target, ast.Attribute):
        return names.resolve(target)
    if isinstance(target, ast.Subscript):
        owner = names.dict_of(target.value)
        return f"{owner}.{_text(target.slice) or '*'}" if owner else None
    return None


def _attribute_written_by_call(node: ast.Call, names: _Names) -> str | None:
    """`setattr(a, "c", v)`, `a.__setattr__(...)`, `vars(a).update(...)`: the attribute it writes."""
    fn, func = names.resolve(node.func), node.func
    if fn in _SETATTR and node.args:
        owner = names.resolve(node.args[0])
        return f"{owner}.{_text(node.args[1]) if len(node.args) > 1 and _text(node.args[1]) else '*'}" \
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
        return [_module(a.name) for a in node.names]
    if node.level or not node.module:
        return []
    module = _module(node.module)
    return [f"{module}.{a.name}" for a in node.names] + [module]


def _check_import(node: ast.Import | ast.ImportFrom, add: Callable[[str, ast.AST, str], None]) -> None:
    for name in _imported_names(node):
        for rule in (_MODULES.get(name.split(".")[0]), "harness_import" if _is_harness(name) else None,
                     _reference_rule(name)):
            if rule:
                add(rule, node, f"imports {name}")


def _check_call(node: ast.Call, names: _Names, add: Callable[[str, ast.AST, str], None]) -> None:
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


def _check_class(node: ast.ClassDef, names: _Names, add: Callable[[str, ast.AST, str], None]) -> None:
    bases = {names.resolve(b) for b in node.bases}
    if bases & {"torch.Tensor", "Tensor"}:
        add("tensor_subclass", node, f"class {node.name} subclasses torch.Tensor")
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name in ("__torch_function__", "__torch_dispatch__"):
            add("tensor_subclass", item, f"defines {item.name}")


def check(source: str) -> list[Finding]:
    tree = ast.parse(source)
    names = _Names(tree)
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
