"""The grammar node of a JSON number within optional bounds (see :mod:`lmlab.generate.grammar`)."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

from lmlab.errors import LmlabError
from lmlab.generate.grammar_base import MAX_FRAC_DIGITS, MAX_INT_DIGITS, OK, PASS, Node


class Number(Node):
    """A JSON number (or integer) within optional bounds, written without exponent.

    State: the bytes so far. A prefix is kept only while some completion (at most
    ``MAX_INT_DIGITS`` integer and ``MAX_FRAC_DIGITS`` fraction digits) lands within the bounds;
    :meth:`finish_cost` finds the cheapest such completion by treating each completion shape
    (``j`` more integer digits, optionally ``.`` and ``k`` fraction digits) as an arithmetic
    progression of values and testing whether it meets the bounds.
    """

    _SHAPE = re.compile(rb"(-?)(0|[1-9][0-9]*)?(\.[0-9]*)?")

    def __init__(self, integer: bool, lo=None, hi=None, lo_excl=False, hi_excl=False):
        self.integer = integer
        self.lo = None if lo is None else Fraction(lo)
        self.hi = None if hi is None else Fraction(hi)
        self.lo_excl, self.hi_excl = lo_excl, hi_excl
        self.initial = b""
        self.finish_cost = lru_cache(maxsize=None)(self._finish_cost)   # type: ignore[method-assign]
        cost = self.finish_cost(b"")
        if cost is None:
            raise LmlabError("no number satisfies the bounds", "check minimum/maximum")
        self.min_cost = cost

    def feed(self, state, b: int) -> list[tuple]:
        if b in b"-.0123456789":
            q = (state[0], state[1] + bytes((b,))) if isinstance(state, tuple) else state + bytes((b,))
            if self.finish_cost(q) is not None:
                return [(OK, self._canonical(q))]
        return [(PASS,)] if self.finish_cost(state) == 0 else []

    def _canonical(self, q):
        """Once every completion of ``q`` lies within the bounds, only the *shape* of ``q`` matters:
        ``("free", shape)`` with every digit but a lone leading 0 written as 1. This keeps the
        number of distinct parser states (and so of cached token tables) small."""
        if isinstance(q, tuple):
            q = q[1]
        elif not self._always_within(q):
            return q
        shape = re.sub(rb"[1-9]", b"1", q)
        shape = re.sub(rb"(?<=[0-9.])0", b"1", shape)
        return ("free", shape)

    def _always_within(self, p: bytes) -> bool:
        m = self._SHAPE.fullmatch(p)
        digits = m.group(2) if m else None
        if digits is None:
            return self.lo is None and self.hi is None
        sign = -1 if m.group(1) else 1
        frac = m.group(3)
        top = Fraction(0 if self.integer else 1)       # what a fraction can still add
        if frac is not None:
            low = Fraction(p.lstrip(b"-").decode())
            high = low + Fraction(1, 10 ** (len(frac) - 1))
        elif digits == b"0":
            low, high = Fraction(0), top
        else:
            room = MAX_INT_DIGITS - len(digits)
            low, high = Fraction(int(digits)), Fraction((int(digits) + 1) * 10 ** room) - 1 + top
        lo_v, hi_v = (low, high) if sign > 0 else (-high, -low)
        if self.lo is not None and (lo_v < self.lo or (self.lo_excl and lo_v == self.lo)):
            return False
        return self.hi is None or hi_v < self.hi or (not self.hi_excl and hi_v == self.hi)

    def _finish_cost(self, p) -> int | None:
        """Fewest bytes appended to ``p`` giving a number within bounds; None if impossible."""
        free = isinstance(p, tuple)
        if free:
            p = p[1]
        if p == b"":
            costs = [c for c in (self._finish_cost_unsigned(b"", 1), self._plus1(self.finish_cost(b"-")))
                     if c is not None]
            return min(costs) if costs else None
        m = self._SHAPE.fullmatch(p)
        if m is None or (m.group(3) is not None and (self.integer or m.group(2) is None)):
            return None
        digits = m.group(2) or b""
        frac = m.group(3)
        if len(digits) > MAX_INT_DIGITS or (frac is not None and len(frac) - 1 > MAX_FRAC_DIGITS):
            return None
        if free:
            return 1 if p.endswith((b".", b"-")) else 0
        return self._finish_cost_unsigned(p[1:] if m.group(1) else p, -1 if m.group(1) else 1)

    @staticmethod
    def _plus1(c):
        return None if c is None else c + 1

    def _finish_cost_unsigned(self, p: bytes, sign: int) -> int | None:
        lo, hi, lo_x, hi_x = self.lo, self.hi, self.lo_excl, self.hi_excl
        if lo is None and hi is None:     # unbounded: one more digit completes any prefix but "x."
            return 1 if p == b"" or p.endswith(b".") else 0
        if sign < 0:   # bounds on the magnitude of a negative number
            lo, hi, lo_x, hi_x = (None if hi is None else -hi), (None if lo is None else -lo), hi_x, lo_x
        best = None

        def consider(cost, start, stop, step):
            nonlocal best
            if (best is None or cost < best) and _meets(start, stop, step, lo, hi, lo_x, hi_x):
                best = cost

        if b"." in p:
            int_part, frac = p.split(b".")
            f0 = len(frac)
            value = Fraction(int(int_part)) + (Fraction(int(frac), 10 ** f0) if frac else 0)
            for k in range(1 if f0 == 0 else 0, MAX_FRAC_DIGITS - f0 + 1):
                step = Fraction(1, 10 ** (f0 + k))
                consider(k, value, value + (10 ** k - 1) * step, step)
            return best
        d = p
        shapes = []    # (extra digits, lowest magnitude, highest magnitude)
        if d == b"":
            shapes.append((1, 0, 0))
            shapes += [(j, 10 ** (j - 1), 10 ** j - 1) for j in range(1, MAX_INT_DIGITS + 1)]
        elif d == b"0":
            shapes.append((0, 0, 0))
        else:
            base = int(d)
            shapes += [(j, base * 10 ** j, base * 10 ** j + 10 ** j - 1)
                       for j in range(MAX_INT_DIGITS - len(d) + 1)]
        for j, a, z in shapes:
            consider(j, Fraction(a), Fraction(z), Fraction(1))
            if not self.integer:
                for k in range(1, MAX_FRAC_DIGITS + 1):
                    step = Fraction(1, 10 ** k)
                    consider(j + 1 + k, Fraction(a), Fraction(z) + 1 - step, step)
        return best


def _meets(start, stop, step, lo, hi, lo_excl, hi_excl) -> bool:
    """Does ``start, start+step, ..., <= stop`` hold a value within the bounds?"""
    x = start
    if lo is not None and (x < lo or (lo_excl and x == lo)):
        n = math.ceil((lo - start) / step)
        x = start + n * step
        if lo_excl and x == lo:
            x += step
    if x > stop:
        return False
    return hi is None or x < hi or (not hi_excl and x == hi)
