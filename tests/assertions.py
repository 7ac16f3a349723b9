"""Assertions shared by the test modules."""

from __future__ import annotations


def assert_one_line_error(capsys, *needles) -> str:
    """The command's stderr is exactly one ``error: ...`` line containing every needle."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err

