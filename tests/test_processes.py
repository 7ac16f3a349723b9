"""Library calls that start worker processes, from scripts without ``if __name__ == "__main__":``
(issue 27, item 1): spawned workers run such a script again, and used to hang the caller for ever.
Each script runs in a subprocess; its timeout only guards against the old hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmlab import processes
from lmlab.errors import LmlabError

HANG_GUARD_S = 240  # far above what each script needs; reached only by a hang


@pytest.fixture()
def workdir(tmp_path):
    (tmp_path / "in.txt").write_text("\n\n".join(f"paragraph {i}: to be or not to be" for i in range(3000)),
                                     encoding="utf-8")
    from lmlab.tokenizers import train_tokenizer

    train_tokenizer("bpe", ["to be or not to be paragraph"] * 20, vocab_size=60).save(tmp_path / "tok")
    return tmp_path


def run_script(cwd: Path, source: str, stdin: bool = False) -> subprocess.CompletedProcess:
    source = textwrap.dedent(source)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if stdin:
        command, given = [sys.executable, "-"], source
    else:
        (cwd / "script.py").write_text(source, encoding="utf-8")
        command, given = [sys.executable, "script.py"], None
    try:
        return subprocess.run(command, cwd=cwd, input=given, capture_output=True, text=True, env=env,
                              timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired as e:  # the old behaviour: the caller waited for ever
        raise AssertionError(f"the script hung; stderr so far:\n{e.stderr}") from None


PREPARE = """\
    print("started")
    from lmlab.data import TokenShards, prepare_shards
    summary = prepare_shards("tok", ["in.txt"], "shards", val_fraction=0.05, workers=2)
    print(summary.report())
    print("tokens", TokenShards("shards", "train").num_tokens)
"""


def check_one_run(result: subprocess.CompletedProcess, cwd: Path) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("started") == 1, result.stdout  # the script ran once, not once per worker
    assert "bootstrapping" not in result.stderr
    assert sorted(p.name for p in cwd.iterdir() if p.name.startswith(".")) == []  # no .shards.tmp-*


def test_prepare_shards_from_an_unguarded_script_forks_and_finishes(workdir):
    result = run_script(workdir, PREPARE)
    check_one_run(result, workdir)
    assert "2 workers" in result.stdout and "note:" not in result.stderr


def test_prepare_shards_piped_to_python_finishes(workdir):
    result = run_script(workdir, PREPARE, stdin=True)
    check_one_run(result, workdir)


def test_without_a_safe_fork_the_work_stays_in_the_caller_with_a_note(workdir):
    """Another thread running: no fork (it could copy a held lock), and spawn would run the script
    again, so the shards are made in the caller; the note names the fix."""
    thread = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    result = run_script(workdir, thread + textwrap.dedent(PREPARE))
    check_one_run(result, workdir)
    assert "1 worker)" in result.stdout
    note = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and 'if __name__ == "__main__":' in note[0] and "other threads" in note[0]


def test_a_guarded_script_still_gets_spawned_workers(workdir):
    result = run_script(workdir, """\
        from lmlab.data import prepare_shards

        def main():
            print("started")
            print(prepare_shards("tok", ["in.txt"], "shards", val_fraction=0.05, workers=2).report())

        if __name__ == "__main__":
            main()
    """)
    check_one_run(result, workdir)
    assert "2 workers" in result.stdout and "note:" not in result.stderr


def test_tokenizer_training_and_encode_many_from_an_unguarded_script(workdir):
    result = run_script(workdir, """\
        import threading, time
        print("started")
        from lmlab.tokenizers import train_tokenizer
        texts = [f"line {i} to be or not to be" for i in range(5000)]
        tok = train_tokenizer("bpe", texts, vocab_size=80, workers=2)      # counts on 2 processes
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # no fork from here on
        assert tok.encode_many(texts, workers=2, chunk_size=500) == [tok.encode(t) for t in texts]
        print("same ids")
    """)
    check_one_run(result, workdir)
    assert "same ids" in result.stdout
    assert result.stderr.count("note: encode_many runs in this one process") == 1


# --------------------------------------------------------------------------- the decisions


def test_guarded_spans_find_the_main_guard_either_way_round(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('import os\nx = 1\nif __name__ == "__main__":\n    run()\n    done()\n'
                 "if '__main__' == __name__:\n    again()\nif __name__ != '__main__':\n    no()\n",
                 encoding="utf-8")
    assert processes.guarded_spans(str(f)) == [(4, 5), (7, 7)]
    assert processes.guarded_spans(str(tmp_path / "missing.py")) is None
    assert processes.guarded_spans("<stdin>") is None


@pytest.mark.parametrize(("spec", "file", "runs_again"), [
    ("pkg.tool", "/x/pkg/tool.py", True),        # python -m pkg.tool
    ("pkg.__main__", "/x/pkg/__main__.py", False),  # python -m pkg
    (None, "/x/script.py", True),                # python script.py
    (None, "<stdin>", True),                     # python - (spawn would try to run '<stdin>')
    (None, None, False),                         # python -c, the REPL
])
def test_which_main_modules_a_spawned_worker_runs_again(monkeypatch, spec, file, runs_again):
    import types

    main = types.ModuleType("__main__")
    main.__spec__ = None if spec is None else types.SimpleNamespace(name=spec)
    if file is not None:
        main.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert processes.main_runs_again_in_workers() is runs_again


def test_this_test_run_counts_as_guarded():
    """pytest's own entry point is guarded (or a package's __main__): spawn stays the choice."""
    assert processes.called_from_unguarded_main() is False
    assert processes.start_method("x", 2) in ("spawn", "fork")


def _exit_now(_):
    os._exit(3)


def test_a_dead_worker_is_a_one_line_error_not_a_hang():
    with pytest.raises(LmlabError, match="a worker process of the test ended before its work was done"):
        with processes.worker_pool("spawn", 1, "the test") as pool:
            list(processes.ordered_results(pool, _exit_now, range(3), ahead=2))


def test_ordered_results_keep_the_order_and_bound_the_look_ahead():
    from concurrent.futures import ThreadPoolExecutor

    read = []

    def items():
        for i in range(10):
            read.append(i)
            yield i

    with ThreadPoolExecutor(2) as pool:
        results = processes.ordered_results(pool, lambda x: x * x, items(), ahead=3)
        assert next(results) == 0 and len(read) == 3
        assert list(results) == [x * x for x in range(1, 10)]


def test_counting_on_two_processes_gives_the_same_counts_in_the_same_order():
    from lmlab.tokenizers.counting import count_chunks
    from lmlab.tokenizers.pretokenize import whitespace_split

    texts = [f"line {i % 17} to be or not {i % 5}" for i in range(300)]
    one = count_chunks(texts, whitespace_split)
    two = count_chunks(iter(texts), whitespace_split, workers=2, batch_size=40)
    assert list(two.items()) == list(one.items())
