"""A byte-level grammar for JSON values, and the pushdown parser that runs it one byte at a time.

A grammar is a tree of nodes. Each node is a small deterministic automaton over the UTF-8 bytes
of its JSON value:

* ``initial`` - its state before the value's first byte;
* ``feed(state, byte)`` - a list of *actions* (several = nondeterminism, e.g. enum ``1`` vs ``12``):
  ``(OK, state')`` the byte was consumed; ``(CALL, state', child)`` push ``child`` and let it
  consume the byte, then resume in ``state'`` when the child is done; ``(POP,)`` the byte
  was consumed and the value is complete; ``(PASS,)`` the value was already complete and the
  byte belongs to the parent (how a number learns that it ended);
* ``finish_cost(state)`` - the fewest bytes that complete the value from ``state`` (0 = complete).

The parser keeps a set of stacks of ``(node, state)`` frames, the root first; the sum of
``finish_cost`` over a stack is the length of the shortest valid completion.
:mod:`lmlab.generate.json_schema` compiles a JSON Schema into these nodes and
:mod:`lmlab.generate.constrained` lifts the parser from bytes to tokens.
The node contract and the parser's actions are in :mod:`lmlab.generate.grammar_base`, the
number node in :mod:`lmlab.generate.grammar_number`; both are importable from here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from lmlab.generate.grammar_base import (  # noqa: F401 (re-exported: the grammar's names live here)
    BACKSLASH,
    CALL,
    MAX_FRAC_DIGITS,
    MAX_INT_DIGITS,
    OK,
    PASS,
    POP,
    QUOTE,
    SPACE,
    Node,
)
from lmlab.generate.grammar_number import Number  # noqa: F401 (re-exported)


# --------------------------------------------------------------------------- grammar nodes
class AnyOf(Node):
    """A value matching any of ``options``; the parser follows all of them at once."""

    def __init__(self, options: list[Node]):
        self.options = [o for opt in options for o in (opt.options if isinstance(opt, AnyOf) else [opt])]
        self.min_cost = min(o.min_cost for o in self.options)


class Literal(Node):
    """One of a fixed set of serialized values (enum, const, true/false, null). State: bytes so far."""

    def __init__(self, values: list[bytes]):
        self.values = tuple(dict.fromkeys(values))
        self.initial = b""
        self.min_cost = min(len(v) for v in self.values)

    def feed(self, state: bytes, b: int) -> list[tuple]:
        q = state + bytes((b,))
        acts = [(POP,)] if q in self.values else []
        if any(len(v) > len(q) and v.startswith(q) for v in self.values):
            acts.append((OK, q))
        return acts

    def finish_cost(self, state: bytes) -> int:
        return min(len(v) - len(state) for v in self.values if v.startswith(state))


class String(Node):
    """A JSON string of ``min_len``..``max_len`` characters.

    States: -1 before the opening quote; ``n`` inside after ``n`` characters; ``("e", n)`` after a
    backslash; ``("u", n, need, lo, hi)`` inside a multi-byte UTF-8 character that needs ``need``
    more bytes, the next in ``lo..hi`` (RFC 3629 table: no overlongs, surrogates or > U+10FFFF).
    """

    _UTF8_LEAD = {**{b: (1, 0x80, 0xBF) for b in range(0xC2, 0xE0)}, 0xE0: (2, 0xA0, 0xBF),
                  **{b: (2, 0x80, 0xBF) for b in (*range(0xE1, 0xED), 0xEE, 0xEF)}, 0xED: (2, 0x80, 0x9F),
                  0xF0: (3, 0x90, 0xBF), 0xF1: (3, 0x80, 0xBF), 0xF2: (3, 0x80, 0xBF), 0xF3: (3, 0x80, 0xBF),
                  0xF4: (3, 0x80, 0x8F)}
    _ESCAPES = frozenset(b'"\\/bfnrt')

    def __init__(self, min_len: int, max_len: int):
        self.min_len, self.max_len = min_len, max_len
        self.initial = -1
        self.min_cost = 2 + min_len

    def feed(self, state, b: int) -> list[tuple]:
        if state == -1:
            return [(OK, 0)] if b == QUOTE else []
        if isinstance(state, int):
            n = state
            if b == QUOTE:
                return [(POP,)] if n >= self.min_len else []
            if n >= self.max_len:
                return []
            if b == BACKSLASH:
                return [(OK, ("e", n))]
            if 0x20 <= b < 0x7F:
                return [(OK, n + 1)]
            lead = self._UTF8_LEAD.get(b)
            return [(OK, ("u", n + 1) + lead)] if lead else []
        if state[0] == "e":
            return [(OK, state[1] + 1)] if b in self._ESCAPES else []
        _, n, need, lo, hi = state
        if not lo <= b <= hi:
            return []
        return [(OK, n if need == 1 else ("u", n, need - 1, 0x80, 0xBF))]

    def finish_cost(self, state) -> int:
        if state == -1:
            return self.min_cost
        if isinstance(state, int):
            return max(0, self.min_len - state) + 1
        if state[0] == "e":
            return 1 + max(0, self.min_len - state[1] - 1) + 1
        return state[2] + max(0, self.min_len - state[1]) + 1



class Array(Node):
    """``[item, ...]`` with ``min_items``..``max_items`` items; at most one space between parts."""

    def __init__(self, item: Node, min_items: int, max_items: int):
        self.item, self.min_items, self.max_items = item, min_items, max_items
        self.initial = ("open",)
        self.min_cost = self.finish_cost(self.initial)

    def feed(self, state, b: int) -> list[tuple]:
        phase = state[0]
        if phase == "open":
            return [(OK, ("first", 0))] if b == 0x5B else []
        ws = state[-1]
        if b == SPACE:
            return [(OK, state[:-1] + (1,))] if ws == 0 else []
        if phase == "first":
            if b == 0x5D:
                return [(POP,)] if self.min_items == 0 else []
            return [(CALL, ("after", 1, 0), self.item)] if self.max_items >= 1 else []
        count = state[1]
        if phase == "after":
            if b == 0x2C:
                return [(OK, ("next", count, 0))] if count < self.max_items else []
            if b == 0x5D:
                return [(POP,)] if count >= self.min_items else []
            return []
        return [(CALL, ("after", count + 1, 0), self.item)]             # phase "next"

    def finish_cost(self, state) -> int:
        item = self.item.min_cost
        if state[0] == "open":
            return 2 + self.min_items * item + max(self.min_items - 1, 0)
        if state[0] == "first":
            return 1 + self.min_items * item + max(self.min_items - 1, 0)
        count = state[1]
        if state[0] == "after":
            return max(0, self.min_items - count) * (item + 1) + 1
        return item + max(0, self.min_items - count - 1) * (item + 1) + 1


class Object(Node):
    """``{"key": value, ...}`` with the declared properties in order.

    The next key may be any property from the current position up to the first required one not
    yet written (optional ones can be skipped, required ones cannot). States: ``("open",)``,
    ``("first", ws)`` after ``{``, ``("key", j, bytes)`` while matching a quoted key among the
    candidates from ``j``, ``("colon", i, ws)``, ``("value", i, ws)``, ``("after", j, ws)`` after a
    value (``j`` = next property index), ``("next", j, ws)`` after a comma.
    """

    def __init__(self, props: list[tuple[str, Node]], required: set[str]):
        self.keys = [json.dumps(k, ensure_ascii=False).encode() for k, _ in props]
        self.values = [v for _, v in props]
        n = len(props)
        req = [k in required for k, _ in props]
        # candidates for the next key from position j: j .. first required index >= j
        self.first_req = [n] * (n + 1)
        for j in range(n - 1, -1, -1):
            self.first_req[j] = j if req[j] else self.first_req[j + 1]
        inf = float("inf")
        self.after_cost = [0.0] * (n + 1)
        self.next_cost = [inf] * (n + 1)
        for j in range(n, -1, -1):
            entries = (self._entry(i) + self.after_cost[i + 1] for i in self._cands(j))
            self.next_cost[j] = min(entries, default=inf)
            close = 1 if self.first_req[j] == n else inf
            self.after_cost[j] = min(close, 1 + self.next_cost[j])
        self.initial = ("open",)
        self.min_cost = 1 + int(min(1 if self.first_req[0] == n else inf, self.next_cost[0]))

    def _cands(self, j: int) -> range:
        return range(j, min(self.first_req[j] + 1, len(self.keys)))

    def _entry(self, i: int) -> int:
        return len(self.keys[i]) + 1 + self.values[i].min_cost

    def feed(self, state, b: int) -> list[tuple]:
        phase = state[0]
        if phase == "open":
            return [(OK, ("first", 0))] if b == 0x7B else []
        if phase == "key":
            _, j, m = state
            q = m + bytes((b,))
            for i in self._cands(j):
                if self.keys[i] == q:
                    return [(OK, ("colon", i, 0))]
            return [(OK, ("key", j, q))] if any(self.keys[i].startswith(q) for i in self._cands(j)) else []
        if b == SPACE:
            return [(OK, state[:-1] + (1,))] if state[-1] == 0 else []
        n = len(self.keys)
        if phase == "first":
            if b == 0x7D:
                return [(POP,)] if self.first_req[0] == n else []
            return [(OK, ("key", 0, b'"'))] if b == QUOTE and n else []
        if phase == "colon":
            return [(OK, ("value", state[1], 0))] if b == 0x3A else []
        if phase == "value":
            i = state[1]
            return [(CALL, ("after", i + 1, 0), self.values[i])]
        if phase == "after":
            j = state[1]
            if b == 0x2C:
                return [(OK, ("next", j, 0))] if j < n else []
            if b == 0x7D:
                return [(POP,)] if self.first_req[j] == n else []
            return []
        return [(OK, ("key", state[1], b'"'))] if b == QUOTE else []         # phase "next"

    def finish_cost(self, state) -> int:
        phase = state[0]
        if phase == "open":
            return self.min_cost
        if phase == "first":
            return self.min_cost - 1
        if phase == "key":
            _, j, m = state
            return int(min(len(self.keys[i]) - len(m) + 1 + self.values[i].min_cost + self.after_cost[i + 1]
                           for i in self._cands(j) if self.keys[i].startswith(m)))
        if phase == "colon":
            return 1 + self.values[state[1]].min_cost + int(self.after_cost[state[1] + 1])
        if phase == "value":
            return self.values[state[1]].min_cost + int(self.after_cost[state[1] + 1])
        if phase == "after":
            return int(self.after_cost[state[1]])
        return int(self.next_cost[state[1]])


class Root(Node):
    """The document: optional space, one value, optional space. Never pops."""

    def __init__(self, value: Node):
        self.value = value
        self.initial = ("before", 0)
        self.min_cost = value.min_cost

    def feed(self, state, b: int) -> list[tuple]:
        if b == SPACE:
            return [(OK, (state[0], 1))] if state[1] == 0 else []
        return [(CALL, ("after", 0), self.value)] if state[0] == "before" else []

    def finish_cost(self, state) -> int:
        return self.value.min_cost if state[0] == "before" else 0


# --------------------------------------------------------------------------- the byte-level pushdown parser
Stack = tuple  # of (node, state) frames, the root first

_FEED_CACHE: dict = {}
_CACHE_LIMIT = 1_000_000


def feed_local(stack: Stack, b: int) -> tuple[list[Stack], bool, bool]:
    """Feed byte ``b`` to ``stack``: (stacks that continue, popped below the bottom, passed ``b`` below).

    ``stack`` may be a full stack (its Root never pops) or the top part of one, as in the trie walk.
    """
    key = (stack, b)
    hit = _FEED_CACHE.get(key)
    if hit is not None:
        return hit
    stays: list[Stack] = []
    popped = passed = False
    node, state = stack[-1]
    for act in node.feed(state, b):
        kind = act[0]
        if kind == OK:
            stays.append(stack[:-1] + ((node, act[1]),))
        elif kind == CALL:
            base = stack[:-1] + ((node, act[1]),)
            for child in _options(act[2]):
                s, _, _ = feed_local(base + ((child, child.initial),), b)   # the parent's frame is below
                stays.extend(s)
        elif kind == POP:
            if len(stack) > 1:
                stays.append(stack[:-1])
            else:
                popped = True
        elif kind == PASS:
            if len(stack) > 1:
                s, p, q = feed_local(stack[:-1], b)
                stays.extend(s)
                popped, passed = popped or p, passed or q
            else:
                passed = True
    result = (list(dict.fromkeys(stays)), popped, passed)
    if len(_FEED_CACHE) > _CACHE_LIMIT:
        _FEED_CACHE.clear()
    _FEED_CACHE[key] = result
    return result


def _options(node: Node) -> list[Node]:
    return node.options if isinstance(node, AnyOf) else [node]


_COST_CACHE: dict = {}


def stack_cost(stack: Stack) -> int:
    """Bytes of the shortest text completing the document from ``stack`` (0 = complete)."""
    cost = _COST_CACHE.get(stack)
    if cost is None:
        if len(_COST_CACHE) > _CACHE_LIMIT:
            _COST_CACHE.clear()
        cost = _COST_CACHE[stack] = sum(node.finish_cost(state) for node, state in stack)
    return cost


def advance(stacks: Iterable[Stack], data: bytes) -> frozenset:
    """Feed ``data`` to a set of full stacks; an empty result means ``data`` breaks the grammar."""
    current = set(stacks)
    for b in data:
        nxt: set = set()
        for s in current:
            nxt.update(feed_local(s, b)[0])
        current = nxt
        if not current:
            break
    return frozenset(current)


def initial_state(root: Root) -> frozenset:
    return frozenset({((root, root.initial),)})


def accepts(node: Node, text: bytes) -> bool:
    """Does the grammar of ``node`` accept exactly ``text`` (one complete value)?"""
    stacks = advance({((Root(node), ("before", 0)),)}, text)
    return any(stack_cost(s) == 0 for s in stacks)


def required_chars(node: Node) -> set[str]:
    """Characters that the shortest completions of ``node``'s values may need, one at a time.

    Constrained decoding writes a forced completion with single-character tokens, so the
    tokenizer must have one for each of these (byte-level BPE has every byte).
    """
    out: set[int] = set()      # ASCII bytes
    text: set[str] = set()     # characters of keys and literals
    seen: set[int] = set()

    def visit(n: Node) -> None:
        if id(n) in seen:
            return
        seen.add(id(n))
        if isinstance(n, Root):
            visit(n.value)
        elif isinstance(n, AnyOf):
            for o in n.options:
                visit(o)
        elif isinstance(n, Literal):
            for v in n.values:
                text.update(v.decode())
        elif isinstance(n, String):
            out.add(QUOTE)
        elif isinstance(n, Number):
            out.update(b"0123456789")
            if n.hi is not None and (n.hi < 0 or (n.hi == 0 and n.hi_excl)):
                out.add(ord("-"))
            if not n.integer and (n.lo is not None or n.hi is not None):
                out.add(ord("."))          # a bounded number may need a fraction to fit
        elif isinstance(n, Array):
            out.update(b"[],")
            visit(n.item)
        elif isinstance(n, Object):
            out.update(b"{},:")
            for k in n.keys:
                text.update(k.decode())
            for v in n.values:
                visit(v)

    visit(node)
    return text | {chr(b) for b in out}
