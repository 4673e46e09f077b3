"""The `__global__` functions in the CUDA device code of a shared object, read from its fatbin.

nvcc puts a build's device code in the `.nv_fatbin` section of the host ELF: one or more fatbins, each a
list of entries, a cubin (an ELF whose symbol table marks each kernel as a CUDA entry) or PTX text
(`.entry name`), either raw or compressed (nvcc's LZ4-style format, or zstd). This reads them in Python,
without cuobjdump (a host that builds with nvcc from pip has none), and trusts nothing in the file: a
submission writes its build dir, so a malformed file yields no names, never a hang or an exception.
Names come back demangled the way the torch profiler demangles them (`abi::__cxa_demangle`, in Kineto).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
# kind, version, header size, padded payload size, compressed size, ..., flags, ..., decompressed size
_ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQQQ")
_KIND_PTX, _KIND_CUBIN = 1, 2
_LZ, _ZSTD = 0x2000, 0x8000  # entry flags: nvcc --compress-mode=speed; zstd (=size, and PTX by default)
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB, _SHT_DYNSYM, _STT_FUNC, _STO_CUDA_ENTRY = 2, 11, 2, 0x10
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")
MAX_SECTION_BYTES = 256 << 20
MAX_ENTRY_BYTES = 256 << 20  # one decompressed cubin or PTX text


class _Malformed(ValueError):
    pass


class _Section(NamedTuple):  # an ELF64 section header
    name: int
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int


def _unpack(fmt: struct.Struct, data: bytes, offset: int) -> tuple:
    if offset < 0 or offset + fmt.size > len(data):
        raise _Malformed(f"a {fmt.size}-byte record at {offset} runs past the {len(data)} bytes")
    return fmt.unpack_from(data, offset)


def _cstring(data: bytes, offset: int) -> bytes:
    end = data.find(b"\0", offset)
    if offset < 0 or end < 0:
        raise _Malformed("a name runs past its string table")
    return data[offset:end]


def elf_sections(read: Callable[[int, int], bytes], size: int) -> Iterator[tuple[bytes, _Section]]:
    """(name, header) of each section of a 64-bit little-endian ELF; `read(offset, n)` reads the file."""
    ident = read(0, 64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        raise _Malformed("not a 64-bit little-endian ELF")
    shoff = struct.unpack_from("<Q", ident, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if shentsize != _SECTION.size or shnum * shentsize > size or shoff + shnum * shentsize > size:
        raise _Malformed("a section table outside the file")
    table = read(shoff, shnum * shentsize)
    headers = [_Section._make(_unpack(_SECTION, table, i * shentsize)) for i in range(shnum)]
    if shstrndx >= shnum or headers[shstrndx].size > MAX_SECTION_BYTES:
        raise _Malformed("no section name table")
    names = read(headers[shstrndx].offset, headers[shstrndx].size)
    for h in headers:
        yield _cstring(names, h.name), h


def _cubin_entries(cubin: bytes) -> Iterator[bytes]:
    sections = [h for _, h in elf_sections(lambda off, n: cubin[off:off + n], len(cubin))]
    for h in sections:
        if h.type != _SHT_SYMTAB or h.link >= len(sections):
            continue
        strtab = sections[h.link]
        strings = cubin[strtab.offset:strtab.offset + strtab.size]
        for i in range(h.size // _SYMBOL.size):
            name, info, other, *_ = _unpack(_SYMBOL, cubin, h.offset + i * _SYMBOL.size)
            if info & 0xF == _STT_FUNC and other & _STO_CUDA_ENTRY:
                yield _cstring(strings, name)


def _lz_decompress(src: bytes, size: int) -> bytes:
    """nvcc's `--compress-mode=speed` payload: LZ4 block format (literal run, 2-byte offset, match)."""
    out, i, n = bytearray(), 0, len(src)

    def extend(length: int) -> int:  # a length of 15 goes on in the next bytes, each 255 saying more follow
        nonlocal i
        while i < n:
            byte = src[i]
            i += 1
            length += byte
            if byte != 255:
                return length
        raise _Malformed("an LZ length runs past the payload")

    while i < n:
        token = src[i]
        i += 1
        literals = extend(15) if token >> 4 == 15 else token >> 4
        out += src[i:i + literals]
        i += literals
        if i >= n or len(out) >= size:
            break
        if i + 2 > n:
            raise _Malformed("an LZ match without its offset")
        back = src[i] | src[i + 1] << 8
        i += 2
        match = (extend(15) if token & 15 == 15 else token & 15) + 4
        if back == 0 or back > len(out) or len(out) + match > size:
            raise _Malformed("an LZ match outside the output")
        start = len(out) - back
        out += (out[start:] * (match // back + 1))[:match]
    return bytes(out)


def _zstd_decompress(src: bytes, size: int) -> bytes | None:
    """Through the `zstd` command (the standard library has no zstd before Python 3.14): None where it
    is missing, output capped at the size the entry declares."""
    exe = shutil.which("zstd")
    if exe is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".zst") as f:
        f.write(src)
        f.flush()
        with subprocess.Popen([exe, "-d", "-c", "-q", f.name], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) as proc:
            assert proc.stdout is not None
            out = proc.stdout.read(size + 1)
            if len(out) > size:
                proc.kill()
            failed = proc.wait(timeout=60) != 0
    if failed:
        raise _Malformed("a zstd payload that does not decompress to the size its entry declares")
    return out


def fatbin_entries(section: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(kind, payload) of each entry of the fatbins in a `.nv_fatbin` section; payload None where it is
    compressed in a way this host cannot read."""
    pos = 0
    while pos + _FATBIN_HEADER.size <= len(section):
        magic, _version, header_size, size = _unpack(_FATBIN_HEADER, section, pos)
        if not any(section[pos:]):  # alignment padding after the last fatbin
            return
        if magic != _FATBIN_MAGIC or header_size < _FATBIN_HEADER.size:
            raise _Malformed(f"no fatbin header at {pos}")
        p, end = pos + header_size, min(pos + header_size + size, len(section))
        while p + _ENTRY_HEADER.size <= end:
            kind, _, entry_header, payload_size, compressed, *_, flags, _zero, decompressed = \
                _unpack(_ENTRY_HEADER, section, p)
            if entry_header < _ENTRY_HEADER.size:
                raise _Malformed(f"a fatbin entry header of {entry_header} bytes")
            payload = section[p + entry_header:p + entry_header + payload_size]
            if flags & (_LZ | _ZSTD) and decompressed > MAX_ENTRY_BYTES:
                raise _Malformed(f"a fatbin entry of {decompressed} bytes")
            if flags & _LZ:
                yield kind, _lz_decompress(payload[:compressed], decompressed)
            elif flags & _ZSTD:
                yield kind, _zstd_decompress(payload[:compressed], decompressed)
            else:
                yield kind, payload
            p += entry_header + payload_size
        pos = (pos + header_size + size + 7) & ~7


def device_entry_names(section: bytes) -> tuple[set[bytes], int]:
    """Mangled names of the kernels in a `.nv_fatbin` section, and how many entries could not be read."""
    names: set[bytes] = set()
    unread = 0
    for kind, payload in fatbin_entries(section):
        if payload is None:
            unread += 1
        elif kind == _KIND_CUBIN:
            names.update(_cubin_entries(payload))
        elif kind == _KIND_PTX:
            names.update(_PTX_ENTRY.findall(payload))
    return names, unread


def _read_fatbin_section(path: Path) -> bytes | None:
    """The `.nv_fatbin` section of a regular file, opened without following links or blocking (a build
    dir is the submission's: a FIFO or a link to elsewhere in it is never read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        for name, h in elf_sections(lambda off, n: os.pread(fd, n, off), st.st_size):
            if name == b".nv_fatbin":
                if h.size > MAX_SECTION_BYTES or h.offset + h.size > st.st_size:
                    raise _Malformed(f"a .nv_fatbin section of {h.size} bytes")
                return os.pread(fd, h.size, h.offset)
        return None
    finally:
        os.close(fd)


@functools.cache
def _demangler() -> tuple[Any, Any] | None:
    """`abi::__cxa_demangle` and `free` (its result is malloc'd), or None where libstdc++ is not found."""
    try:
        fn, free = ctypes.CDLL("libstdc++.so.6").__cxa_demangle, ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free.argtypes = [ctypes.c_void_p]
    return fn, free


def demangle(name: bytes) -> str:
    """As Kineto names a kernel: `_Z...` names through `abi::__cxa_demangle`, the rest (and any it
    cannot demangle) as they are."""
    lib = _demangler()
    text = name.decode(errors="replace")
    if lib is None or not name.startswith(b"_Z"):
        return text
    status = ctypes.c_int(-1)
    ptr = lib[0](name, None, None, ctypes.byref(status))
    if not ptr:
        return text
    try:
        return ctypes.string_at(ptr).decode(errors="replace") if status.value == 0 else text
    finally:
        lib[1](ptr)


def device_kernel_symbols(path: Path) -> set[bytes]:
    """Mangled names of the kernels in one shared object's device code (empty for host-only code)."""
    try:
        section = _read_fatbin_section(path)
        if section is None:
            return set()
        mangled, unread = device_entry_names(section)
    except (OSError, _Malformed, struct.error, subprocess.SubprocessError) as e:
        log.warning("device code of %s not read: %s", path, e)
        return set()
    if unread:  # a build's cubin and PTX usually hold the same kernels: only a file read for none is news
        log.log(logging.DEBUG if mangled else logging.WARNING, "%d zstd-compressed device-code entries of %s "
                "not read (no zstd command on this host)", unread, path)
    return mangled


def device_kernels(path: Path) -> set[str]:
    """Demangled names of the kernels in one shared object's device code (empty for host-only code)."""
    return {demangle(m) for m in device_kernel_symbols(path)}


# The host compiler marks a function of internal linkage (a template kernel in an anonymous namespace) with an `L`
# before its name (`_ZN..._GLOBAL__N_...L9anon_tmplILi2EEEvPfl`), which the device code's name of the same kernel
# lacks: names are compared without it (on both sides alike, so a literal's `L` in either compares the same).
_INTERNAL_LINKAGE = re.compile(rb"L(?=[1-9])")


def _without_internal_linkage(mangled: bytes) -> bytes:
    return _INTERNAL_LINKAGE.sub(b"", mangled)


def host_functions(path: Path, names: set[bytes]) -> dict[bytes, int]:
    """The addresses (relative to where the object is loaded) of the functions among `names` that a shared object
    defines, from its symbol tables (.symtab, which holds local ones too, and .dynsym). nvcc gives each kernel a host
    function of the kernel's own (mangled) name, the one a launch names: its host stub. Empty where unreadable."""
    found: dict[bytes, int] = {}
    if not names:
        return found
    wanted = {_without_internal_linkage(n): n for n in names}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return found
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return found
        sections = [h for _, h in elf_sections(lambda off, n: os.pread(fd, n, off), st.st_size)]
        for h in sections:
            if h.type not in (_SHT_SYMTAB, _SHT_DYNSYM) or h.link >= len(sections) or h.size > MAX_SECTION_BYTES:
                continue
            strtab = sections[h.link]
            if strtab.size > MAX_SECTION_BYTES:
                continue
            strings = os.pread(fd, strtab.size, strtab.offset)
            table = os.pread(fd, h.size, h.offset)
            for i in range(h.size // _SYMBOL.size):
                name_at, info, _other, shndx, value, _size = _unpack(_SYMBOL, table, i * _SYMBOL.size)
                if info & 0xF == _STT_FUNC and shndx and value:
                    name = wanted.get(_without_internal_linkage(_cstring(strings, name_at)))
                    if name is not None:
                        found[name] = value
    except (OSError, _Malformed, struct.error) as e:
        log.warning("symbols of %s not read: %s", path, e)
    finally:
        os.close(fd)
    return found
