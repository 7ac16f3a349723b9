"""``lmlab data prepare``: text files -> documents -> token ids -> shards, in parallel.

The pipeline (one pass over the input, bounded memory):

1. **Documents.** Each file is streamed line by line and cut into documents: blank-line
   separated paragraphs (``blank-line``, default), single non-blank lines (``line``) or whole
   files (``file``). JSON Lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``) and Parquet files
   give one document per record, its ``text_field`` (:mod:`lmlab.data.records`). Line endings
   are normalised to ``\\n``; a paragraph's lines are joined with ``\\n`` without a trailing
   newline; whitespace-only documents are dropped.
2. **Split.** A document goes to ``val`` when a keyed hash of its text,
   ``blake2b(text, key=seed)`` read as a number in [0, 1), is below ``val_fraction``; so the split
   is reproducible, independent of file order and worker count, and identical paragraphs (chapter
   headings, licence boilerplate) always land on the same side, which keeps them out of val
   leakage.
3. **Encode.** Batches of documents (about 256 KB of text) go to ``workers`` processes; each
   loads the tokenizer once and runs ``tokenizer.encode`` on every document. Results come back
   in input order, so any worker count writes byte-identical shards. The workers are spawned, or
   forked when the caller is a script calling from its top level without a ``__main__`` guard
   (a spawned worker would run that script again); where neither is safe the work runs in the
   caller, with a note (:mod:`lmlab.processes`).
4. **Write.** :class:`~lmlab.data.shards.ShardWriter` appends ids to the split's shards
   (uint16 or uint32) and records document starts. Everything is built in a temporary directory
   next to ``out`` and renamed into place only at the end (:func:`lmlab.fileio.atomic_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmlab import ownership, values
from lmlab.arguments import flag_argument, number_argument, path_argument, path_list_argument
from lmlab.budget import cap_workers
from lmlab.data.options import DEFAULT_SHARD_TOKENS, DOC_SEPARATORS, default_workers
from lmlab.data.records import input_bytes, is_dataset_dir, is_record_file, iter_record_texts
from lmlab.data.shards import (
    INDEX_FILE,
    SPLITS,
    TOKENIZER_DIR,
    ShardWriter,
    dtype_for_vocab,
    tokenizer_sha256,
    write_index,
)
from lmlab.errors import LmlabError
from lmlab.fileio import (
    atomic_dir,
    check_encoding,
    check_input_file,
    iter_text_lines,
    require_text,
)
from lmlab.processes import ordered_results, start_method, worker_pool
from lmlab.tokenizers import load_tokenizer

BATCH_CHARS = 1 << 18


# --------------------------------------------------------------------------- documents
def _strip_eol(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line


def _check_separator(separator: str) -> None:
    if separator not in DOC_SEPARATORS:
        raise LmlabError(f"unknown document separator {separator!r}",
                         f"use one of: {', '.join(DOC_SEPARATORS)}")


def iter_documents(path: str | os.PathLike, separator: str = "blank-line",
                   encoding: str = "utf-8", text_field: str = "text") -> Iterator[str]:
    """Yield the documents of one input file (see the module docstring for the rules): a text
    file cut by ``separator``, or a JSON Lines / Parquet file, one document per record
    (its ``text_field``; :mod:`lmlab.data.records`)."""
    _check_separator(separator)
    if is_record_file(path):
        for text in iter_record_texts(path, text_field):
            if text.strip():
                yield text.replace("\r\n", "\n").replace("\r", "\n")
        return
    lines = iter_text_lines(path, encoding)
    if separator == "file":
        text = "".join(lines).replace("\r\n", "\n").replace("\r", "\n")
        if text.strip():
            yield text
        return
    if separator == "line":
        for line in lines:
            line = _strip_eol(line)
            if line.strip():
                yield line
        return
    para: list[str] = []
    for line in lines:
        line = _strip_eol(line)
        if line.strip():
            para.append(line)
        elif para:
            yield "\n".join(para)
            para = []
    if para:
        yield "\n".join(para)


def val_score(text: str, seed: int = 0) -> float:
    """A document's position in [0, 1) under the seeded hash; ``< val_fraction`` means val."""
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little") / 2**64


