"""Subword tokenizers: a learner and a segmenter for each of four algorithms.

>>> from lmlab.tokenizers import train_tokenizer, load_tokenizer
>>> tok = train_tokenizer("bpe", ["low low lower newest"], num_merges=4)
>>> tok.tokenize("lower")  # doctest: +SKIP

Algorithms (``ALGORITHMS``): ``bpe`` (character BPE with end-of-word ``_``), ``bytelevel``
(GPT-2 style byte-level BPE), ``wordpiece`` (BERT) and ``unigram`` (SentencePiece-style).
Adding one is one module plus one line in ``ALGORITHMS``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from lmlab.errors import LmlabError, UnsupportedInput
from lmlab.fileio import read_json
from lmlab.lazy import lazy_exports

if TYPE_CHECKING:
    from pathlib import Path

    from lmlab.tokenizers.base import Tokenizer

# imported on first use: the command-line parser reads ALGORITHMS without the tokenizers' machinery
__getattr__, __dir__ = lazy_exports(__name__, {
    "base": ("DEFAULT_SPECIAL_TOKENS", "Encoding", "Tokenizer", "check_special_tokens", "sentinel_tokens"),
})

#: algorithm name -> "module:Class"
ALGORITHMS = {
    "bpe": "lmlab.tokenizers.bpe:CharBPETokenizer",
    "bytelevel": "lmlab.tokenizers.bytelevel:ByteLevelBPETokenizer",
    "wordpiece": "lmlab.tokenizers.wordpiece:WordPieceTokenizer",
    "unigram": "lmlab.tokenizers.unigram:UnigramTokenizer",
}

__all__ = [
    "ALGORITHMS",
    "DEFAULT_SPECIAL_TOKENS",
    "Encoding",
    "Tokenizer",
    "load_tokenizer",
    "sentinel_tokens",
    "tokenizer_class",
    "train_tokenizer",
]


def tokenizer_class(algo: str) -> type[Tokenizer]:
    """The Tokenizer subclass implementing ``algo``."""
    if algo not in ALGORITHMS:
        raise LmlabError(f"unknown tokenizer algorithm {algo!r}", f"choose one of: {', '.join(ALGORITHMS)}")
    module, cls = ALGORITHMS[algo].split(":")
    return getattr(importlib.import_module(module), cls)


def train_tokenizer(
    algo: str,
    texts: Iterable[str],
    vocab_size: int | None = None,
    special_tokens: Sequence[str] | None = None,
    warn: Callable[[str], None] | None = None,
    **options,
) -> Tokenizer:
    """Learn a tokenizer of kind ``algo`` from ``texts`` (strings: documents or lines).

    ``vocab_size`` counts everything, special tokens included. For ``bpe`` you may instead give
    ``num_merges=K``. ``special_tokens`` defaults to ``DEFAULT_SPECIAL_TOKENS``; pass ``[]`` for none.
    Other keyword options are algorithm-specific (see each class's ``train``). A vocabulary that
    comes out far smaller than ``vocab_size`` (the text holds no more to learn) is said in one
    ``warning:`` line, to ``warn`` (default: stderr).
    """
    from lmlab import values
    from lmlab.arguments import optional_number, text_list_argument, text_stream_argument
    from lmlab.tokenizers.base import DEFAULT_SPECIAL_TOKENS, check_special_tokens
    from lmlab.values import check

    cls = tokenizer_class(algo)
    texts = text_stream_argument(texts, "train_tokenizer's texts")  # not characters, not numbers
    if special_tokens is not None:
        special_tokens = text_list_argument(special_tokens, "special_tokens")
    optional_number(values.Count, vocab_size, "train_tokenizer's vocab_size")  # True is not 1
    specials = check_special_tokens(DEFAULT_SPECIAL_TOKENS if special_tokens is None else special_tokens)
    settings = training_settings(algo)
    options = {k: check(settings[k], v, k) if k in settings else v for k, v in options.items()}
    check_training(algo, vocab_size, specials, options)  # before a line of text is read
    tok = cls.train(texts, vocab_size, specials, **options)
    if vocab_size is not None and tok.vocab_size < SHORT_VOCAB * vocab_size:
        (warn or (lambda msg: print(msg, file=sys.stderr, flush=True)))(
            f"warning: the {algo} tokenizer learned {tok.vocab_size:,} tokens, far fewer than the "
            f"{vocab_size:,} asked for: its training text holds no more to learn (pass more, or varied, "
            "text for that vocabulary size)")
    return tok


#: the keys of a ``[data] tokenizer`` table besides the trainer's options
TABLE_KEYS = ("algo", "vocab_size", "input", "special_tokens")


def training_settings(algo: str) -> dict[str, object]:
    """Name -> value type (:mod:`lmlab.values`) of every setting of training an ``algo`` tokenizer:
    ``vocab_size``, ``special_tokens`` and the options of its trainer (read off its signature,
    :meth:`~lmlab.tokenizers.base.Tokenizer.train_options`)."""
    from lmlab.values import Count, Text

    return {"vocab_size": Count | None, "special_tokens": list[Text] | None,
            **{name: hint for name, (hint, _) in tokenizer_class(algo).train_options().items()}}


def check_training(algo: str, vocab_size: int | None, special_tokens: Sequence[str] | None,
                   options: dict, where: str = "") -> None:
    """The one check of a tokenizer's training settings before any text is read (each value's type
    checked by the caller against :func:`training_settings`): every option is one the ``algo``
    trainer takes, and the rules between them hold (a vocabulary size, at least as large as the
    special tokens and the base symbols: :meth:`~lmlab.tokenizers.base.Tokenizer.check_train_options`).
    ``where`` prefixes the names (``data.tokenizer.``; ``"--"``: a command's flags, ``--vocab-size``,
    as `lmlab tokenizer train` and `lmlab demo` check before any work). :func:`train_tokenizer` (and so
    `lmlab tokenizer train`) and a recipe's ``[data] tokenizer`` table (:mod:`lmlab.config.data`)
    both come here."""
    import difflib

    from lmlab.tokenizers.base import DEFAULT_SPECIAL_TOKENS

    cls = tokenizer_class(algo)
    known = cls.train_options()
    for key in options:
        if key not in known:
            names = [*TABLE_KEYS, *known]
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            valid = ", ".join(where + n for n in names)
            fix = f"did you mean {where}{close[0]}? (valid: {valid})" if close else f"valid: {valid}"
            raise LmlabError(f"unknown option {where}{key} of the {algo} tokenizer trainer", fix)
    specials = DEFAULT_SPECIAL_TOKENS if special_tokens is None else special_tokens
    cls.check_train_options(vocab_size, specials, options, where)


#: a trained vocabulary below this share of the size asked for is worth a warning
SHORT_VOCAB = 0.5


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer from an lmlab tokenizer directory, a ``tokenizer.json`` or a BERT ``vocab.txt``,
    or the tokenizer of a model, a checkpoint or a pretraining run (its newest checkpoint's, as
    ``--checkpoint`` reads a run).

    A directory may hold ``tokenizer.json`` (+ ``tokenizer_config.json``) or just a ``vocab.txt``
    (+ ``tokenizer_config.json``, whose ``do_lower_case``/``strip_accents`` are honoured).
    """
    from lmlab.arguments import path_argument

    p = path_argument(path, "load_tokenizer's path")
    if not p.exists():
        raise LmlabError(
            f"tokenizer {p} does not exist", "pass a tokenizer directory, tokenizer.json or vocab.txt"
        )
    if p.is_dir():
        p = _tokenizer_file(p)
    config_path = p.parent / "tokenizer_config.json"
    config = read_json(config_path, "tokenizer config") if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise LmlabError(f"{config_path} is not a JSON object", "re-save the tokenizer")
    try:
        if p.suffix == ".txt":
            from lmlab.tokenizers.wordpiece import WordPieceTokenizer

            return WordPieceTokenizer.from_vocab_file(p, config)
        data = read_json(p, "tokenizer file")
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise LmlabError(f"{p} is not a tokenizer.json (no 'model' section)", "re-save the tokenizer")
        algo = config.get("lmlab_algo") or _guess_algo(data)
        return tokenizer_class(algo)._from_hf(data, config)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:  # valid JSON, damaged content
        raise LmlabError(f"tokenizer {path} is corrupt ({type(e).__name__}: {e})",
                         "re-train it with `lmlab tokenizer train` or save it again") from None


