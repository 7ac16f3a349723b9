"""The machine policy: device, intra-op threads and precision, decided in one place.

The training loops (pretraining, fine-tuning, preference tuning), ``lmlab compress`` and the
benchmarks ask :func:`resolve` (or :func:`choose_threads`), and the commands that only need a
device :func:`pick_device`, so ``auto`` means the same everywhere. The answer is a :class:`Machine` with a
reason for each choice; runs write :meth:`Machine.record` into their metadata (``summary.json``,
``finetune.json``, the aligned model's summary) so a result says what it ran on. Nothing here is
timed: a probe on a busy machine measures the other processes, and its answer changes from run to
run. This module imports nothing from lmlab but its errors, so the models may use it, and torch only
when a function needs it, so the command line checks the thread variables before torch (and the
OpenMP runtime, which reads them too) is loaded.

* **Device.** ``auto`` = the CUDA device of this process's local rank when there is one, else
  the CPU. A named device that is not there is a one-line error.
* **Threads.** The first of these that is set applies, and the reason line names it:
  1. a count asked for: ``train.threads``, ``--threads``, a Python API's ``threads=`` (above 0);
  2. the environment: ``OMP_NUM_THREADS``, else ``MKL_NUM_THREADS`` (:data:`THREAD_VARIABLES`),
     a whole number from 1 (an OpenMP list ``4,2`` gives its first number; set but empty is
     refused, as OpenMP would print "Invalid value");
     any other value is a one-line error before any work, whichever count applies;
  3. a resumed run's count from its start (``keep``): its numbers do not change mid-run;
  4. ``0`` (auto) = the physical cores this process may run on (``os.sched_getaffinity``, SMT
     siblings once, the cgroup v2 CPU quota), shared among the processes of a distributed run on
     this node, at most :data:`MAX_AUTO_THREADS`, less the cores the rest of the machine keeps busy
     (the 1-minute load average), and never below 1. Threads that share their cores with other
     processes stall each other at every parallel region: on a busy 2-core machine gpt-tiny-clm
     trained at 10.0k tokens/s on 1 thread and 3.2k on 2 (PyTorch's own default is every logical
     CPU). In a container the load average is the host's: a busy host means 1 thread (set the
     count to use a quota the host's load does not touch).
  A count set earlier with ``torch.set_num_threads`` is not read: it is replaced by the above.
  :func:`set_threads` is the one place lmlab sets the count; the commands that run a model
  without training it get the same policy through :func:`pick_device`.
* **Precision.** ``auto`` = bfloat16 autocast on a CUDA GPU that has bfloat16, float32 everywhere
  else (CPUs included: autocast changes the numbers, and a whole training step of the small models
  gained nothing from it even on a CPU with AVX512-BF16). An explicit ``bf16`` or ``fp16`` is
  honoured (``bf16`` on a GPU without bfloat16 is an error).

>>> machine = resolve(device="cpu", threads=1, precision="auto")
>>> machine.record()["precision"]
'fp32'
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lmlab.errors import LmlabError

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_AUTO_THREADS",
    "PRECISION_NAMES",
    "THREAD_VARIABLES",
    "Machine",
    "available_cpus",
    "check_device",
    "choose_device",
    "choose_precision",
    "choose_threads",
    "physical_cores",
    "pick_device",
    "resolve",
    "set_threads",
    "threads_from_environment",
]

#: ``threads = 0`` never picks more: small models stop gaining well before, and a large machine's
#: other users keep the rest
MAX_AUTO_THREADS = 16
#: the environment variables that set a thread count, in the order they apply (PyTorch, OpenMP and
#: MKL read them too: lmlab honours what they would)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: the precision names; ``PRECISIONS`` (module attribute, made when first used: it needs torch) maps
#: each to its autocast dtype (None = plain float32)
PRECISION_NAMES = ("fp32", "bf16", "fp16")


def _precisions() -> dict[str, torch.dtype | None]:
    import torch

    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def __getattr__(name: str):
    if name == "PRECISIONS":
        return _precisions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- threads


def _cgroup_cpu_limit(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """CPUs allowed by a cgroup v2 quota (``"200000 100000"`` -> 2), None when unlimited/unknown."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def available_cpus() -> int:
    """Logical CPUs this process may run on: its affinity mask, capped by the cgroup v2 quota (not
    ``os.cpu_count()``, which counts the whole machine). The one count of CPUs for a number of
    worker processes (``data prepare --workers``, ``encode_many``); threads: :func:`choose_threads`."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity API
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    return max(1, min(n, quota) if quota else n)


def physical_cores() -> int:
    """Physical cores this process may use: affinity mask, SMT siblings once, cgroup quota."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity API
        return available_cpus()
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    n = max(1, len(cores))
    quota = _cgroup_cpu_limit()
    return min(n, quota) if quota else n


