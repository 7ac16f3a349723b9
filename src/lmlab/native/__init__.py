"""C kernels for the CPU hot spots NumPy and PyTorch leave multi-pass, compiled on first use.

A kernel is one C file in this folder (plain C, no Python or torch headers). :func:`load` builds
it with the system's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into a cache folder
(``$LMLAB_NATIVE_DIR``, else ``$XDG_CACHE_HOME/lmlab/native``, else ``~/.cache/lmlab/native``),
once per machine: the file name carries a hash of the source, the compiler and the flags, so an
edited kernel is rebuilt and a cached one is loaded in milliseconds. It is written under a
temporary name, then renamed (two processes building at once both end with a whole library).
Flags are portable (``-O3``, no ``-march=native``: a cache in a home folder shared by different
machines must run on all of them).

Every kernel has a pure NumPy twin that computes the same values: where there is no compiler, a
build fails, the platform is Windows, or ``LMLAB_NATIVE=0``, :func:`load` returns ``None``
(the reason is logged once) and the caller takes the twin. Nothing is required to install lmlab.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

log = logging.getLogger("lmlab.native")

#: the build: optimised, position-independent, no fused multiply-add (the NumPy twins round each
#: multiply and add separately, and the kernels must give their very values)
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-ffp-contract=off")
SOURCES = Path(__file__).resolve().parent


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` (may hold arguments, e.g. ``ccache gcc``), else the first
    of ``cc``, ``gcc``, ``clang`` on the PATH; ``None`` when there is none."""
    if os.environ.get("CC"):
        command = shlex.split(os.environ["CC"])
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


def _build(source: Path, command: list[str]) -> Path:
    """The compiled library of ``source`` in the cache (built now unless already there)."""
    text = source.read_bytes()
    key = hashlib.sha256(b"\0".join([text, " ".join(command).encode(), " ".join(FLAGS).encode(),
                                     platform.system().encode(), platform.machine().encode()]))
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([*command, *FLAGS, "-o", partial, str(source)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{command[0]} failed: {(done.stderr or done.stdout).strip()[:500]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@cache
def load(name: str) -> ctypes.CDLL | None:
    """The kernel library ``<name>.c`` of this folder, built on first use; ``None`` (reason
    logged) where it cannot be built or loaded: the caller then uses its NumPy twin. Cached per
    process (``load.cache_clear()`` forgets it)."""
    if os.environ.get("LMLAB_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        log.info("native kernel %s: off (LMLAB_NATIVE=%s); using NumPy", name, os.environ["LMLAB_NATIVE"])
        return None
    if os.name == "nt":
        log.info("native kernel %s: not built on Windows; using NumPy", name)
        return None
    command = compiler()
    if command is None:
        log.info("native kernel %s: no C compiler (set CC or install cc); using NumPy", name)
        return None
    try:
        library = ctypes.CDLL(str(_build(SOURCES / f"{name}.c", command)))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("native kernel %s: not built (%s); using NumPy", name, exc)
        return None
    log.debug("native kernel %s: loaded", name)
    return library
