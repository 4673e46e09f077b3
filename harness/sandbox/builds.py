"""What a load_inline build dir keeps from one evaluation to the next: its build's own outputs, nothing else.

Identical sources share a build dir (keyed by the source and the target), so the second evaluation finds the first
one's build ready. The candidate builds there itself (its import runs load_inline), so the dir is its own while it
imports and constructs ModelNew; then, the build done, it is sealed (`seal`): whatever is not an output of the build
(per extension dir, the files its build.ninja names inside that dir) is removed, every kept file is replaced by a
copy of the harness's own (a file the candidate still holds open writes into a copy no one reads), and the dirs and
files become the harness's, read-only to a candidate of another uid. A record of what was kept (its manifest,
beside the dir, out of the candidate's reach) is checked when the dir is next taken (`restore`): a dir that differs
from it, or has none, is emptied and built again. So nothing an evaluation writes there outlives it, and what its
import wrote beside the build is gone before the next evaluation of the same text imports.

Without a sandbox uid the candidate runs as the harness's own uid: read-only cannot be enforced, and the manifest
check at the next use is what removes its writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path

from harness import artifacts

log = logging.getLogger("harness.sandbox")

_NINJA_FILES = ("build.ninja", ".ninja_log", ".ninja_deps")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _ninja_paths(text: str) -> list[str]:
    """The outputs and explicit inputs of build.ninja's `build` statements, as written (ninja's `$ ` and `$:`
    escapes undone)."""
    paths: list[str] = []
    for line in text.splitlines():
        if not line.startswith("build "):
            continue
        tokens, cur, i = [], "", 6
        while i < len(line):
            c = line[i]
            if c == "$" and i + 1 < len(line):
                cur += line[i + 1]
                i += 2
                continue
            if c in " :":
                if cur:
                    tokens.append(cur)
                cur = ""
                if c == ":":
                    tokens.append(":")
            else:
                cur += c
            i += 1
        if cur:
            tokens.append(cur)
        if ":" not in tokens:
            continue
        colon = tokens.index(":")
        outs, ins = tokens[:colon], tokens[colon + 2:]  # after the colon: the rule, then its inputs
        paths += [t for t in outs + ins if t not in ("|", "||", "|@")]
    return paths


def build_outputs(ext_dir: Path, ninja_text: str) -> set[str]:
    """The names, in an extension's build dir, of what its build made or read there: build.ninja's outputs and inputs
    that lie directly in the dir (torch's layout: the sources load_inline writes, the objects, the library), and
    ninja's own files."""
    names = set(_NINJA_FILES)
    for p in _ninja_paths(ninja_text):
        full = os.path.normpath(p if os.path.isabs(p) else os.path.join(ext_dir, p))
        if os.path.dirname(full) == os.path.normpath(ext_dir):
            names.add(os.path.basename(full))
    return names


def _remove(name: str, dir_fd: int) -> None:
    """Remove an entry of a dir opened as `dir_fd`, a dir included, never following a link."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(name, dir_fd=dir_fd)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            return
        try:
            shutil.rmtree(name, dir_fd=dir_fd)
        except PermissionError:  # without a sandbox uid, a dir the candidate made unreadable is the harness's own:
            _open_up(name, dir_fd)  # opened up, then removed (else every later use of the build dir would fail)
            shutil.rmtree(name, dir_fd=dir_fd)


def _open_up(name: str, dir_fd: int) -> None:
    """Give the owner back every right on a tree of its own, top down, before it is walked."""
    os.chmod(name, 0o700, dir_fd=dir_fd)
    for _, dirs, _, fd in os.fwalk(name, dir_fd=dir_fd):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(d, 0o700, dir_fd=fd)


def _take_dir(name: str, dir_fd: int | None) -> int:
    """Open a dir without following a link and make it the harness's, read-only to others, before anything in it is
    looked at: from then on the candidate can neither add, rename nor remove its entries."""
    fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    os.fchown(fd, os.geteuid(), os.getegid())
    os.fchmod(fd, 0o755)
    return fd


def _own_copy(name: str, dir_fd: int) -> dict[str, int] | None:
    """Replace a regular file by a copy the harness owns (mode 0644, or 0755 where it was executable), its times kept
    (ninja compares them); None where the entry is not a regular file."""
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    tmp = f".{name}.harness-copy"
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return None
        _remove(tmp, dir_fd)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(os.dup(src), "rb") as fin, os.fdopen(os.dup(dst), "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            os.fchmod(dst, 0o755 if st.st_mode & 0o111 else 0o644)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return _stamp(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    finally:
        os.close(src)


def _stamp(st: os.stat_result) -> dict[str, int]:
    """What a kept file must still be at the next use. ctime changes with any write, chmod or chown, and no one
    sets it back."""
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "uid": st.st_uid, "mode": stat.S_IMODE(st.st_mode)}


def _read_ninja(dir_fd: int) -> str | None:
    try:
        fd = os.open("build.ninja", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read(1 << 20).decode(errors="replace")


def seal(path: Path) -> dict[str, dict[str, dict[str, int]]]:
    """The build is done: keep its outputs only, as the harness's own read-only copies, and record them (the
    manifest). Returns the manifest: extension dir -> file -> stamp."""
    manifest: dict[str, dict[str, dict[str, int]]] = {}
    top = _take_dir(str(path), None)
    try:
        for entry in sorted(os.listdir(top)):
            if entry == artifacts.BUILD_LOCK:
                continue
            try:
                ext = _take_dir(entry, top)
            except OSError:  # not a dir (or a link): no build's output
                _remove(entry, top)
                continue
            try:
                ninja = _read_ninja(ext)
                keep = build_outputs(path / entry, ninja) if ninja is not None else set()
                files: dict[str, dict[str, int]] = {}
                for name in sorted(os.listdir(ext)):
                    stamp = _own_copy(name, ext) if name in keep else None
                    if stamp is None:
                        _remove(name, ext)
                    else:
                        files[name] = stamp
            finally:
                os.close(ext)
            if files:
                manifest[entry] = files
            else:
                _remove(entry, top)
    finally:
        os.close(top)
    record = artifacts.build_manifest(path)
    tmp = record.with_name(record.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, sort_keys=True)
    os.replace(tmp, record)
    return manifest


def restore(path: Path) -> bool:
    """Before a build dir is used (its lock held, no candidate in it): True where it holds exactly what its last seal
    kept, unchanged; else it is emptied (its lock file kept) for a build from scratch, and False. A dir that was never
    sealed (new, or its build cut short with the harness) is emptied too, unless it is empty already."""
    try:
        manifest = json.loads(artifacts.build_manifest(path).read_text())
    except (OSError, ValueError):
        manifest = None
    if isinstance(manifest, dict) and _matches(path, manifest):
        return True
    top = os.open(path, _OPEN_DIR)
    try:
        left = [e for e in os.listdir(top) if e != artifacts.BUILD_LOCK]
        if left and manifest is not None:
            log.warning("build dir %s differs from what its build kept: emptied, to be built again", path)
        for entry in left:
            _remove(entry, top)
    finally:
        os.close(top)
    with contextlib.suppress(FileNotFoundError):
        artifacts.build_manifest(path).unlink()
    return False


def _matches(path: Path, manifest: dict) -> bool:
    try:
        if set(os.listdir(path)) - {artifacts.BUILD_LOCK} != set(manifest):
            return False
        for ext, files in manifest.items():
            d = path / ext
            if not isinstance(files, dict) or set(os.listdir(d)) != set(files):
                return False
            for name, want in files.items():
                st = os.lstat(d / name)
                if not stat.S_ISREG(st.st_mode) or _stamp(st) != want:
                    return False
    except OSError:
        return False
    return True