def _load_average() -> float:
    """The 1-minute load average: processes running or waiting to run (0 where unknown)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return 0.0


def threads_from_environment() -> tuple[int, str] | None:
    """``(threads, "OMP_NUM_THREADS=2")`` from the first of :data:`THREAD_VARIABLES` that is set,
    None when none is; a value that is not a whole number from 1 (an empty one too) is a one-line error
    (every one set is checked, the one that applies or not: the libraries read them too)."""
    found = None
    for name in THREAD_VARIABLES:
        if name not in os.environ:
            continue
        raw = os.environ[name]  # set but empty is no count either: OpenMP prints "Invalid value"
        first = raw.strip().split(",")[0].strip()  # OpenMP's nested list: 4,2 = 4 at the outer level
        if not (first.isascii() and first.isdigit()) or int(first) < 1:
            raise LmlabError(f"{name}={raw!r} is not a whole number of threads from 1",
                             f"set {name} to e.g. 2, or unset it (lmlab then chooses)")
        found = found or (int(first), f"{name}={raw.strip()}")
    return found


def choose_threads(requested: int | None = 0, local_world_size: int = 1,
                   keep: int | None = None) -> tuple[int, str]:
    """``(threads, reason)``: ``requested`` when above 0, else ``OMP_NUM_THREADS`` /
    ``MKL_NUM_THREADS``, else ``keep`` (a resumed run's count), else the automatic count (module doc)."""
    for value, what in ((requested, "thread count"), (keep, "kept thread count")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise LmlabError(f"{what} must be a whole number, got {type(value).__name__} {value!r}",
                             "pass e.g. --threads 2, or 0 for auto")
        if value is not None and value < 0:
            raise LmlabError(f"{what} must be 0 (auto) or more, got {value}",
                             "pass e.g. --threads 2, or 0 for auto")
    env = threads_from_environment()  # checked whichever applies
    if requested:
        ignored = f"; {env[1]} not used" if env and env[0] != requested else ""
        _note_oversubscribed(requested, "requested")
        return requested, f"{requested} (requested{ignored})"
    if env:
        _note_oversubscribed(env[0], env[1])
        return env[0], f"{env[0]} ({env[1]})"
    if keep:
        return keep, f"{keep} (as this run started; set the thread count or OMP_NUM_THREADS to change it)"
    processes = max(1, local_world_size)
    total = physical_cores()
    load = _load_average()
    cores = max(1, total // processes)
    free = (total - min(load, total)) / processes  # the cores the rest of the machine leaves idle
    n = max(1, min(cores, MAX_AUTO_THREADS, math.floor(free + 0.5)))
    share = f", {cores} for each of {processes} processes on this node" if processes > 1 else ""
    return n, (f"{n} (auto: {total} physical core(s) available to this process{share}, "
               f"load average {load:.1f}; set the thread count or OMP_NUM_THREADS to override)")


_noted: set[tuple[int, int]] = set()  # (threads, CPUs) already noted in this process


def _note_oversubscribed(n: int, source: str) -> None:
    """One ``note:`` line on stderr (once per process and count) when an explicit thread count
    exceeds the CPUs this process may run on (:func:`available_cpus`): it is honoured, as asked,
    but threads beyond the CPUs only wait for each other (a run several times slower)."""
    cpus = available_cpus()
    if n <= cpus or (n, cpus) in _noted:
        return
    _noted.add((n, cpus))
    print(f"note: {n} threads ({source}) exceed the {cpus} CPU{'s' if cpus != 1 else ''} available to "
          f"this process; honoured, but it may run much slower than with {cpus}", file=sys.stderr, flush=True)


def set_threads(n: int) -> None:
    """Set PyTorch's intra-op thread count: the one place lmlab does."""
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


# ----------------------------------------------------------------------------- device


def choose_device(requested: str = "auto", local_rank: int = 0, name: str = "device"
                  ) -> tuple[torch.device, str]:
    """``(device, reason)``: ``auto`` = CUDA (this local rank's GPU) when available, else the CPU;
    a named device is checked (``cuda`` alone means this local rank's GPU); an error names the
    setting ``name`` as the user wrote it (``--device``, ``finetune.device``)."""
    import torch

    if requested == "auto":
        if torch.cuda.is_available():
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            return device, f"{device} (auto: {torch.cuda.get_device_name(device)})"
        return torch.device("cpu"), "cpu (auto: no CUDA device)"
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as err:
        raise LmlabError(f"unknown {name} {requested!r}", "use auto, cpu, cuda, cuda:N or mps") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LmlabError(f"{name} {requested} asked for but CUDA is not available", f"use {name} cpu or auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise LmlabError(f"{name} {requested} asked for but MPS is not available", f"use {name} cpu or auto")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device, f"{device} (requested)"


def check_device(requested: str = "auto", name: str = "device") -> None:
    """Refuse a device this machine does not have, or a thread-count variable that is no count
    (``OMP_NUM_THREADS=abc``), in one line, before any work: a command that writes files, reads
    data or loads a model ahead of :func:`resolve`/:func:`pick_device` calls this first, so that a
    bad machine setting costs nothing and leaves nothing behind. ``name``: the setting as the user
    wrote it. A machine check: run where a command is about to run, never where a config is only
    read (a GPU run's config is read on a CPU to report it)."""
    choose_device(requested, name=name)
    threads_from_environment()


def pick_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    """The device of :func:`choose_device`, for a command that runs a model without training it
    (evaluate, generate, the harness): it also sets the thread count by the one policy
    (:func:`choose_threads`: ``OMP_NUM_THREADS``, else auto), as :func:`resolve` does for training."""
    device = choose_device(requested, local_rank)[0]
    set_threads(choose_threads(None)[0])
    return device


# ----------------------------------------------------------------------------- precision


def choose_precision(requested: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """``(autocast dtype or None for float32, reason)`` for ``requested`` in auto|fp32|bf16|fp16."""
    import torch

    if requested not in ("auto", *PRECISION_NAMES):
        raise LmlabError(f"unknown precision {requested!r}", "use auto, fp32, bf16 or fp16")
    cuda = device.type == "cuda"
    if requested == "auto":
        if cuda and torch.cuda.is_bf16_supported():
            return torch.bfloat16, "bf16 autocast (auto: this GPU has bfloat16)"
        where = "this GPU has no bfloat16" if cuda else f"bf16 autocast is for GPUs, not {device.type}"
        return None, f"fp32 (auto: {where})"
    if requested == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise LmlabError("precision bf16 was asked for but this GPU has no bfloat16", "use fp16 or fp32")
    if requested == "fp32":
        return None, "fp32 (requested)"
    return _precisions()[requested], f"{requested} autocast (requested)"


# ----------------------------------------------------------------------------- all together


@dataclass(frozen=True)
class Machine:
    """What :func:`resolve` decided: the device, the thread count, the autocast dtype (None =
    plain float32), and one reason per decision."""

    device: torch.device
    threads: int
    dtype: torch.dtype | None
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def precision(self) -> str:
        """``fp32``, ``bf16`` or ``fp16``."""
        return next(name for name, dtype in _precisions().items() if dtype is self.dtype)

    def autocast(self):
        """Context manager for the forward pass (a no-op in float32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def notes(self) -> list[str]:
        """One log line per decision: ``threads: 1 (auto: ...)``."""
        return [f"{what}: {why}" for what, why in self.reasons.items()]

    def record(self) -> dict:
        """The decisions as a run records them (JSON): device, threads, precision and the reasons."""
        return {"device": str(self.device), "threads": self.threads, "precision": self.precision,
                "reasons": dict(self.reasons)}


def resolve(device: str = "auto", threads: int | None = 0, precision: str = "auto",
            local_rank: int = 0, local_world_size: int = 1, keep_threads: int | None = None) -> Machine:
    """Choose the device, the thread count and the precision, set the thread count, return them.
    ``keep_threads``: the count a resumed run started with (:func:`choose_threads`' ``keep``)."""
    dev, device_reason = choose_device(device, local_rank)
    dtype, precision_reason = choose_precision(precision, dev)
    n, threads_reason = choose_threads(threads, local_world_size, keep_threads)
    set_threads(n)
    return Machine(dev, n, dtype, {"device": device_reason, "threads": threads_reason,
                                   "precision": precision_reason})
