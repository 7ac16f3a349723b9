"""Assertions shared by the test modules."""

from __future__ import annotations


def assert_one_line_error(capsys, *needles) -> str:
    """The command's stderr is exactly one ``error: ...`` line containing every needle."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err



def exit_code(argv: list[str]) -> int:
    """``lmlab ARGV``'s exit code, run in-process: what ``main`` returns, or the code of the
    ``SystemExit`` argparse raises for a flag whose value is refused as it is parsed."""
    from lmlab.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code
