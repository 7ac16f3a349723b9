"""Token-level JSON-schema constraint: a logits processor that masks every token that would break the schema.

The grammar (:mod:`lmlab.generate.json_schema`) works on the UTF-8 *bytes* of the output. This module
lifts it to tokens, the way grammar-constrained decoders do (Willard & Louf 2023, "Efficient
Guided Generation for LLMs"; Geng et al. 2023, "Grammar-Constrained Decoding"), with our own
pushdown parser instead of a regular-expression index:

1. **Token surfaces.** Each token's contribution to the decoded text, as bytes: byte-level BPE
   tokens are raw bytes (possibly half a UTF-8 character: the grammar checks UTF-8 byte by byte,
   so a string can only close on a whole character); the other tokenizers' tokens depend on
   position (WordPiece puts a space before a token that is not ``##...``, SentencePiece-style
   unigram drops the first token's leading space), so there is one surface for the first
   generated token and one for the rest. Special tokens are never generated, except EOS, which
   is allowed exactly when the document is complete.
2. **Parser state.** A set of stacks of ``(node, state)`` frames (a set, because ``anyOf`` and
   enum prefixes are followed in parallel). Feeding a byte applies the top node's actions
   (consume, push a child, pop). The *cost* of a stack - the sum of its frames' ``finish_cost`` -
   is the length in bytes of the shortest text that completes the document.
3. **Trie walk.** The surfaces are stored in a byte trie; walking it depth-first with the parser
   visits each shared prefix once and prunes a whole subtree at the first bad byte. The walk
   depends only on the top frame until that frame pops, so it is cached per top frame (a string
   with 5 characters behaves the same wherever it is); the parent frames are joined in after.
   The result per parser state - the allowed token ids and the cost each leaves - is cached too:
   the state holds the JSON *structure* position, not the text, so a few hundred states cover a
   whole run.
4. **Budget.** With ``R`` tokens left, a token is allowed only if the cost it leaves, plus one for
   EOS, fits in ``R - 1``: every completion byte can be written as a one-byte token, so generation
   always ends, valid, within ``max_new_tokens``. When the budget runs low only tokens that
   shorten the completion survive: the shortest completion is forced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmlab.errors import LmlabError
from lmlab.generate.grammar import Root, Stack, advance, feed_local, initial_state, required_chars, stack_cost
from lmlab.generate.json_schema import compile_schema
from lmlab.setting_names import KEYWORDS, SettingNames


# --------------------------------------------------------------------------- token surfaces and the trie
def token_surfaces(tokenizer) -> tuple[list[bytes | None], list[bytes | None]]:
    """(surface as the first generated token, surface later) of every token id; None = never generated.

    The concatenation of the surfaces of ``ids`` is ``tokenizer.decode(ids, skip_special_tokens=True)``
    as UTF-8 bytes (for character BPE, up to the single trailing space its decoder drops).
    """
    specials = tokenizer.special_ids
    vocab = tokenizer.vocab
    algo = getattr(tokenizer, "algo", "")
    first: list[bytes | None] = [None] * len(vocab)
    rest: list[bytes | None] = [None] * len(vocab)
    if algo == "bytelevel":
        from lmlab.tokenizers.pretokenize import from_byte_symbols

        for i, t in enumerate(vocab):
            if i not in specials:
                first[i] = rest[i] = from_byte_symbols(t)
        return first, rest
    if algo == "bpe":
        from lmlab.tokenizers.bpe import END_OF_WORD

        for i, t in enumerate(vocab):
            if i not in specials:
                first[i] = rest[i] = t.replace(END_OF_WORD, " ").encode()
        return first, rest
    # WordPiece, unigram and any other: read the position-dependent text off the tokenizer's decoder
    plain = (i for i in range(len(vocab)) if i not in specials and tokenizer.decode([i]).isalnum())
    ref = next(plain, None)
    if ref is None:
        raise LmlabError("the tokenizer has no plain word token to calibrate its decoder against",
                         "constrained decoding needs an ordinary vocabulary")
    ref_text = tokenizer.decode([ref])
    for i in range(len(vocab)):
        if i in specials:
            continue
        first[i] = tokenizer.decode([i]).encode()
        pair = tokenizer.decode([ref, i])
        if pair.startswith(ref_text):
            rest[i] = pair[len(ref_text):].encode()
    return first, rest


class _Trie:
    """Byte trie over token surfaces: ``children[n]``: byte -> node; ``tokens[n]``: the ids ending there."""

    def __init__(self, surfaces: Sequence[bytes | None]):
        self.children: list[dict[int, int]] = [{}]
        self.tokens: list[list[int]] = [[]]
        for tid, s in enumerate(surfaces):
            if not s:
                continue
            n = 0
            for b in s:
                nxt = self.children[n].get(b)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[n][b] = nxt
                    self.children.append({})
                    self.tokens.append([])
                n = nxt
            self.tokens[n].append(tid)


class _Walk:
    """What the tokens under one trie node do to one top frame: stay above it, or pop it."""

    __slots__ = ("stays", "pops")

    def __init__(self):
        self.stays: dict[int, int] = {}              # token id -> least cost of the frames left on top
        self.pops: set[int] = set()                  # trie nodes where the top frame ended


# --------------------------------------------------------------------------- the logits processor
class JsonSchemaConstraint:
    """Logits processor ``(sequences [N, T], scores [N, V]) -> scores`` keeping the output valid JSON.

    Args:
        schema: a JSON Schema (dict) or a compiled :func:`compile_schema` grammar.
        tokenizer: the model's lmlab tokenizer.
        prompt_len: tokens before the generated ones in ``sequences`` (decoders: the prompt length;
            encoder-decoders: 1, the decoder start token).
        max_new_tokens: the generation budget (the same number given to ``generate``).
        eos_token_id: the token that ends a document (default: the tokenizer's EOS).

    Pass it to :func:`lmlab.generate.generate` as ``logits_processors=[constraint]`` with the same
    ``max_new_tokens`` and ``eos_token_id``; :meth:`text` gives the document of a generated row.
    """

    backend = "lmlab"

    def __init__(self, schema, tokenizer, *, prompt_len: int, max_new_tokens: int,
                 eos_token_id: int | None = None, names: SettingNames = KEYWORDS, **compile_options):
        self.root = schema if isinstance(schema, Root) else compile_schema(schema, **compile_options)
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_id if eos_token_id is None else eos_token_id
        if self.eos is None:
            raise LmlabError("constrained decoding needs an end-of-sequence token and the tokenizer has none",
                             "use a tokenizer trained with an EOS special token (e.g. </s>)")
        self.prompt_len, self.max_new_tokens = prompt_len, max_new_tokens
        need = self.root.min_cost + 1          # refused before any work: a byte per token, then EOS
        if need > max_new_tokens:
            raise LmlabError(f"the shortest document valid against the schema needs up to {need} tokens, "
                             f"more than {names.setting('max_new_tokens', [max_new_tokens])}",
                             f"use {names.to_set('max_new_tokens')} >= {need}")
        self.vocab_size = tokenizer.vocab_size
        self.surfaces = token_surfaces(tokenizer)
        self.tries = (_Trie(self.surfaces[0]), _Trie(self.surfaces[1]))
        self._check_alphabet()
        self.start = initial_state(self.root)
        self._walks: dict = {}
        self._tables: dict = {}
        self._rows: dict[tuple, object] = {}

    def _check_alphabet(self) -> None:
        """Every character a forced completion may need must exist as a token (or one token per byte)."""
        single = set()
        for s in self.surfaces[1]:
            if s is not None and len(s) <= 4:
                text = s.decode("utf-8", "ignore")
                if len(text) == 1 and text.encode() == s:
                    single.add(text)
        one_byte = {s[0] for s in self.surfaces[1] if s is not None and len(s) == 1}
        missing = sorted(ch for ch in required_chars(self.root)
                         if ch not in single and not all(b in one_byte for b in ch.encode()))
        if not any(" " <= ch <= "~" and ch not in '"\\' for ch in single):
            missing.append("a")
        if missing:
            chars = " ".join(repr(ch) for ch in missing[:12])
            raise LmlabError(f"the tokenizer has no single-character token for {chars}, which constrained "
                             "decoding needs to finish a document valid against this schema",
                             "use a tokenizer that has them (byte-level BPE has every byte; train "
                             "others on text that contains these characters)")

    # ----------------------------------------------------------------- per-row parser states
    def state_of(self, generated: Sequence[int]):
        """Parser state after ``generated``: a set of stacks, "done" after EOS, or "dead" if invalid."""
        key = tuple(generated)
        hit = self._rows.get(key)
        if hit is not None:
            return hit
        known = self._rows.get(key[:-1]) if key else None
        state, start = (known, len(key) - 1) if known is not None else (self.start, 0)
        for pos in range(start, len(key)):
            if isinstance(state, str):
                return state
            tok = key[pos]
            if tok == self.eos:
                state = "done" if min(stack_cost(s) for s in state) == 0 else "dead"
                continue
            surface = self._surface(pos, tok)
            state = (advance(state, surface) if surface else frozenset()) or "dead"
        return state

    def __call__(self, sequences: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = sequences[:, self.prompt_len:].tolist()
        allowed = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
        seen: dict[tuple, object] = {}
        for r, gen in enumerate(rows):
            state = self.state_of(gen)
            seen[tuple(gen)] = state
            if isinstance(state, str):           # finished (or a dead beam): only EOS, as padding
                allowed[r, self.eos] = True
                continue
            remaining = self.max_new_tokens - len(gen)
            ids, costs = self._table(state, first=not gen)
            n_ok = int(torch.searchsorted(costs, remaining - 2, right=True))
            allowed[r, ids[:n_ok].to(scores.device)] = True
            if min(stack_cost(s) for s in state) == 0:
                allowed[r, self.eos] = True
            if not bool(allowed[r].any()):
                text = b"".join(self._surface(i, t) for i, t in enumerate(gen)).decode("utf-8", "replace")
                raise LmlabError(f"constrained decoding is stuck after {text!r}: no token of the vocabulary "
                                 "continues it within the schema", "use a tokenizer whose vocabulary has the "
                                 "single characters JSON needs (byte-level BPE always has), or raise "
                                 "max_new_tokens")
        self._rows = seen
        return scores.masked_fill(~allowed, float("-inf"))

    def _surface(self, position: int, tok: int) -> bytes:
        return (self.surfaces[0 if position == 0 else 1][tok] or b"") if 0 <= tok < self.vocab_size else b""

    def text(self, generated: Sequence[int]) -> str:
        """The document written by ``generated`` (cut at EOS), as the tokenizer decodes it."""
        gen = list(generated)
        if self.eos in gen:
            gen = gen[:gen.index(self.eos)]
        return self.tokenizer.decode(gen, skip_special_tokens=True).strip()

    # ----------------------------------------------------------------- allowed tokens of a state
    def _table(self, state: frozenset, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids allowed from ``state`` (ignoring the budget), sorted by the cost each leaves."""
        key = (first, state)
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        trie = self.tries[0 if first else 1]
        best: dict[int, int] = {}
        for stack in state:
            self._successor_costs(trie, first, 0, stack, stack_cost(stack[:-1]), best)
        ids = torch.tensor(list(best), dtype=torch.long)
        costs = torch.tensor(list(best.values()), dtype=torch.long)
        costs, order = torch.sort(costs, stable=True)
        table = (ids[order], costs)
        if len(self._tables) > 20_000:
            self._tables.clear()
        self._tables[key] = table
        return table

    def _successor_costs(self, trie: _Trie, first: bool, node: int, stack: Stack, below: int,
                         best: dict[int, int]) -> None:
        """Add to ``best`` every token under trie ``node`` that ``stack`` accepts, with the cost it leaves.

        ``below`` is the cost of every frame under the top one. Where the top frame ends, the
        parent goes on reading from that trie node (a value that ends without consuming the byte,
        a number, passes it to the parent; a parent never accepts a byte such a child consumes).
        """
        walk = self._walk(trie, first, node, stack[-1])
        for tok, cost in walk.stays.items():
            c = below + cost
            if c < best.get(tok, 1 << 30):
                best[tok] = c
        if not walk.pops:
            return
        parent = stack[:-1]
        parent_below = stack_cost(parent[:-1])
        c = stack_cost(parent)
        for nid in walk.pops:
            for tok in trie.tokens[nid]:   # tokens ending where the top frame ended
                if c < best.get(tok, 1 << 30):
                    best[tok] = c
            self._successor_costs(trie, first, nid, parent, parent_below, best)

    def _walk(self, trie: _Trie, first: bool, node: int, frame: tuple) -> _Walk:
        key = (first, node, frame)
        hit = self._walks.get(key)
        if hit is not None:
            return hit
        walk = _Walk()
        self._descend(trie, node, {(frame,)}, walk)
        if len(self._walks) > 200_000:
            self._walks.clear()
        self._walks[key] = walk
        return walk

    def _descend(self, trie: _Trie, node: int, stacks: set, walk: _Walk) -> None:
        for b, child in trie.children[node].items():
            nxt: set = set()
            for s in stacks:
                stays, popped, passed = feed_local(s, b)
                nxt.update(stays)
                if popped:
                    walk.pops.add(child)
                if passed:
                    walk.pops.add(node)
            if nxt:
                toks = trie.tokens[child]
                if toks:
                    cost = min(stack_cost(s) for s in nxt)
                    for tok in toks:
                        if cost < walk.stays.get(tok, 1 << 30):
                            walk.stays[tok] = cost
                self._descend(trie, child, nxt, walk)
