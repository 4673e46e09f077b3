"""A child's cpuset, on a cgroup tree of plain files: made with every core and memory node of its parent's, held to
the cores it is given, and given them all back."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sandbox import cgroups


def _tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str) -> Path:
    own = tmp_path / key / "worker"
    own.mkdir(parents=True)
    monkeypatch.setattr(cgroups, "own_dirs", lambda: {key: own})
    return own


def test_a_v1_cpuset_starts_with_its_parents_cores_and_nodes_and_is_held_and_let_go(tmp_path, monkeypatch):
    own = _tree(tmp_path, monkeypatch, "cpuset")
    (own / "cpuset.cpus").write_text("0-7\n")
    (own / "cpuset.mems").write_text("0\n")
    cg, made = cgroups.create_cores("v1", [tmp_path / "memory" / "kh-1-abc"])
    assert cg == own / "kh-1-abc" and made == [cg]  # named as the child's other cgroups are
    assert (cg / "cpuset.cpus").read_text() == "0-7" and (cg / "cpuset.mems").read_text() == "0"
    assert cgroups.keep_to(cg, [7]) and (cg / "cpuset.cpus").read_text() == "7"
    assert cgroups.keep_to(cg, None) and (cg / "cpuset.cpus").read_text() == "0-7"


def test_a_v2_child_cgroup_is_its_own_cpuset_and_an_empty_parent_gives_back_its_effective_cores(tmp_path,
                                                                                               monkeypatch):
    own = _tree(tmp_path, monkeypatch, "unified")
    child = own / "kh-1-abc"
    child.mkdir()
    cg, made = cgroups.create_cores("v2", [child])
    assert cg == child and made == []
    (own / "cpuset.cpus").write_text("\n")  # v2: empty, inherited
    (own / "cpuset.cpus.effective").write_text("0-3\n")
    assert cgroups.keep_to(cg, [3, 2]) and (cg / "cpuset.cpus").read_text() == "3,2"
    assert cgroups.keep_to(cg, None) and (cg / "cpuset.cpus").read_text() == "0-3"


def test_a_cpuset_the_kernel_refuses_says_so_and_the_probe_finds_none_without_a_hierarchy(tmp_path, monkeypatch):
    own = _tree(tmp_path, monkeypatch, "cpuset")
    assert not cgroups.keep_to(own / "gone", [1])  # no such cgroup: refused, never raised
    assert cgroups.cores_version("v1") is None  # a probe cgroup here gets no cpuset.cpus file: no cpuset
    monkeypatch.setattr(cgroups, "own_dirs", lambda: {})
    assert cgroups.cores_version("v1") is None and cgroups.cores_version("v2") is None
