"""A static pre-check of submission source (AST, never imported): a second layer behind the
structural defences, naming the rule a suspicious construct breaks. It never replaces them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Attribute chains whose assignment rewrites the harness's instruments or torch itself.
_PATCHABLE_ROOTS = ("torch", "time", "numpy", "np", "builtins", "harness")
_INTROSPECTION_CALLS = {"sys._getframe", "inspect.currentframe", "inspect.stack", "inspect.getouterframes",
                        "gc.get_objects", "gc.get_referrers", "gc.get_referents"}
_FRAME_ATTRS = {"f_back", "f_locals", "f_globals", "gi_frame", "tb_frame", "cr_frame"}
_DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module", "marshal.loads",
                  "pickle.loads", "base64.b64decode", "zlib.decompress", "codecs.decode"}
_PROCESS_CALLS = {"os.system", "os.popen", "os.fork", "os.execv", "os.execvp", "os.spawnv", "pty.spawn"}
_PROCESS_MODULES = {"subprocess", "pip", "multiprocessing"}
_THREAD_MODULES = {"threading", "concurrent", "_thread"}
_STREAM_CALLS = {"torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream"}


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    detail: str


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def check(source: str) -> list[Finding]:
    tree = ast.parse(source)
    found: list[Finding] = []

    def add(rule: str, node: ast.AST, detail: str) -> None:
        found.append(Finding(rule, getattr(node, "lineno", 0), detail))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in _PROCESS_MODULES:
                    add("subprocess", node, f"imports {name}")
                elif top in _THREAD_MODULES:
                    add("threads", node, f"imports {name}")
                elif top in ("gc", "inspect"):
                    add("introspection", node, f"imports {name}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = _dotted(t) if isinstance(t, ast.Attribute) else None
                if name and name.split(".")[0] in _PATCHABLE_ROOTS and not name.startswith("torch.backends."):
                    add("monkey_patch", node, f"assigns {name}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func) or ""
            if name == "setattr" and node.args and (_dotted(node.args[0]) or "").split(".")[0] in _PATCHABLE_ROOTS:
                add("monkey_patch", node, f"setattr on {_dotted(node.args[0])}")
            elif name in _INTROSPECTION_CALLS:
                add("introspection", node, f"calls {name}")
            elif name in _DYNAMIC_CALLS:
                add("dynamic_code", node, f"calls {name}")
            elif name in _PROCESS_CALLS:
                add("subprocess", node, f"calls {name}")
            elif name in _STREAM_CALLS:
                add("streams", node, f"calls {name}")
        elif isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
            add("introspection", node, f"reads .{node.attr}")
        elif isinstance(node, ast.Attribute) and _dotted(node) == "sys.modules":
            add("introspection", node, "reads sys.modules")
        elif isinstance(node, ast.ClassDef):
            bases = {_dotted(b) for b in node.bases}
            if bases & {"torch.Tensor", "Tensor"}:
                add("tensor_subclass", node, f"class {node.name} subclasses torch.Tensor")
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in ("__torch_function__", "__torch_dispatch__"):
                    add("tensor_subclass", item, f"defines {item.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "/proc/" in node.value or "cudaStreamCreate" in node.value):
            rule = "streams" if "cudaStreamCreate" in node.value else "introspection"
            add(rule, node, "a string mentions " + ("cudaStreamCreate" if rule == "streams" else "/proc/"))
    return sorted(set(found), key=lambda f: (f.line, f.rule))
