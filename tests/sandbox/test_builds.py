"""What a build dir keeps between evaluations (harness/sandbox/builds.py), in process: a build dir laid out as torch's
load_inline leaves it, and what a submission writes beside it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from harness import artifacts
from harness.sandbox import builds


def _built(top: Path) -> Path:
    """A build dir as torch leaves one extension's build (its build.ninja in torch's own words), and its lock."""
    ext = top / "kh_ext"
    ext.mkdir(parents=True)
    (top / artifacts.BUILD_LOCK).touch()
    (ext / "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\n\nrule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o "
        "$out $post_cflags\n  depfile = $out.d\n  deps = gcc\n\nrule link\n  command = $cxx $in $ldflags -o $out\n\n"
        f"build main.o: compile {ext}/main.cpp\nbuild my$ src.o: compile {ext}/my$ src.cpp\n\n"
        "build kh_ext.so: link main.o my$ src.o\n\ndefault kh_ext.so\n")
    for name in ("main.cpp", "my src.cpp", "main.o", "my src.o", ".ninja_log", ".ninja_deps"):
        (ext / name).write_bytes(b"x")
    (ext / "kh_ext.so").write_bytes(b"\x7fELF")
    (ext / "kh_ext.so").chmod(0o755)
    return ext


OUTPUTS = {"build.ninja", "main.cpp", "my src.cpp", "main.o", "my src.o", "kh_ext.so", ".ninja_log", ".ninja_deps"}


def test_a_build_keeps_what_its_build_ninja_names_in_its_dir_and_nothing_else(tmp_path):
    top = tmp_path / "builds" / "key"
    ext = _built(top)
    outside = tmp_path / "outside"
    outside.write_text("host file")
    (top / "channel.txt").write_text("from the import")  # beside the build: what the next evaluation would read
    (ext / "channel.txt").write_text("from the import")
    (ext / "lock").touch()  # torch's own, left by a build cut short
    (ext / "nested").mkdir()
    (ext / "nested" / "f").write_text("x")
    (ext / "link.so").symlink_to(outside)
    (top / "elsewhere").symlink_to(tmp_path)
    (top / "other").mkdir()  # no build.ninja: no build's dir
    (top / "other" / "f").write_text("x")
    manifest = builds.seal(top)
    assert set(manifest) == {"kh_ext"} and set(manifest["kh_ext"]) == OUTPUTS
    assert set(os.listdir(top)) == {artifacts.BUILD_LOCK, "kh_ext"}
    assert set(os.listdir(ext)) == OUTPUTS
    assert outside.read_text() == "host file" and (tmp_path / "builds").is_dir()
    assert os.stat(ext / "kh_ext.so").st_mode & 0o777 == 0o755 and os.stat(ext / "main.o").st_mode & 0o777 == 0o644
    assert os.stat(ext).st_mode & 0o777 == 0o755 and os.stat(top).st_mode & 0o777 == 0o755
    assert artifacts.build_manifest(top).is_file() and not artifacts.build_manifest(top).is_relative_to(top)
    assert builds.restore(top) and set(os.listdir(ext)) == OUTPUTS  # as sealed: ready, nothing touched


def test_a_file_held_open_across_the_seal_writes_into_a_copy_no_one_reads(tmp_path):
    top = tmp_path / "key"
    ext = _built(top)
    with open(ext / "kh_ext.so", "ab") as held:
        builds.seal(top)
        held.write(b"channel")
    assert (ext / "kh_ext.so").read_bytes() == b"\x7fELF"
    assert builds.restore(top)


def test_a_build_dir_changed_after_its_seal_is_emptied_for_a_new_build(tmp_path):
    for change in ("append", "extra", "remove", "chmod"):
        top = tmp_path / change
        ext = _built(top)
        builds.seal(top)
        if change == "append":
            with open(ext / "main.o", "ab") as f:
                f.write(b"y")
        elif change == "extra":
            (top / "late.txt").write_text("after the build")
        elif change == "remove":
            (ext / "main.o").unlink()
        else:
            (ext / "kh_ext.so").chmod(0o777)
        assert not builds.restore(top), change
        assert os.listdir(top) == [artifacts.BUILD_LOCK], change
        assert not artifacts.build_manifest(top).exists()


def test_a_build_dir_never_sealed_is_emptied_and_an_empty_one_is_left_as_it_is(tmp_path):
    top = tmp_path / "key"
    _built(top)
    assert not builds.restore(top) and os.listdir(top) == [artifacts.BUILD_LOCK]
    assert not builds.restore(top) and os.listdir(top) == [artifacts.BUILD_LOCK]


def test_a_fifo_beside_the_build_is_removed_without_being_opened(tmp_path):
    top = tmp_path / "key"
    ext = _built(top)
    os.mkfifo(top / "pipe")
    (ext / "main.o").unlink()
    os.mkfifo(ext / "main.o")  # named by build.ninja, but no regular file: no output of a build
    manifest = builds.seal(top)
    assert "main.o" not in manifest["kh_ext"] and not (top / "pipe").exists() and not (ext / "main.o").exists()


def test_a_dir_made_unreadable_beside_the_build_is_removed_where_the_harness_has_the_candidates_uid():
    """Without a sandbox uid the candidate is the harness's own uid and can make a dir beside its build that its owner
    cannot list (mode 000): it is opened up and removed, where it would otherwise fail every later use of the build
    dir. Run as an unprivileged uid, the dirs its own, as such a harness would."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another uid")
    top = Path(tempfile.mkdtemp(prefix="kh-builds-", dir="/tmp"))
    try:
        top.chmod(0o755)
        key = top / "key"
        _built(key)
        (key / "kh_ext" / "hidden" / "deeper").mkdir(parents=True)
        (key / "kh_ext" / "hidden" / "deeper" / "f").write_text("x")
        for dirpath, dirnames, filenames in os.walk(top):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.chown(name, 65534, 65534)
        (key / "kh_ext" / "hidden" / "deeper").chmod(0)
        (key / "kh_ext" / "hidden").chmod(0)
        os.seteuid(65534)
        try:
            builds.seal(key)
            assert set(os.listdir(key / "kh_ext")) == OUTPUTS
        finally:
            os.seteuid(0)
    finally:
        shutil.rmtree(top, ignore_errors=True)
