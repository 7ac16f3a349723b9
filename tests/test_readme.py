"""README examples are executed, so the documentation cannot rot.

Every ```python block in README.md runs in order in one namespace, in a temporary directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples():
    assert len(python_blocks()) >= 1


def test_readme_python_examples_run(tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMLAB_DATA", str(data_dir))
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"README python block {i + 1} failed: {e!r}\n{block}") from e
    assert os.getcwd() == str(tmp_path)
