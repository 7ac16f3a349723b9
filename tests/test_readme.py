"""The documentation's Python examples run as written, so they cannot rot.

Every ```python block of README.md and docs/*.md runs as part of one script per file: the file's
blocks in order, saved as ``example.py`` in a fresh temporary directory and run with
``python example.py`` in a subprocess, as a reader would copy them (no ``__main__`` guard, so
library calls that start processes are exercised from an unguarded script). ``$LMLAB_DATA``
points at the real data, and ``configs/`` is there as in the repository's root folder. A block
preceded by ``<!-- example: skip (reason) -->`` is not run (kept for the few that need a large
download or hours); a block preceded by ``<!-- example: file PATH -->`` is one file of a package
(a model family's folder, which a script cannot hold), not run here: it must equal the repository's
file PATH, which a test runs; a block written as ```text is not Python at all (a signature, an output). A
comment ``# prints: TEXT`` promises that TEXT is a line of the output; the promises of a page are
checked in order, so a comment cannot show something other than what the code prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SKIP = re.compile(r"<!--\s*example:\s*skip\b[^>]*-->\s*$")
FILE = re.compile(r"<!--\s*example:\s*file\s+(\S+)\s*-->\s*$")
PRINTS = re.compile(r"#\s*prints:\s*(.*?)\s*$", re.M)
HANG_GUARD_S = 600  # far above any page's run time; reached only by a hang
#: skipped blocks allowed in all the pages together ("few")
MAX_SKIPPED = 4


def _marked(page: Path):
    """``(line, code, the comment line before the block)`` of every Python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    for m in BLOCK.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        yield text.count("\n", 0, m.start()) + 2, m.group(1), before


def blocks(page: Path) -> list[tuple[int, str, bool]]:
    """``(line, code, skipped)`` of every Python block of ``page`` that is not a package's file."""
    return [(line, code, bool(SKIP.search(before))) for line, code, before in _marked(page)
            if not FILE.search(before)]


def file_blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(line, code, path)`` of the blocks of ``page`` that show a repository file."""
    return [(line, code, FILE.search(before).group(1)) for line, code, before in _marked(page)
            if FILE.search(before)]


def script(page: Path) -> str:
    """The page's runnable blocks as one script, each introduced by a comment naming its line."""
    name = page.relative_to(ROOT)
    parts = [f"# {name}, line {line}\n{code}" for line, code, skipped in blocks(page) if not skipped]
    return "\n".join(parts)


def promised_lines(page: Path) -> list[str]:
    """The ``# prints: TEXT`` promises of the page's runnable blocks, in order."""
    return [text for _, code, skipped in blocks(page) if not skipped for text in PRINTS.findall(code)]


def unkept_promises(promises: list[str], output: str) -> list[str]:
    """The promises that are not output lines in their order (each after the line of the one before)."""
    lines = [line.strip() for line in output.splitlines()]
    missing, at = [], 0
    for text in promises:
        if text in lines[at:]:
            at += lines[at:].index(text) + 1
        else:
            missing.append(text)
    return missing


PAGES_WITH_CODE = [p for p in PAGES if any(not skipped for _, _, skipped in blocks(p))]


def test_the_pages_have_examples_and_few_are_skipped():
    assert (ROOT / "README.md") in PAGES_WITH_CODE and len(PAGES_WITH_CODE) >= 15
    skipped = [(p.name, line) for p in PAGES for line, _, s in blocks(p) if s]
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_blocks_are_found_with_their_lines_and_skip_marks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("intro\n```python\nx = 1\n```\n<!-- example: skip (needs a GPU) -->\n"
                    "```python\ny = 2\n```\n```text\nnot python\n```\n", encoding="utf-8")
    assert blocks(page) == [(3, "x = 1\n", False), (7, "y = 2\n", True)]


def test_a_block_marked_as_a_file_is_not_run_and_must_equal_that_file(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- example: file pkg/mod.py -->\n```python\nfrom . import x\n```\n"
                    "```python\ny = 2\n```\n", encoding="utf-8")
    assert blocks(page) == [(6, "y = 2\n", False)]
    assert file_blocks(page) == [(3, "from . import x\n", "pkg/mod.py")]


@pytest.mark.parametrize("page", [p for p in PAGES if file_blocks(p)], ids=lambda p: p.name)
def test_blocks_showing_a_file_show_it_as_it_is(page):
    for line, code, path in file_blocks(page):
        source = ROOT / path
        assert source.is_file(), f"{page.name}, line {line}: no file {path}"
        shown = source.read_text(encoding="utf-8").rstrip()
        assert code.rstrip() == shown, f"{page.name}, line {line}: {path}"


def test_printed_comments_are_checked_in_order():
    assert unkept_promises(["a", "[1, 2]"], "a\nnoise\n [1, 2]\n") == []
    assert unkept_promises(["[1, 2]", "a"], "a\n[1, 2]\n") == ["a"]       # out of order
    assert unkept_promises(["['Sh', 'all']"], "['S', 'hall']\n") == ["['Sh', 'all']"]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda p: p.name)
def test_page_examples_run_as_a_script(page, tmp_path, data_dir):
    (tmp_path / "example.py").write_text(script(page), encoding="utf-8")
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    env = {**os.environ, "LMLAB_DATA": str(data_dir), "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{page.name}: the examples hung\n{e.stdout}\n{e.stderr}") from None
    assert done.returncode == 0, f"{page.name}: the examples failed\n{done.stdout}\n{done.stderr[-4000:]}"
    missing = unkept_promises(promised_lines(page), done.stdout)
    assert missing == [], f"{page.name}: '# prints:' comments that the output lacks: {missing}\n{done.stdout}"
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert leftovers == [], f"{page.name} left temporaries behind: {leftovers}"
