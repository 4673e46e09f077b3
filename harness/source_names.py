"""What the names in a submission's source stand for, read from its AST: the module's aliases (from
imports and simple assignments, through `getattr`, `vars(...)[...]`, `sys.modules[...]`, `__import__`)
and the names that hold a file descriptor. The static pre-check resolves every name through this
before a rule looks at it, so an alias breaks the rule its target breaks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

# The same module under another name: os is posix on Linux.
_SAME_MODULE = {"posix": "os", "nt": "os", "_io": "io"}
_FD_MAKERS = {"int", "os.open", "os.dup", "os.dup2"}  # calls whose result is (or names) a file descriptor


def module_name(name: str) -> str:
    top, _, rest = name.partition(".")
    top = _SAME_MODULE.get(top, top)
    return f"{top}.{rest}" if rest else top


def text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


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


class Names:
    """What the module's names stand for. Flow-insensitive: a name bound anywhere to `os.write` is
    `os.write` everywhere, which over-reaches only for code that rebinds a module's name."""

    def __init__(self, tree: ast.AST) -> None:
        self.alias: dict[str, str] = {}
        self.fds: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.alias[a.asname] = module_name(a.name)
                    else:
                        top = a.name.split(".")[0]
                        self.alias[top] = module_name(top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self.alias.update({a.asname or a.name: f"{module_name(node.module)}.{a.name}" for a in node.names})
        bindings = [b for node in ast.walk(tree) for b in _bindings(node)]
        for _ in range(len(bindings) + 1):  # a chain `a = os; b = a.write` settles one link a round
            changed = False
            for target, value in bindings:
                name = self.resolve(value) if target not in self.alias and self._names_amodule_name(value) else None
                if name is not None:
                    self.alias[target], changed = name, True
                if target not in self.fds and self.is_fd(value):
                    self.fds.add(target)
                    changed = True
            if not changed:
                break

    def _names_amodule_name(self, node: ast.expr) -> bool:
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
            first = text(args[0]) if args else None
            if fn in ("getattr", "builtins.getattr") and len(args) >= 2 and text(args[1]):
                base = self.resolve(args[0])
                return f"{base}.{text(args[1])}" if base else None
            if fn in ("__import__", "builtins.__import__") and first:
                return module_name(first.split(".")[0])  # __import__("a.b") returns a
            if fn == "importlib.import_module" and first:
                return module_name(first)
            return None
        if isinstance(node, ast.Subscript):
            key = text(node.slice)
            if self.resolve(node.value) == "sys.modules":
                return module_name(key) if key else None
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
