"""Worker processes that start safely from any caller, a script without a ``__main__`` guard included.

The ``spawn`` start method (macOS, Windows, and lmlab's choice where the caller may run threads)
and ``forkserver`` (Linux's default from Python 3.14) begin every worker by running the caller's
main module again, as ``__mp_main__``. A script that calls lmlab at its top level, without
``if __name__ == "__main__":``, is run once more in each worker: it retrains what it trained,
prints what it printed, and when it reaches the call that starts processes the worker fails
("bootstrapping phase"); a ``multiprocessing.Pool`` replaces such a worker again and again, so the
caller waited for ever.

:func:`start_method` decides before anything starts:

* a caller whose main module a new interpreter would not run again (``python -c``, a REPL, a
  notebook, ``python -m package``, a test runner, a call under the guard): ``spawn``, or ``fork``
  when the caller prefers it and it is safe;
* a call from a script's unguarded top level: ``fork`` where it is safe (Linux, no other Python
  thread), since a forked worker is a copy of the caller and runs nothing again;
* otherwise no worker process: the work runs in the caller, after a one-line note on stderr that
  names the fix.

:func:`worker_pool` is a process pool that cannot hang: a worker that dies, at its start or later,
ends the call with a one-line error instead of being replaced for ever.
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
import threading
import tokenize
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import current_process, get_all_start_methods, get_context
from typing import Any

from lmlab.errors import LmlabError

GUARD_FIX = 'put the call under `if __name__ == "__main__":`'


def fork_is_safe() -> bool:
    """Fork on Linux while this process runs a single Python thread (forking a process with other
    threads risks copying a lock that one of them holds; macOS's system libraries are not fork-safe)."""
    return (sys.platform.startswith("linux") and "fork" in get_all_start_methods()
            and threading.active_count() == 1)


def main_runs_again_in_workers() -> bool:
    """Whether a spawned (or forkserver) worker would run the main module again, as multiprocessing
    decides it: a main module run from a file or by module name, but not a package's ``__main__``
    (``python -m pkg``), ``python -c`` or an interactive session."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return not (name == "__main__" or name.endswith(".__main__"))
    path = getattr(main, "__file__", None)
    return path is not None and os.path.splitext(os.path.basename(path))[0] != "ipython"


def _main_module_line() -> int | None:
    """The line of the main module's top-level code that the main thread is running now, or None
    when that code is not running (it has finished)."""
    main_globals = getattr(sys.modules.get("__main__"), "__dict__", None)
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def guarded_spans(path: str) -> list[tuple[int, int]] | None:
    """The line ranges of the bodies of ``if __name__ == "__main__":`` in the Python file ``path``,
    or None when it cannot be read as Python (``<stdin>``, a file that is gone)."""
    try:
        with tokenize.open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    return [(node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
            for node in ast.walk(tree) if isinstance(node, ast.If) and _is_main_test(node.test)]


def called_from_unguarded_main() -> bool:
    """True when a spawned worker would run again the top-level code that is running now: the main
    module runs again in workers (:func:`main_runs_again_in_workers`) and the line its top level
    is at lies outside every ``if __name__ == "__main__":`` (or its source cannot be read)."""
    if not main_runs_again_in_workers():
        return False
    line = _main_module_line()
    spans = guarded_spans(getattr(sys.modules["__main__"], "__file__", None) or "")
    if line is None or spans is None:
        return True
    return not any(a <= line <= b for a, b in spans)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)


def start_method(what: str, workers: int, prefer_fork: bool = False) -> str | None:
    """How to start ``workers`` processes for ``what`` now: ``"fork"``, ``"spawn"``, or None (do the
    work in this process). See the module docstring; a None that costs speed is said on stderr."""
    if current_process().daemon:  # a pool's worker may not start processes of its own
        return None
    if fork_is_safe() and (prefer_fork or called_from_unguarded_main()):
        return "fork"
    if not called_from_unguarded_main():
        return "spawn"
    _note(f"{what} runs in this one process, not {workers}: this script calls lmlab from its top level, "
          "which every new worker process would run again, and forking is not safe here "
          f"({'other threads are running' if sys.platform.startswith('linux') else sys.platform}); "
          f"{GUARD_FIX} to use {workers} processes")
    return None


@contextlib.contextmanager
def worker_pool(method: str, workers: int, what: str, initializer: Callable[..., Any] | None = None,
                initargs: tuple = ()) -> Iterator[Any]:
    """A ``ProcessPoolExecutor`` of ``workers`` processes started with ``method``, its workers up
    and initialised before the block runs. A worker that dies ends the block with a one-line
    error (multiprocessing's ``Pool`` would start a new one for ever); leaving the block cancels
    the work not yet started and waits for the workers to end."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(workers, mp_context=get_context(method), initializer=initializer,
                               initargs=initargs)
    try:
        pool.submit(os.getpid).result()  # forks every worker now, before any thread of the pool starts
        yield pool
    except BrokenProcessPool:
        raise LmlabError(f"a worker process of {what} ended before its work was done (killed, out of "
                         "memory, or it could not start)",
                         f"if this is a script, {GUARD_FIX}; or use one worker") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def ordered_results(pool, fn: Callable[[Any], Any], items: Iterable[Any], ahead: int) -> Iterator[Any]:
    """``map(fn, items)`` on ``pool``, results in input order, at most ``ahead`` items in flight (so
    a long stream of items is never read into memory at once)."""
    pending: deque = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
