"""What every node of :mod:`lmlab.generate.grammar` shares: the parser's actions, the bytes it
knows by name, the number limits and the :class:`Node` contract (see that module's docstring)."""

from __future__ import annotations

from typing import Any

OK, CALL, POP, PASS = 0, 1, 2, 3
SPACE, QUOTE, BACKSLASH = 0x20, 0x22, 0x5C
MAX_INT_DIGITS, MAX_FRAC_DIGITS = 15, 6


# --------------------------------------------------------------------------- grammar nodes
class Node:
    """A JSON value's byte automaton (see the module docstring)."""

    initial: Any = None
    min_cost: int = 0          # bytes of the shortest valid value

    def feed(self, state, b: int) -> list[tuple]:
        raise NotImplementedError

    def finish_cost(self, state) -> int:
        raise NotImplementedError
