"""C kernels for the CPU hot spots NumPy and PyTorch leave multi-pass, compiled on first use.

A kernel is one C file in this folder (plain C, no Python or torch headers). :func:`load` builds
it with the system's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into a cache folder
(``$LMLAB_NATIVE_DIR``, else ``$XDG_CACHE_HOME/lmlab/native``, else ``~/.cache/lmlab/native``),
once per cache folder and compiler: the file name carries a hash of the source, the compiler
command and the flags (and the host name where ``$CC`` carries flags of its own, which may tie the
code to one CPU), so an edited kernel is rebuilt and a cached one is loaded in milliseconds. It is
written under a temporary name, then renamed (two processes building at once both end with a whole
library). lmlab's flags come after any in ``$CC`` and win: optimised, portable (no
``-march=native``: a cache in a home folder shared by different machines must run on all of them),
and no fast-math or fused multiply-add, since every kernel must give its NumPy twin's very values.

Every kernel has a pure NumPy twin that computes the same values: where there is no compiler, a
build fails (remembered, so later processes do not try again: delete the ``.failed`` file to
retry), the platform is Windows, or ``LMLAB_NATIVE=0``, :func:`load` returns ``None`` (the reason
is logged once) and the caller takes the twin. A library is loaded only from a folder and a file
that belong to this user and that nobody else may write (a planted library would run as you).
Nothing is required to install lmlab.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

log = logging.getLogger("lmlab.native")

#: after the user's $CC words, so these win: optimised, position-independent, no fast-math and no
#: fused multiply-add (the NumPy twins round each multiply and add separately)
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off")
SOURCES = Path(__file__).resolve().parent
#: seconds a build may take before it is stopped (with its subprocesses)
BUILD_TIMEOUT = 120


class NotBuilt(Exception):
    """Why a kernel cannot be built or loaded here (the caller falls back to NumPy)."""


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` (may hold arguments, e.g. ``ccache gcc``), else the first
    of ``cc``, ``gcc``, ``clang`` on the PATH; ``None`` when there is none."""
    if os.environ.get("CC"):
        try:
            command = shlex.split(os.environ["CC"])
        except ValueError as exc:  # an unclosed quote: not a command line (the caller says why not)
            log.info("CC=%r is not a command line (%s); fix CC", os.environ["CC"], exc)
            return None
        return command if command and shutil.which(command[0]) else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def cache_dir() -> Path:
    if os.environ.get("LMLAB_NATIVE_DIR"):
        return Path(os.environ["LMLAB_NATIVE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lmlab" / "native"


def _private(path: Path) -> None:
    """Refuse a path another user owns or may write: its library could be planted."""
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise NotBuilt(f"{path} belongs to another user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotBuilt(f"{path} may be written by other users (chmod go-w to use it)")


def _compile(command: list[str], source: Path, output: str) -> None:
    """Run the compiler; stopped with its subprocesses after :data:`BUILD_TIMEOUT` seconds."""
    proc = subprocess.Popen([*command, *FLAGS, "-o", output, str(source)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise NotBuilt(f"{command[0]} took more than {BUILD_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise NotBuilt(f"{command[0]} failed: {out.strip()[:500]}")


def _library(name: str, command: list[str]) -> ctypes.CDLL:
    """The compiled ``<name>.c`` from the cache, built now unless a good one is there."""
    source = SOURCES / f"{name}.c"
    parts = [source.read_bytes(), " ".join(command).encode(), " ".join(FLAGS).encode(),
             platform.system().encode(), platform.machine().encode()]
    if len(command) > 1:  # flags of the user's own (-march=native?) may fit this machine only
        parts.append(platform.node().encode())
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    folder = cache_dir()
    target, failed = folder / f"{name}-{key}.so", folder / f"{name}-{key}.failed"
    if failed.exists():
        raise NotBuilt(f"an earlier build failed ({failed}; delete it to try again)")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(folder)
    if target.exists():
        _private(target)
        try:
            return ctypes.CDLL(str(target))
        except OSError as exc:  # built elsewhere (another libc?): build it anew below
            log.info("native kernel %s: the cached %s does not load (%s); rebuilding", name, target, exc)
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=folder)
    os.close(fd)
    try:
        try:
            _compile(command, source, partial)
        except NotBuilt as exc:
            failed.write_text(f"{exc}\n", encoding="utf-8")
            raise
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return ctypes.CDLL(str(target))


def _command_line_tools(command: list[str]) -> bool:
    """macOS: whether the compiler is real. ``/usr/bin/cc`` and its siblings are stubs that open an
    installer while Apple's Command Line Tools are missing (``xcode-select -p`` then fails)."""
    if command[0] not in ("/usr/bin/cc", "/usr/bin/clang", "/usr/bin/gcc"):
        return True
    tool = shutil.which("xcode-select")
    return tool is not None and subprocess.run([tool, "-p"], capture_output=True).returncode == 0


@cache
def load(name: str) -> ctypes.CDLL | None:
    """The kernel library ``<name>.c`` of this folder, built on first use; ``None`` (reason
    logged) where it cannot be built or loaded: the caller then uses its NumPy twin. Never raises.
    Cached per process (``load.cache_clear()`` forgets it)."""
    setting = os.environ.get("LMLAB_NATIVE", "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        reason = f"off (LMLAB_NATIVE={os.environ['LMLAB_NATIVE']})"
    elif os.name == "nt":
        reason = "not built on Windows"
    elif (command := compiler()) is None:
        reason = "no C compiler (set CC or install cc)"
    elif sys.platform == "darwin" and not _command_line_tools(command):
        reason = "no Command Line Tools (xcode-select --install)"  # cc would open an installer
    else:
        try:
            library = _library(name, command)
        except Exception as exc:  # noqa: BLE001 - any failure here means: use the NumPy twin
            reason = f"not built ({type(exc).__name__}: {exc})"
        else:
            log.debug("native kernel %s: loaded", name)
            return library
    log.info("native kernel %s: %s; using NumPy", name, reason)
    return None
