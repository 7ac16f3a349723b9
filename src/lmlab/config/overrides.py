"""``--set section.key=value`` overrides, where a value came from, and the did-you-mean of an unknown
name: what every config section (recipe, fine-tuning, alignment, grid) shares."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lmlab.config.toml import key_line, parse_value
from lmlab.errors import LmlabError, suggest  # noqa: F401  (suggest: its old home)


@dataclass(frozen=True)
class Origin:
    """Where a config's values came from, to name it in errors: its file ("" for a dict), the
    keys that ``--set`` gave and those a command-line flag gave (``section.key`` -> ``--flag``).
    ``written``: ``(config key, key as its source wrote it)`` pairs for a config assembled from
    another file's tables: a grid's run reads ``train.lr`` from ``pretrain.train.lr`` or
    ``arms[0].train.lr``, ``data`` from ``pretrain.data`` (the longest matching prefix applies)."""

    file: str = ""
    set_keys: frozenset[str] = frozenset()
    flags: tuple[tuple[str, str], ...] = ()
    written: tuple[tuple[str, str], ...] = ()

    def written_as(self, key: str) -> str:
        """``key`` as its source wrote it (itself unless :attr:`written` renames it)."""
        best = max((pair for pair in self.written if key == pair[0] or key.startswith(f"{pair[0]}.")),
                   key=lambda pair: len(pair[0]), default=None)
        return key if best is None else best[1] + key[len(best[0]):]

    def naming(self, error: LmlabError, key: str, shown: str | None = None) -> LmlabError:
        """``error`` about the setting ``key``, named once where it was written: the problem's
        leading name (``shown``, default ``key``) becomes :meth:`of` ``key`` (``--set
        train.batch_size 1 is ...``); a problem that does not start with it gets that place before
        it (``recipe.toml:4: objective.noise: ...``)."""
        shown = shown or key
        if error.problem.startswith(shown + " "):
            problem = self.of(key) + error.problem[len(shown):]
        else:
            problem = f"{self.of(key)}: {error.problem}"
        return LmlabError(problem, error.fix, setting=error.setting)

    def of(self, key: str) -> str:
        """Where ``key``'s value was written: ``--set train.lr``, ``FILE:LINE: train.lr`` (``FILE:
        train.lr`` when the line is not found) or ``train.lr`` (each as :meth:`written_as`)."""
        if self.from_command_line(key) or self.set_above(key):
            return f"--set {self.written_as(key)}"
        flag = dict(self.flags).get(key)
        if flag:
            return flag
        key = self.written_as(key)
        if not self.file:
            return key
        line = key_line(self.file, key)
        return f"{self.file}:{line}: {key}" if line else f"{self.file}: {key}"

    def from_command_line(self, key: str) -> bool:
        """Whether ``key``'s value is command-line text (a ``--set``), which may spell a number or a
        list; a file's or a dict's values are typed already (:mod:`lmlab.config.fields`)."""
        key = self.written_as(key)
        return key in self.set_keys or any(k.startswith(f"{key}.") for k in self.set_keys)

    def set_above(self, key: str) -> bool:
        """Whether a ``--set`` gave a table that holds ``key`` (``--set 'data.tokenizer={...}'``
        holds ``data.tokenizer.score``): the value came from the command line, typed as TOML."""
        parts = self.written_as(key).split(".")
        return any(".".join(parts[:n]) in self.set_keys for n in range(1, len(parts)))

    def section(self, name: str) -> str:
        return f"{self.file}: [{name}]" if self.file else f"[{name}]"


#: the origin of values given in code (a dict): errors name the key alone
NOWHERE = Origin()


#: an example key (and value) of each section, for the fix of a malformed ``--set``
EXAMPLES = {"model": "preset=gpt2-tiny", "objective": "name=clm", "data": 'train=["corpus.txt"]',
            "train": "max_steps=100", "finetune": "epochs=3", "align": "beta=0.1",
            "budget": "tokens=20480", "pretrain": "train.lr=1e-3", "sizes": "base.d_model=64"}


def example(section: str) -> str:
    """``SECTION.KEY=VALUE`` written out for ``section`` (``train.max_steps=100``)."""
    return f"{section}.{EXAMPLES.get(section, 'KEY=VALUE')}"


def split_override(item: str, example_item: str = "train.max_steps=100") -> tuple[str, str]:
    """``"train.lr=3e-4"`` -> ``("train.lr", "3e-4")``: the one reading of a ``--set KEY=VALUE``
    (recipes, fine-tuning, alignment, grids). The key's parts are checked by :func:`key_parts`."""
    if not isinstance(item, str) or "=" not in item:
        raise LmlabError(f"override {item!r} is not of the form SECTION.KEY=VALUE",
                         f"write e.g. --set {example_item}")
    key, value = item.split("=", 1)
    key = key.strip()
    key_parts(key, example_item)
    return key, value.strip()


def key_parts(key: str, example_item: str = "train.max_steps=100") -> list[str]:
    """The dotted parts of an override key; an empty part (``train.``, ``.lr``, ``a..b``) is refused."""
    parts = key.split(".")
    if not all(p.strip() for p in parts):
        raise LmlabError(f"--set key `{key}` has an empty part",
                         f"write SECTION.KEY=VALUE, e.g. {example_item}")
    return [p.strip() for p in parts]


def override_items(overrides: Iterable[str] | dict[str, Any] | None,
                   example_item: str = "train.max_steps=100") -> list[tuple[str, Any]]:
    """``["train.lr=3e-4"]`` (or a dict) -> ``[("train.lr", 0.0003)]``; values are TOML literals."""
    if not overrides:
        return []
    if isinstance(overrides, dict):
        return list(overrides.items())
    from lmlab.arguments import text_list_argument

    items = []
    overrides = text_list_argument(overrides, "overrides")  # a bare string is not a list of characters
    for item in overrides:
        key, value = split_override(item, example_item)
        items.append((key, parse_value(value)))
    return items


def apply_override(raw: dict, key: str, value: Any, sections: Iterable[str],
                   origin: Origin = NOWHERE) -> None:
    """Put ``value`` at the dotted ``key`` of ``raw``, whose first part must be one of ``sections``
    (an unknown one names the closest; a section alone, or an empty part, names the right form)."""
    sections = tuple(sections)
    if not isinstance(key, str):
        raise LmlabError(f"override key {key!r} is not text",
                         f"write SECTION.KEY=VALUE, e.g. {example(sections[-1])}")
    parts = key_parts(key, example(sections[-1]))
    section = parts[0]
    if len(parts) == 1:
        if section in sections:
            raise LmlabError(f"{section} is a section", f"set one of its keys, e.g. {example(section)}")
        raise LmlabError(f"--set key `{key}` names no section",
                         f"write SECTION.KEY=VALUE, e.g. {sections[-1]}.{key}=... "
                         f"(sections: {', '.join(sections)})")
    if section not in sections:
        raise LmlabError(f"unknown config section {section!r} in {key!r}", suggest(section, sections))
    node = raw.setdefault(section, {})
    if not isinstance(node, dict):
        raise LmlabError(f"{origin.section(section)} must be a table, got {node!r}, so --set {key} has "
                         "nowhere to go", f"write [{section}] with key = value lines")
    for p in parts[1:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value
