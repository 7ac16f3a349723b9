"""``[data]``: where a pretraining run's tokens come from."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab.config.fields import build_section, coerce
from lmlab.config.overrides import NOWHERE, Origin, suggest
from lmlab.data.options import DOC_SEPARATORS
from lmlab.errors import LmlabError
from lmlab.tokenizers import TABLE_KEYS
from lmlab.values import Encoding, Fraction, PathText, Size, Text, Workers, choice

DocSeparator = choice(*DOC_SEPARATORS)


@dataclass
class DataConfig:
    """``[data]``: where the tokens come from.

    ``train``/``val``: token-shard directories (written by ``lmlab data prepare``) or raw text
    files, JSON Lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``) or Parquet files (one document
    per record: its ``text_field``, default ``text``), directories of such files, or glob
    patterns; text is tokenised once into ``RUN_DIR/data/`` with ``tokenizer``. ``$LMLAB_DATA``
    in a path expands to that environment variable (default ``../shared/data``); relative paths
    are relative to the working directory.
    ``tokenizer``: a tokenizer directory, or a table ``{algo, vocab_size, input, ...}`` to train
    one (``input`` defaults to the train files; other keys are the algorithm's options).
    ``val_fraction``: when ``val`` is empty, send this fraction of the train documents to val.
    ``max_tokens``: train on the first ``max_tokens`` tokens only (0: all), e.g. a small corpus
    seen for many epochs (static vs dynamic masking); the tokenizer and shards stay those of the
    whole data, so runs with different limits share one cache entry.
    ``cache_dir``: when set (or when ``$LMLAB_CACHE_DIR`` is), the trained tokenizer and the token
    shards go to ``cache_dir/<hash of this [data] table>/`` instead of ``RUN_DIR/data/``, so runs
    over the same data (a grid, the recipe tests) tokenise it once; stale entries are rebuilt. It
    is an output like ``--out``: a place that cannot be written or that lies inside another lmlab
    output is refused up front (:func:`lmlab.train.data.cache_entry`).
    """

    train: list[PathText] = field(default_factory=list)
    val: list[PathText] = field(default_factory=list)
    tokenizer: str | dict[str, Any] = ""
    val_fraction: Fraction = 0.0
    max_tokens: Size = 0
    doc_separator: DocSeparator = "blank-line"
    encoding: Encoding = "utf-8"
    append_eos: bool = False
    text_field: Text = "text"
    workers: Workers = 1
    cache_dir: str = ""


def build_data_section(table: dict[str, Any], origin: Origin = NOWHERE, section: str = "data") -> DataConfig:
    """``[data]`` of a recipe (``section``: ``pretrain.data`` in a grid), every key checked, and a
    ``tokenizer`` table checked as its trainer will read it (:func:`check_tokenizer_table`): what
    the trainer, the grid planner and the lab's runner all read ``[data]`` with."""
    data = build_section(DataConfig, table, section, origin)
    if isinstance(data.tokenizer, dict):
        data.tokenizer = check_tokenizer_table(data.tokenizer, f"{section}.tokenizer", origin)
    return data


def check_tokenizer_table(table: dict[str, Any], key: str = "data.tokenizer",
                          origin: Origin = NOWHERE) -> dict[str, Any]:
    """A ``tokenizer = {algo, vocab_size, input, ...}`` table, before any tokenizer is trained: a known
    ``algo``; every other key ``vocab_size``, ``input``, ``special_tokens`` or an option of that
    algorithm's trainer, each value of its type (:func:`lmlab.tokenizers.training_settings`); and the
    rules between them (:func:`lmlab.tokenizers.check_training`: a vocabulary size no smaller than
    the special tokens and base symbols need). The table with its values converted."""
    from lmlab.tokenizers import ALGORITHMS, check_training, training_settings

    algo = table.get("algo")
    if not algo:
        raise LmlabError(f"{origin.of(key)} table needs algo",
                         f'e.g. tokenizer = {{algo = "bytelevel", vocab_size = 4096}} '
                         f'(algo: {", ".join(ALGORITHMS)})')
    if not isinstance(algo, str) or algo not in ALGORITHMS:
        raise LmlabError(f"{origin.of(key)}: unknown tokenizer algorithm {algo!r}",
                         suggest(str(algo), ALGORITHMS, ""))
    hints = {"input": PathText | list[PathText], **training_settings(algo)}
    out: dict[str, Any] = {"algo": algo}
    options: dict[str, Any] = {}
    for name, value in table.items():
        if name == "algo":
            continue
        if name not in hints:
            raise LmlabError(f"unknown key {origin.of(f'{key}.{name}')} of a {algo} tokenizer table",
                             suggest(name, ["algo", *hints], f"{key}."))
        full = f"{key}.{name}"
        out[name] = coerce(value, hints[name], full, origin.of(full), origin.from_command_line(full))
        if name not in TABLE_KEYS:
            options[name] = out[name]
    try:
        check_training(algo, out.get("vocab_size"), out.get("special_tokens"), options, f"{key}.")
    except LmlabError as e:
        place = origin.of(key if origin.from_command_line(key) else f"{key}.vocab_size")
        problem = e.problem if place in (key, f"{key}.vocab_size") else f"{place}: {e.problem}"
        raise LmlabError(problem, e.fix) from None
    return out
