"""The static pre-check, in process: each rule with the source it must catch (directly and through the
aliases an attacker would use instead) and the honest code beside it that it must let through."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.static_checks import check

ROOT = Path(__file__).parents[1]

TIMING = "from harness.evaluation import timing as t\n"

CAUGHT = {
    "harness_patch": {
        "from-import alias": TIMING + "t._perf_counter_ns = lambda: 0\n",
        "import as": "import harness.evaluation.timing as t\nt._perf_counter_ns = lambda: 0\n",
        "full path": "import harness.evaluation\nharness.evaluation.timing._perf_counter_ns = lambda: 0\n",
        "alias of an alias": TIMING + "u = t\nu._perf_counter_ns = lambda: 0\n",
        "setattr": TIMING + "setattr(t, '_perf_counter_ns', lambda: 0)\n",
        "object.__setattr__": TIMING + "object.__setattr__(t, '_perf_counter_ns', lambda: 0)\n",
        "vars": TIMING + "vars(t)['_perf_counter_ns'] = lambda: 0\n",
        "__dict__": TIMING + "t.__dict__['_perf_counter_ns'] = lambda: 0\n",
        "__dict__.update": TIMING + "t.__dict__.update(_perf_counter_ns=lambda: 0)\n",
        "del": TIMING + "del t._perf_counter_ns\n",
        "augmented": TIMING + "t.OFFSET += 1\n",
        "the child, run as __main__": "import __main__\n__main__.timing = None\n",
        "the problem module": "import _harness_problem\n_harness_problem.batch_size = 1\n",
        "sys.modules": "import sys\nsys.modules['harness.evaluation.timing']._perf_counter_ns = lambda: 0\n",
        "importlib": "import importlib\nimportlib.import_module('harness.evaluation.timing')._perf_counter_ns = 0\n",
    },
    "profile_hook": {
        "sys.setprofile": "import sys\nsys.setprofile(lambda *a: None)\n",
        "sys.settrace through a module alias": "import sys as s\ns.settrace(lambda *a: None)\n",
        "from-import": "from sys import setprofile\nsetprofile(lambda *a: None)\n",
        "from-import as": "from sys import settrace as st\nst(lambda *a: None)\n",
        "assigned": "import sys\nhook = sys.setprofile\nhook(lambda *a: None)\n",
        "threading.setprofile": "import threading\nthreading.setprofile(lambda *a: None)\n",
        "threading.settrace": "from threading import settrace\nsettrace(lambda *a: None)\n",
        "sys.monitoring": "import sys\nsys.monitoring.register_callback(1, 2, print)\n",
        "another module's sys": "import torch\ntorch.sys.setprofile(print)\n",
    },
    "raw_fd": {
        "os.write": "import os, sys\nos.write(int(sys.argv[-1]), b'{}')\n",
        "assigned": "import os\nw = os.write\nw(5, b'{}')\n",
        "from-import": "from os import writev\nwritev(5, [b'{}'])\n",
        "os.pwrite": "import os\nos.pwrite(5, b'{}', 0)\n",
        "posix, os by another name": "import posix\nposix.write(5, b'{}')\n",
        "getattr": "import os\ngetattr(os, 'write')(5, b'{}')\n",
        "another module's os": "import torch\ntorch.os.write(5, b'{}')\n",
        "os.fdopen": "import os\nos.fdopen(5, 'w').write('{}')\n",
        "os.dup2 onto stdout": "import os\nos.dup2(5, 1)\n",
        "open of an int": "open(5, 'w').write('{}')\n",
        "open of an fd from argv": "import sys\nfd = int(sys.argv[sys.argv.index('--channel-fd') + 1])\n"
                                   "open(fd, 'w')\n",
        "open of every fd": "for fd in range(3, 64):\n    open(fd, 'wb', closefd=False)\n",
        "io.open of fileno()": "import io, sys\nio.open(sys.stdout.fileno(), 'w')\n",
        "/proc/self/fd": "open('/proc/self/fd/5', 'w')\n",
        "/proc/self/fd in an f-string": "n = 5\nopen(f'/proc/self/fd/{n}', 'w')\n",
        "/dev/fd": "open('/dev/fd/5', 'w')\n",
    },
    "ctypes": {
        "import": "import ctypes\n",
        "from-import": "from ctypes import CDLL\n",
        "a submodule": "import ctypes.util\n",
        "reached through another module": "import torch\ntorch.cuda.ctypes.CDLL(None)\n",
    },
    "subprocess": {
        "os.posix_spawn": "import os\nos.posix_spawn('/bin/sh', ['sh'], {})\n",
        "os.posix_spawnp from-import": "from os import posix_spawnp\nposix_spawnp('sh', ['sh'], {})\n",
        "os.fork through an alias": "import os as o\no.fork()\n",
        "os.forkpty": "import os\nos.forkpty()\n",
        "os.execv": "import os\nos.execv('/bin/sh', ['sh'])\n",
    },
}

HONEST = {
    "harness_patch": "class ModelNew:\n    def __init__(self):\n        self.scale = 1.0\n"
                     "        setattr(self, 'bias', 0.0)\n        self.__dict__['eps'] = 1e-5\n"
                     "        vars(self).update(groups=8)\n",
    "profile_hook": "import sys, torch\nwith torch.autograd.profiler.record_function('fused'):\n"
                    "    sys.getrecursionlimit()\n",
    "raw_fd": "import os, sys\nprint('log', file=sys.stderr)\nsys.stdout.write('log')\n"
              "src = open(os.path.join(os.path.dirname(__file__), 'kernel.cu')).read()\n",
    "ctypes": (ROOT / "tests" / "fixtures" / "submissions" / "l30_cuda_correct.py").read_text(),
    "subprocess": "import os\nworkers = os.cpu_count()\nflag = os.environ.get('DEBUG')\n",
}


@pytest.mark.parametrize(("rule", "case"), [(r, c) for r, cases in CAUGHT.items() for c in cases])
def test_each_rule_catches_its_construct_and_its_aliases(rule, case):
    findings = check(CAUGHT[rule][case])
    assert rule in {f.rule for f in findings}, findings


@pytest.mark.parametrize("rule", sorted(HONEST))
def test_each_rules_honest_twin_goes_through(rule):
    assert check(HONEST[rule]) == []


def test_a_finding_names_the_line_and_what_the_alias_stood_for():
    findings = check("import os\n\nw = os.write\nw(5, b'')\n")
    assert [(f.rule, f.line) for f in findings] == [("raw_fd", 3), ("raw_fd", 4)]
    assert findings[1].detail == "uses os.write (as w)"
    patch = [f for f in check(CAUGHT["harness_patch"]["from-import alias"]) if f.rule == "harness_patch"]
    assert [(f.line, f.detail) for f in patch] == [(2, "assigns harness.evaluation.timing._perf_counter_ns")]


def test_importing_the_harness_is_flagged_even_without_an_assignment():
    assert {f.rule for f in check(TIMING + "print(t.__name__)\n")} == {"harness_import"}
    assert check("import harnessing_lib\n") == []  # a name that only begins like it


def test_global_torch_flags_are_left_to_the_run_time_check():
    assert check("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n") == []
    assert {f.rule for f in check("import torch\ntorch.matmul = lambda a, b: a\n")} == {"monkey_patch"}
    assert {f.rule for f in check("import torch.nn as nn\nnn.Linear.forward = print\n")} == {"monkey_patch"}


def test_an_int_that_is_not_opened_is_not_a_file_descriptor():
    assert check("n = int('3')\nfor i in range(n):\n    print(open('log.txt').read(), i)\n") == []


def test_static_precheck_passes_every_honest_fixture_and_reference_solution():
    honest = list((ROOT / "tests" / "fixtures" / "submissions").glob("*correct*.py"))
    honest += list((ROOT / "tests" / "fixtures" / "adversarial").glob("*_honest.py"))
    honest += list((ROOT / "reference_solutions").glob("*.py"))
    assert len(honest) >= 12
    for path in honest:
        assert check(path.read_text()) == [], path.name
