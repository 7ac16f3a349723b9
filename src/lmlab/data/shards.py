"""Token shards on disk: a flat binary writer and a memory-mapped reader.

Layout of a shards directory (written by ``lmlab data prepare``, see ``prepare.py``)::

    index.json           what is where: dtype, vocabulary size, tokenizer hash, per-split totals
    tokenizer/           a copy of the tokenizer that produced the ids
    train_000.bin ...    the train token stream: raw little-endian uint16 (vocab <= 65536) or uint32
    train_docs.npy       int64 start offset of every train document in that stream
    val_000.bin ...      the same for the validation split
    val_docs.npy

Each split is one long token stream cut into shards of at most ``shard_tokens`` tokens (a
document may continue from one shard into the next). Nothing separates documents inside the
stream; the boundaries live in ``*_docs.npy`` (document ``i`` spans
``[doc_starts[i], doc_starts[i+1])``), so packing can restart positions and block attention at
every document start. This follows nanoGPT's ``train.bin`` (flat uint16 memmap) and adds the
document index it lacks. Readers memory-map the shards: opening costs no RAM, reading a window
costs only that window.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmlab import values
from lmlab.errors import LmlabError
from lmlab.file_schemas import ShardIndexFile
from lmlab.fileio import inside, read_json, write_json

FORMAT_NAME = "lmlab-token-shards"
FORMAT_VERSION = 1
INDEX_FILE = "index.json"
TOKENIZER_DIR = "tokenizer"
SPLITS = ("train", "val")
#: what to do about damaged shards
SHARDS_FIX = "re-create the shards with `lmlab data prepare`"


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding every id: uint16 up to 65536 tokens, else uint32."""
    if vocab_size <= 2**16:
        return np.dtype("<u2")
    if vocab_size <= 2**32:
        return np.dtype("<u4")
    raise LmlabError(f"vocabulary of {vocab_size} tokens does not fit uint32 ids", "use a smaller vocabulary")


def shard_name(split: str, i: int) -> str:
    return f"{split}_{i:03d}.bin"


def docs_name(split: str) -> str:
    return f"{split}_docs.npy"


