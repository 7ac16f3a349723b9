"""Training data: text -> token shards on disk -> windows for packing.

>>> from lmlab.data import prepare_shards, TokenShards
>>> prepare_shards("tok/", ["corpus.txt"], "shards/", val_fraction=0.01)   # doctest: +SKIP
>>> train = TokenShards("shards/", split="train")                          # doctest: +SKIP
>>> ids, positions = train.window(0, 1025)                                  # doctest: +SKIP

``shards.py`` holds the on-disk format (writer and memory-mapped reader); ``prepare.py`` the
parallel tokenization pipeline behind ``lmlab data prepare``.
"""

from lmlab.lazy import lazy_exports

# imported on first use (numpy, the tokenizers): the command-line parser reads lmlab.data.options only
__getattr__, __dir__ = lazy_exports(__name__, {
    "options": ("DOC_SEPARATORS",),
    "prepare": ("PrepareSummary", "iter_documents", "prepare_shards", "val_score"),
    "shards": ("ConcatenatedTokens", "ShardWriter", "TokenShards", "dtype_for_vocab"),
})

__all__ = ["DOC_SEPARATORS", "ConcatenatedTokens", "PrepareSummary", "ShardWriter", "TokenShards",
           "dtype_for_vocab", "iter_documents", "prepare_shards", "val_score"]
