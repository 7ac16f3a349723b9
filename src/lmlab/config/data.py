"""``[data]``: where a pretraining run's tokens come from."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab.data.options import DOC_SEPARATORS
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
    over the same data (a grid, the recipe tests) tokenise it once; stale entries are rebuilt.
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