def _tokenizer_file(directory: Path) -> Path:
    """The tokenizer file a directory names: its own ``tokenizer.json`` or ``vocab.txt``, else the one
    in its ``tokenizer/`` folder, which every model lmlab writes has; a pretraining run directory
    means its newest complete checkpoint first (:func:`lmlab.run_dirs.run_checkpoint`, the
    one reading of a run that every ``--checkpoint`` shares)."""
    from lmlab.run_dirs import run_checkpoint

    def own_file(d: Path) -> Path | None:
        for name in ("tokenizer.json", "vocab.txt"):
            if (d / name).is_file():
                return d / name
        return None

    found = own_file(directory)
    if found is None:
        model = run_checkpoint(directory)
        found = own_file(model / "tokenizer")
    if found is None:
        raise LmlabError(
            f"{directory} holds neither tokenizer.json nor vocab.txt, nor a tokenizer/ folder with one",
            "pass a directory written by `lmlab tokenizer train` or tokenizer.save(), a model, a checkpoint "
            "or a pretraining run",
        )
    return found


def _guess_algo(data: dict) -> str:
    """Map a foreign tokenizer.json onto the lmlab algorithm that reads it."""
    kind = data["model"].get("type")
    if kind == "WordPiece":
        return "wordpiece"
    if kind == "Unigram":
        return "unigram"
    if kind == "BPE":
        text = repr(data.get("pre_tokenizer")) + repr(data.get("decoder"))
        return "bytelevel" if "ByteLevel" in text else "bpe"
    raise UnsupportedInput(
        f"tokenizer.json model type {kind!r} is not supported",
        "lmlab reads BPE, WordPiece and Unigram tokenizer.json files",
    )
