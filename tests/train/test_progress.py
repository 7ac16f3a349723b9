"""One progress display for every loop: a bar on a terminal, else a line every ~5% of the steps."""

from __future__ import annotations

from lmlab.progress import Progress


def test_without_a_terminal_a_line_every_twentieth_of_the_run_and_none_at_the_end():
    lines = []
    p = Progress(100, desc="x", show="auto", log=lines.append)  # pytest's stderr is no terminal
    for step in range(1, 101):
        p.update(step, [f"loss {1 / step:.4f}"], loss="-")
    p.close()
    assert [int(line.split()[1].split("/")[0]) for line in lines] == list(range(5, 100, 5))
    assert lines[0].startswith("step 5/100: loss 0.2000, about ") and lines[0].endswith(" s left")


def test_a_resumed_run_counts_from_where_it_stands_and_off_means_silent():
    lines = []
    p = Progress(40, initial=30, desc="x", show="auto", log=lines.append)
    for step in range(31, 41):
        p.update(step)
    assert [line.split(":")[0] for line in lines] == ["step 32/40", "step 34/40", "step 36/40", "step 38/40"]
    quiet = []
    q = Progress(40, desc="x", show="off", log=quiet.append)
    for step in range(1, 41):
        q.update(step)
    q.write("a message")
    assert quiet == ["a message"]  # messages still reach the log; progress does not


def test_a_count_that_jumps_still_gets_a_line_at_each_mark_it_passes(monkeypatch):
    """Bytes of text advance by a document at a time: a ~5% mark passed between two updates gets
    its line (before: a line only when the count landed exactly on a multiple, so almost never)."""
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    lines: list[str] = []
    progress = Progress(100, desc="tokenizing", show="auto", log=lines.append, unit="byte")
    for done in (7, 33, 34, 100):
        progress.update(done)
    progress.close()
    assert [line.split(":")[0] for line in lines] == ["byte 7/100", "byte 33/100"]


def test_a_short_loop_still_gets_at_most_a_line_per_twentieth():
    """probe10b: 37 tokenizer merges printed 36 lines (a line every step below 40 steps), not one
    every ~5%."""
    lines: list[str] = []
    p = Progress(37, desc="merges", show="auto", log=lines.append, unit="merge")
    for step in range(1, 38):
        p.update(step)
    p.close()
    assert len(lines) == 19, lines  # the marks 1..19 of 20 passed before the end
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert steps == sorted(set(steps)) and steps[0] == 2
