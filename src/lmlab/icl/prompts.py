"""Prompt templates for in-context learning, in the format of the GPT-3 paper (Brown et al. 2020).

A prompt is an optional task description line, ``k`` solved demonstrations, then the query with
its answer left out::

    Translate English to French:          <- description
    sea otter => loutre de mer            <- demonstrations ("shots")
    peppermint => menthe poivrée
    cheese =>                             <- query; the model continues with " fromage"

The example format is a string with ``{input}`` and ``{answer}`` placeholders (default
``"{input} => {answer}"``). The query is the format up to ``{answer}`` with trailing spaces
removed; what was removed goes in front of each candidate answer (the *continuation*,
``" fromage"``), so a byte-level tokenizer sees the answer with its leading space, as in text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lmlab.arguments import describe
from lmlab.errors import LmlabError


@dataclass(frozen=True)
class PromptTemplate:
    """Task description + ``example`` lines joined by ``separator`` (see the module docstring)."""

    description: str = ""
    example: str = "{input} => {answer}"
    separator: str = "\n"

    def __post_init__(self):
        for name in ("description", "example", "separator"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise LmlabError(f"PromptTemplate's {name} must be a string, got {describe(value)}",
                                 'pass e.g. PromptTemplate("Classify the sentiment.", "{input} => {answer}")')
        if self.example.count("{answer}") != 1 or self.example.count("{input}") != 1 or \
                self.example.index("{input}") > self.example.index("{answer}"):
            raise LmlabError(f"example format {self.example!r} must hold {{input}} then {{answer}}, "
                             "once each",
                             'e.g. "{input} => {answer}"')

    def demonstration(self, x: str, y: str) -> str:
        """One solved example line: ``sea otter => loutre de mer``."""
        return self.example.replace("{input}", x).replace("{answer}", y)

    def _head(self, x: str) -> str:
        return self.example[:self.example.index("{answer}")].replace("{input}", x)

    def query(self, x: str) -> str:
        """The query line, answer left out (trailing spaces removed): ``cheese =>``."""
        return self._head(x).rstrip()

    def continuation(self, x: str, y: str) -> str:
        """What follows the query when the answer is ``y``: ``" fromage"`` (and any text after it)."""
        head = self._head(x)
        tail = self.example[self.example.index("{answer}") + len("{answer}"):]
        return head[len(head.rstrip()):] + y + tail

    def build(self, shots: Sequence[tuple[str, str]], x: str) -> str:
        """The whole prompt for query ``x`` after the demonstrations ``shots``."""
        lines = [self.description] if self.description else []
        lines += [self.demonstration(a, b) for a, b in shots]
        lines.append(self.query(x))
        return self.separator.join(lines)