def tokenizer_sha256(directory: str | os.PathLike) -> str:
    """SHA-256 over the files of a saved tokenizer directory (names and bytes, in name order)."""
    h = hashlib.sha256()
    from lmlab.ownership import BOOKKEEPING

    for f in sorted(Path(directory).iterdir()):
        if f.is_file() and f.name not in BOOKKEEPING:  # the manifest records times, not what it does
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- writing
class ShardWriter:
    """Append token arrays of one split to ``{split}_000.bin``, ``{split}_001.bin``... and record documents.

    ``add(ids, lengths, num_bytes)`` appends a batch of documents (``add_document`` one);
    ``close()`` writes ``{split}_docs.npy`` and returns the split's entry for ``index.json``.
    """

    def __init__(self, directory: str | os.PathLike, split: str, dtype: np.dtype, shard_tokens: int):
        if shard_tokens < 1:
            raise LmlabError(f"shard size must be at least 1 token, got {shard_tokens}",
                             "pass e.g. --shard-tokens 100000000")
        self.directory = Path(directory)
        self.split = split
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._starts: list[np.ndarray] = []
        self.num_documents = 0
        self.num_tokens = 0
        self.num_bytes = 0
        self._file = None

    def add_document(self, ids, num_bytes: int) -> None:
        """Append one document's ids and the size of its text in UTF-8 bytes."""
        ids = np.asarray(ids, dtype=self.dtype)
        self.add(ids, np.array([len(ids)], dtype=np.int64), num_bytes)

    def add(self, ids: np.ndarray, lengths: np.ndarray, num_bytes: int) -> None:
        """Append several documents at once: their ids concatenated, each one's length, their total bytes."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(ids):
            raise ValueError(f"document lengths sum to {int(lengths.sum())} but {len(ids)} ids were given")
        if len(lengths):
            self._starts.append(self.num_tokens + np.cumsum(lengths) - lengths)
            self.num_documents += len(lengths)
        self.num_bytes += int(num_bytes)
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            if self._file is None or self.shards[-1]["tokens"] == self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            part, ids = ids[:room], ids[room:]
            self._file.write(part.tobytes())
            self.shards[-1]["tokens"] += len(part)
            self.num_tokens += len(part)

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        name = shard_name(self.split, len(self.shards))
        self._file = open(self.directory / name, "wb")  # noqa: SIM115 (closed in close() / _open_next)
        self.shards.append({"file": name, "tokens": 0})

    def close(self) -> dict[str, Any]:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
        starts = np.concatenate(self._starts) if self._starts else np.empty(0, dtype=np.int64)
        np.save(self.directory / docs_name(self.split), starts.astype(np.int64), allow_pickle=False)
        return {
            "shards": self.shards,
            "documents": self.num_documents,
            "tokens": self.num_tokens,
            "bytes": self.num_bytes,
            "doc_starts": docs_name(self.split),
        }

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def write_index(directory: str | os.PathLike, dtype: np.dtype, vocab_size: int,
                splits: dict[str, dict[str, Any]], **metadata: Any) -> None:
    """Write ``index.json``: format, dtype, vocabulary size, extra ``metadata``, then per-split entries."""
    index = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "dtype": np.dtype(dtype).name,
             "vocab_size": int(vocab_size), **metadata, "splits": splits}
    write_json(Path(directory) / INDEX_FILE, index)


# --------------------------------------------------------------------------- reading
def read_index(directory: str | os.PathLike) -> dict[str, Any]:
    """``index.json`` of a shards directory, checked whole against
    :class:`lmlab.file_schemas.ShardIndexFile` (types, ranges, and shard lists that hold their
    split's tokens): a damaged or crafted index is a one-line error before any shard is opened."""
    path = Path(directory) / INDEX_FILE
    index = read_json(path, "shards index")
    if not isinstance(index, dict) or index.get("format") != FORMAT_NAME \
            or index.get("format_version") != FORMAT_VERSION:
        version = index.get("format_version") if isinstance(index, dict) else None
        raise LmlabError(f"{path} is not an lmlab token-shards index "
                         f"(format version {version!r}, want {FORMAT_VERSION})", SHARDS_FIX)
    values.check(ShardIndexFile, index, where=str(path), fix=SHARDS_FIX)
    return index


class ConcatenatedTokens:
    """Read-only view of several memory-mapped shards as one 1-D token array.

    Supports ``len``, integer indexing and contiguous slices (``tokens[a:b]`` returns a numpy
    array, copying only when the slice crosses a shard boundary), and ``np.asarray`` (reads all).
    """

    def __init__(self, maps: list[np.memmap], dtype: np.dtype):
        self.maps = maps
        self.dtype = dtype
        self.offsets = np.cumsum([0] + [len(m) for m in maps])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                return self[start:stop][::step]
            return self.read(start, max(0, stop - start))
        i = int(key)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"token index {key} out of range for {n} tokens")
        s = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.maps[s][i - self.offsets[s]]

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens ``[start, start+n)`` (clipped to the end), in the stored dtype."""
        stop = min(start + n, len(self))
        if start >= stop:
            return np.empty(0, dtype=self.dtype)
        s = int(np.searchsorted(self.offsets, start, side="right")) - 1
        parts = []
        while start < stop:
            lo = start - self.offsets[s]
            hi = min(stop, self.offsets[s + 1]) - self.offsets[s]
            parts.append(self.maps[s][lo:hi])
            start = int(self.offsets[s] + hi)
            s += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __array__(self, dtype=None, copy=None):
        arr = self.read(0, len(self))
        return arr if dtype is None else arr.astype(dtype)

    def __iter__(self) -> Iterator[int]:
        for m in self.maps:
            yield from m


class TokenShards:
    """One split of a shards directory, memory-mapped.

    >>> data = TokenShards("shards/", split="train")          # doctest: +SKIP
    >>> data.num_tokens, data.vocab_size, data.dtype           # doctest: +SKIP
    >>> ids, pos = data.window(1000, 513)                     # doctest: +SKIP

    Attributes: ``tokens`` (read-only array-like over all shards), ``num_tokens``,
    ``num_documents``, ``doc_starts`` (int64 start offset of each document), ``num_bytes``
    (UTF-8 bytes of the split's text, for bits per byte), ``vocab_size``, ``dtype``, ``index``.
    """

    def __init__(self, directory: str | os.PathLike, split: str = "train"):
        from lmlab.arguments import path_argument

        self.directory = path_argument(directory, "TokenShards' directory")
        if not self.directory.is_dir():
            what = "is a file, not a" if self.directory.exists() else "does not exist: no"
            raise LmlabError(f"{self.directory} {what} token shards directory",
                             "pass the folder `lmlab data prepare --out DIR` wrote (a text file is read by "
                             "a recipe's data.train, or tokenised by `lmlab data prepare --input FILE`)")
        self.index: dict[str, Any] = read_index(self.directory)
        splits = self.index["splits"]
        if split not in splits:
            raise LmlabError(f"unknown split {split!r}", f"use one of {', '.join(splits)}")
        self.split = split
        info = splits[split]
        if info["tokens"] == 0:
            raise LmlabError(f"split {split!r} of {self.directory} holds no tokens",
                             "re-run `lmlab data prepare` with a larger --val-fraction or more text")
        self.dtype = np.dtype(self.index["dtype"])
        self.vocab_size: int = int(self.index["vocab_size"])
        self.num_tokens: int = int(info["tokens"])
        self.num_bytes: int = int(info["bytes"])
        self.num_documents: int = int(info["documents"])
        maps = [self._map(s) for s in info["shards"]]
        self.tokens = maps[0] if len(maps) == 1 else ConcatenatedTokens(maps, self.dtype)
        self.doc_starts: np.ndarray = self._load_doc_starts(info["doc_starts"])

    def _map(self, shard: dict[str, Any]) -> np.memmap:
        path = inside(self.directory, shard.get("file"), f"{self.directory / INDEX_FILE}")
        want = shard["tokens"] * self.dtype.itemsize
        if not path.is_file() or path.stat().st_size != want:
            have = path.stat().st_size if path.is_file() else "no file"
            raise LmlabError(f"shard {path} is missing or truncated ({have} bytes, index says {want})",
                             "re-create the shards with `lmlab data prepare`")
        return np.memmap(path, dtype=self.dtype, mode="r")

    def _load_doc_starts(self, name: str) -> np.ndarray:
        path = inside(self.directory, name, f"{self.directory / INDEX_FILE}")
        try:
            starts = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise LmlabError(f"document index {path} is missing or corrupt ({e})",
                             "re-create the shards with `lmlab data prepare`") from None
        if starts.ndim != 1 or len(starts) != self.num_documents or (len(starts) and starts[0] != 0):
            raise LmlabError(f"document index {path} does not match index.json",
                             "re-create the shards with `lmlab data prepare`")
        starts.setflags(write=False)
        return starts

    def __len__(self) -> int:
        return self.num_tokens

    def check_token_ids(self, vocab_size: int, chunk: int = 1 << 24) -> None:
        """Every token id below ``vocab_size`` (the model's), read once, ``chunk`` ids at a time:
        an id beyond the vocabulary is a one-line error naming the shard, before training (the
        training steps themselves do not check their ids)."""
        maps = self.tokens.maps if isinstance(self.tokens, ConcatenatedTokens) else [self.tokens]
        for shard, ids in zip(self.index["splits"][self.split]["shards"], maps):
            top = max((int(ids[i:i + chunk].max()) for i in range(0, len(ids), chunk)), default=0)
            if top >= vocab_size:
                raise LmlabError(f"{self.directory / shard['file']}: holds token ids beyond the model's "
                                 f"vocabulary of {vocab_size} (got {top})",
                                 f"{SHARDS_FIX} and the tokenizer the model is trained with")

    def __repr__(self) -> str:
        return (f"TokenShards({str(self.directory)!r}, split={self.split!r}: {self.num_tokens:,} tokens, "
                f"{self.num_documents:,} documents, {self.dtype.name})")

    def tokenizer(self):
        """Load the tokenizer copy saved with the shards (the one that produced these ids)."""
        from lmlab.tokenizers import load_tokenizer

        return load_tokenizer(self.directory / TOKENIZER_DIR)

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens ``[start, start+n)`` as int64 (clipped at the end of the split)."""
        if isinstance(self.tokens, ConcatenatedTokens):
            return self.tokens.read(start, n).astype(np.int64)
        return np.asarray(self.tokens[start:start + n], dtype=np.int64)

    def window(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[start, start+n)`` and their positions inside their own documents.

        The position is 0 at every document start and counts up until the next one, so packing
        ``n`` tokens from several documents gives e.g. ``[5, 6, 7, 0, 1, 2, 0, 1]``. A model that
        takes position ids (and a block-diagonal mask built from ``positions == 0``) then never
        lets attention or positions run across a document boundary.
        """
        if not 0 <= start < self.num_tokens:
            raise LmlabError(f"window start {start} is outside the {self.num_tokens} tokens "
                             f"of split {self.split!r}", f"pass 0 <= start < {self.num_tokens}")
        ids = self.read(start, n)
        idx = np.arange(start, start + len(ids), dtype=np.int64)
        doc = np.searchsorted(self.doc_starts, idx, side="right") - 1
        return ids, idx - self.doc_starts[doc]

    def document_bounds(self, i: int) -> tuple[int, int]:
        """``(start, end)`` token offsets of document ``i``."""
        if not -self.num_documents <= i < self.num_documents:
            raise IndexError(f"document {i} out of range for {self.num_documents} documents")
        i %= self.num_documents
        end = self.doc_starts[i + 1] if i + 1 < self.num_documents else self.num_tokens
        return int(self.doc_starts[i]), int(end)

    def document(self, i: int) -> np.ndarray:
        """The token ids of document ``i`` (int64)."""
        start, end = self.document_bounds(i)
        return self.read(start, end - start)

    def bits_per_byte(self, mean_token_nll: float) -> float:
        """Convert a mean per-token loss in nats over this whole split into bits per UTF-8 byte.

        ``bpb = nll_per_token * num_tokens / (ln 2 * num_bytes)``: comparable across tokenizers,
        unlike per-token perplexity.
        """
        return mean_token_nll * self.num_tokens / (math.log(2) * self.num_bytes)