# --------------------------------------------------------------------------- workers
_STATE: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, dtype: str, seed: int, val_fraction: float, eos_id: int | None) -> None:
    from lmlab.tokenizers import load_tokenizer

    _STATE.update(tokenizer=load_tokenizer(tokenizer_dir), dtype=np.dtype(dtype), seed=seed,
                  val_fraction=val_fraction, eos_id=eos_id)


def _init_pool_worker(*args) -> None:
    """Pool initializer: leave Ctrl-C to the parent (which stops the pool), then load the tokenizer."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init_worker(*args)


def _encode_batch(docs: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """Encode a batch of documents; per split: (ids concatenated, length of each doc, UTF-8 bytes)."""
    tok, eos = _STATE["tokenizer"], _STATE["eos_id"]
    ids_of = {s: [] for s in SPLITS}
    lengths_of: dict[str, list[int]] = {s: [] for s in SPLITS}
    bytes_of = dict.fromkeys(SPLITS, 0)
    for text in docs:
        ids = tok.encode(text)
        if not ids:
            continue
        if eos is not None:
            ids.append(eos)
        split = "val" if val_score(text, _STATE["seed"]) < _STATE["val_fraction"] else "train"
        ids_of[split].extend(ids)
        lengths_of[split].append(len(ids))
        bytes_of[split] += len(text.encode("utf-8"))
    return {s: (np.array(ids_of[s], dtype=np.int64).astype(_STATE["dtype"]),
                np.array(lengths_of[s], dtype=np.int64), bytes_of[s]) for s in SPLITS}


def _batches(docs: Iterable[str], max_chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    batch, size = [], 0
    for d in docs:
        batch.append(d)
        size += len(d)
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# --------------------------------------------------------------------------- pipeline
@dataclass
class PrepareSummary:
    """What ``prepare_shards`` wrote, for the end-of-run report."""

    out: Path
    dtype: str
    vocab_size: int
    splits: dict[str, dict[str, Any]]
    seconds: float
    input_bytes: int
    workers: int
    inputs: list[dict[str, Any]] = field(default_factory=list)
    val_fraction: float = 0.0
    replaced: bool = False  # ``out`` held earlier shards, which these replaced
    workers_note: str | None = None  # why ``workers`` is fewer than were asked for

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / max(self.seconds, 1e-9)

    def report(self, split_names: dict[str, str] | None = None) -> str:
        """A few lines for people: what was written, then one line per split. The val split is left
        out when no val fraction was asked for (it is empty by design); ``split_names`` renames
        splits in the lines, e.g. ``{"train": "val"}`` for a folder that holds validation text only."""
        names = split_names or {}
        docs = sum(s["documents"] for s in self.splits.values())
        what = "replaced the earlier shards in" if self.replaced else "prepared"
        lines = [f"{what} {self.out}/: {docs:,} documents, {self.input_bytes / 1e6:.2f} MB of text in "
                 f"{self.seconds:.1f}s ({self.mb_per_s:.2f} MB/s, {self.workers} worker"
                 f"{'s' if self.workers != 1 else ''}), {self.dtype} ids, vocabulary {self.vocab_size:,}"]
        if self.workers_note:
            lines.append(f"  note: {self.workers_note}")
        for name, s in self.splits.items():
            if name == "val" and not s["documents"] and not self.val_fraction:
                continue
            bpt = s["bytes"] / s["tokens"] if s["tokens"] else 0.0
            n = len(s["shards"])
            label = names.get(name, name) + ":"
            lines.append(f"  {label:6} {s['documents']:>9,} documents {s['tokens']:>13,} tokens "
                         f"{bpt:5.2f} bytes/token  {n} shard{'s' if n != 1 else ''}")
        return "\n".join(lines)


def prepare_shards(tokenizer: str | os.PathLike, inputs: Sequence[str | os.PathLike], out: str | os.PathLike,
                   val_fraction: float = 0.0, workers: int | None = None, encoding: str = "utf-8",
                   shard_tokens: int = DEFAULT_SHARD_TOKENS, doc_separator: str = "blank-line", seed: int = 0,
                   append_eos: bool = False, progress: bool | None = None, text_field: str = "text",
                   val_fraction_key: str = "--val-fraction") -> PrepareSummary:
    """Tokenize ``inputs`` with the tokenizer at ``tokenizer`` into a shards directory ``out``.
    ``val_fraction_key``: how the command in use spells ``val_fraction`` in its errors' fixes
    (``--val-fraction`` for ``lmlab data prepare``, ``data.val_fraction`` for ``pretrain``).

    Returns a :class:`PrepareSummary`. Raises :class:`LmlabError` for bad input before or
    while writing; ``out`` is then left exactly as it was (absent, or the previous shards).
    """
    t0 = time.perf_counter()
    tokenizer = path_argument(tokenizer, "prepare_shards's tokenizer")
    inputs = path_list_argument(inputs, "prepare_shards's inputs")
    out = path_argument(out, "prepare_shards's out")
    append_eos = flag_argument(append_eos, "prepare_shards's append_eos")  # "no" would be true
    if progress is not None:
        progress = flag_argument(progress, "prepare_shards's progress")
    files, workers, workers_note = _check_options(inputs, val_fraction, workers, shard_tokens, doc_separator,
                                                  seed, encoding)
    tok = load_tokenizer(tokenizer)
    eos_id = _eos_id(tok, tokenizer) if append_eos else None
    dtype = dtype_for_vocab(tok.vocab_size)
    out = Path(out)
    ownership.check_output_spares_inputs(out, {"--input": files, "--tokenizer": tokenizer})
    if progress is None:  # a bar on a terminal; nothing in a log (its summary says what was made)
        progress = sys.stderr.isatty()
    # spawn (the parent may hold threads that a fork would copy mid-lock), unless that would run an
    # unguarded script again; then fork, or this process (lmlab.processes)
    method = None if workers == 1 else start_method("data preparation", workers)
    if method is None:
        workers = 1

    replaced = (out / INDEX_FILE).is_file()  # atomic_dir refuses an ``out`` that is not earlier shards
    with atomic_dir(out, marker=INDEX_FILE, what="token-shards") as tmp:
        tok_dir = tok.save(tmp / TOKENIZER_DIR)
        writers = {s: ShardWriter(tmp, s, dtype, shard_tokens) for s in SPLITS}
        per_file: list[dict[str, Any]] = []
        documents = _documents(files, doc_separator, encoding, text_field, per_file)
        init_args = (str(tok_dir), dtype.str, seed, val_fraction, eos_id)
        _encode_into(writers, documents, method, workers, init_args, files, progress)
        splits = {s: w.close() for s, w in writers.items()}
        _check_splits(splits, val_fraction, val_fraction_key)
        write_index(
            tmp, dtype, tok.vocab_size, splits,
            tokenizer={"dir": TOKENIZER_DIR, "source": str(Path(tokenizer).resolve()), "algo": tok.algo,
                       "sha256": tokenizer_sha256(tok_dir)},
            documents={"separator": doc_separator, "boundaries": "doc_starts", "eos_appended": append_eos,
                       "eos_id": eos_id},
            split={"val_fraction": val_fraction, "seed": seed, "hash": "blake2b-64(utf8(text), key=seed)"},
            encoding=encoding, shard_tokens=shard_tokens, inputs=per_file,
        )
    seconds = time.perf_counter() - t0
    total = sum(s["bytes"] for s in splits.values())
    return PrepareSummary(out, dtype.name, tok.vocab_size, splits, seconds, total, workers, per_file,
                          val_fraction, replaced, workers_note)


def _check_options(inputs, val_fraction: float, workers: int | None, shard_tokens: int, doc_separator: str,
                   seed: int, encoding: str) -> tuple[list[Path], int, str | None]:
    """The input files, the worker count and its note (:func:`cap_workers`), after checking every
    option of :func:`prepare_shards` that needs no tokenizer."""
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise LmlabError("no input files given", "pass one or more text files")
    files = [Path(f) if is_dataset_dir(f) else check_input_file(f) for f in inputs]
    # the ranges of --val-fraction, --workers, --shard-tokens and --seed
    number_argument(values.Fraction, val_fraction, "prepare_shards' val_fraction")
    workers = default_workers() if workers is None else number_argument(values.Workers, workers,
                                                                         "prepare_shards' workers")
    workers, workers_note = cap_workers(workers)  # each worker is a process with its own tokenizer
    number_argument(values.ShardTokens, shard_tokens, "prepare_shards' shard_tokens")
    _check_separator(doc_separator)
    number_argument(values.Seed, seed, "prepare_shards' seed")
    check_encoding(encoding)
    return files, workers, workers_note


def _eos_id(tok, tokenizer) -> int:
    """The end-of-sequence id that --append-eos appends (an error when the tokenizer has none)."""
    eos_id = tok.eos_id
    if eos_id is None:
        raise LmlabError(f"tokenizer {tokenizer} has no end-of-sequence token for --append-eos",
                         "train it with an </s> or <|endoftext|> special token, or drop --append-eos")
    return eos_id


def _documents(files: list[Path], doc_separator: str, encoding: str, text_field: str,
               per_file: list[dict[str, Any]]) -> Iterator[str]:
    """Every document of ``files`` in order; each file's path, size and documents join ``per_file``
    once it is read (an error for a file without any text)."""
    for f in files:
        n = 0
        for doc in require_text(iter_documents(f, doc_separator, encoding, text_field), f):
            n += 1
            yield doc
        per_file.append({"path": str(f.resolve()), "bytes": input_bytes(f), "documents": n})


def _encode_into(writers: dict[str, ShardWriter], documents: Iterable[str], method: str | None, workers: int,
                 init_args: tuple, files: list[Path], progress: bool) -> None:
    """Encode ``documents`` (those of ``files``, on ``workers`` processes) into the split ``writers``;
    on any error the writers are aborted."""
    try:
        # the workers start before the progress bar's thread does (a fork copies no thread)
        with _encoder(method, workers, init_args) as encode:
            bar, done = _progress_bar(sum(input_bytes(f) for f in files), progress), 0
            try:
                for result in encode(_batches(documents)):
                    for split, (ids, lengths, nbytes) in result.items():
                        writers[split].add(ids, lengths, nbytes)
                        done += nbytes
                        bar.update(done)
            finally:
                bar.close()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise


def _check_splits(splits: dict[str, dict[str, Any]], val_fraction: float,
                  key: str = "--val-fraction") -> None:
    """A train split with tokens, and a val split with tokens when one was asked for (``key``: the
    name of the val fraction in the command in use)."""
    if splits["train"]["tokens"] == 0:
        raise LmlabError("no document went to the train split", f"lower {key} or add more text")
    if val_fraction > 0 and splits["val"]["tokens"] == 0:
        raise LmlabError(f"no document went to the val split ({splits['train']['documents']} documents, "
                         f"val fraction {val_fraction})", f"raise {key} or add more text")

def _progress_bar(total: int, enabled: bool):
    """The tokenizing progress over the input's bytes, by the one policy of lmlab's long loops
    (:class:`lmlab.progress.Progress`): a bar on a terminal, a line every ~5% otherwise."""
    from lmlab.progress import Progress

    return Progress(total, desc="tokenizing", show="auto" if enabled else "off", unit="byte",
                    log=lambda msg: print(msg, file=sys.stderr, flush=True), unit_scale=True, leave=False)


@contextlib.contextmanager
def _encoder(method: str | None, workers: int, init_args: tuple) -> Iterator[Callable[[Iterable], Iterator]]:
    """A function from batches to their encodings, in order: in this process (``method`` None), or
    on a pool of ``workers`` processes with bounded look-ahead, started before the block runs."""
    if method is None:
        _init_worker(*init_args)
        try:
            yield lambda batches: map(_encode_batch, batches)
        finally:
            _STATE.clear()
        return
    with worker_pool(method, workers, "data preparation", _init_pool_worker, init_args) as pool:
        yield lambda batches: ordered_results(pool, _encode_batch, batches, ahead=2 * workers)
