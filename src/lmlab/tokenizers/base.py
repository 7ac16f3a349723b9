"""What every lmlab tokenizer shares: vocabulary, special tokens, encoding API, save/load.

A tokenizer algorithm (``bpe.py``, ``bytelevel.py``, ``wordpiece.py``, ``unigram.py``) subclasses
:class:`Tokenizer` and supplies only what is specific to it:

* ``train(texts, vocab_size, special_tokens, **options)`` - the token learner (classmethod);
* ``_segment(text)`` - the token segmenter: ``[(token, start, end), ...]`` with character
  offsets into ``text`` (``text`` never contains special tokens: they are split off first);
* ``_decode_tokens(tokens)`` - tokens back to text;
* ``_hf_parts()`` / ``_from_hf(data, config)`` - the algorithm's part of the Hugging Face
  ``tokenizer.json`` (normalizer, pre_tokenizer, model, decoder) and the reverse.

Everything else lives once, here or in the two mixins this class is built from: special-token
handling, offsets and id validation here; pair encoding with segment ids and batch encoding with
padding/truncation/attention masks in :mod:`lmlab.tokenizers.template_encoding`; save/load in
:mod:`lmlab.tokenizers.hf_json`. The special tokens' defaults and roles are in
:mod:`lmlab.tokenizers.special_tokens`.

On-disk format (stable, and the one users already know): a directory with

* ``tokenizer.json`` - the Hugging Face ``tokenizers`` format; ``tokenizers.Tokenizer.from_file``
  and ``transformers.PreTrainedTokenizerFast`` load it and give the same ids as lmlab;
* ``tokenizer_config.json`` - special-token roles (``cls_token``, ``pad_token``...), the lmlab
  algorithm name and its options, and ``lmlab_format_version``.
"""

from __future__ import annotations

import numbers
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Any, ClassVar

import regex

from lmlab.arguments import text_argument
from lmlab.errors import LmlabError
from lmlab.tokenizers.hf_json import (  # noqa: F401 (re-exported: the format's home is hf_json)
    FORMAT_VERSION,
    HfJsonExport,
    hf_special_tokens,
    hf_vocab_by_id,
)
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.tokenizers.special_tokens import (  # noqa: F401 (re-exported: public names of this module)
    DEFAULT_SPECIAL_TOKENS,
    ROLE_OF_TOKEN,
    ROLES,
    check_special_tokens,
    roles_from_config,
    sentinel_tokens,
)
from lmlab.tokenizers.template_encoding import Encoding, TemplateEncoding  # noqa: F401 (re-exported)


def keyword_options(fn: Callable) -> dict[str, tuple[Any, Any]]:
    """Name -> ``(type, default)`` of a trainer function's options (all but the texts, the
    vocabulary size and the special tokens)."""
    import inspect
    import typing

    hints = typing.get_type_hints(fn, include_extras=True)
    return {n: (hints.get(n, Any), p.default) for n, p in inspect.signature(fn).parameters.items()
            if n not in ("cls", "texts", "vocab_size", "special_tokens")
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}



def setting_name(where: str, key: str) -> str:
    """A training setting as the user wrote it: ``where`` + ``key`` (``data.tokenizer.vocab_size``,
    ``vocab_size``), or the command's flag when ``where`` is ``"--"`` (``--vocab-size``)."""
    return "--" + key.replace("_", "-") if where == "--" else where + key


class Tokenizer(TemplateEncoding, HfJsonExport, ABC):
    """Base class of all lmlab tokenizers. See the module docstring for the subclass contract."""

    algo: ClassVar[str] = ""
    #: The characters (a regular-expression character-class body) with which the ``fast_split``
    #: given to :meth:`_cached_ids` might cut a text differently from its exact ``split``.
    _fast_split_unsafe: ClassVar[str] = ""

    def __init__(self, vocab: Sequence[str], special_tokens: Sequence[str] = (), roles: dict | None = None):
        self.vocab: list[str] = list(vocab)
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.vocab)}
        if len(self.token_to_id) != len(self.vocab):
            dup = next(t for i, t in enumerate(self.vocab) if self.token_to_id[t] != i)
            raise LmlabError(f"vocabulary lists token {dup!r} twice", "remove the duplicate")
        special_tokens = check_special_tokens(special_tokens)
        missing = [t for t in special_tokens if t not in self.token_to_id]
        if missing:
            raise LmlabError(
                f"special tokens {missing} are not in the vocabulary", "add them to the vocabulary"
            )
        self.special_tokens: list[str] = list(dict.fromkeys(special_tokens))
        self.roles: dict[str, str] = {}
        for t in self.special_tokens:
            role = ROLE_OF_TOKEN.get(t)
            if role and role not in self.roles:
                self.roles[role] = t
        for role, tok in (roles or {}).items():
            if tok is not None:
                if role not in ROLES:
                    raise LmlabError(f"unknown special-token role {role!r}", f"use one of {', '.join(ROLES)}")
                self.roles[role] = tok
                if tok not in self.special_tokens and tok in self.token_to_id:
                    self.special_tokens.append(tok)
        self._special_ids = {self.token_to_id[t] for t in self.special_tokens}
        self._special_re = None
        if self.special_tokens:
            alts = sorted(self.special_tokens, key=len, reverse=True)
            self._special_re = regex.compile("|".join(regex.escape(t) for t in alts))
        # a text with none of these characters holds no special token and may take the fast split
        unsafe = re.escape("".join(sorted({t[:1] for t in self.special_tokens}))) + self._fast_split_unsafe
        self._slow_path_char = re.compile(f"[{unsafe}]").search if unsafe else None

    # ----------------------------------------------------------------- subclass contract
    @classmethod
    @abstractmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int | None, special_tokens: Sequence[str], **options
    ) -> Tokenizer:
        """Learn a vocabulary from ``texts`` (an iterable of strings, streamed once or more)."""

    @classmethod
    def train_options(cls) -> dict[str, tuple[Any, Any]]:
        """Name -> ``(type, default)`` of each option :meth:`train` takes besides the texts, the
        vocabulary size and the special tokens: read off its signature, whose types
        (:mod:`lmlab.values`) hold each option's range."""
        return keyword_options(cls.train)

    @classmethod
    def min_vocab_size(cls, special_tokens: Sequence[str], options: dict[str, Any]) -> int:
        """The smallest vocabulary the trainer can make with ``special_tokens`` and ``options``,
        whatever the text: the special tokens plus one learned token (algorithms with a fixed
        alphabet, byte-level BPE's 256 bytes, say more)."""
        return len(dict.fromkeys(special_tokens)) + 1

    @classmethod
    def check_train_options(cls, vocab_size: int | None, special_tokens: Sequence[str],
                            options: dict[str, Any], where: str = "") -> None:
        """The rules between the training settings that need no text (each value's own range is its
        type's, :meth:`train_options`): each special token is given once, a vocabulary size is
        given and holds at least :meth:`min_vocab_size` tokens. ``where`` prefixes the names
        (``data.tokenizer.``; ``--``: the command's flags). The one copy, run by
        :func:`lmlab.tokenizers.train_tokenizer` and when a recipe is read."""
        from lmlab import values

        twice = values.repeated(special_tokens)
        if twice is not None:
            tokens = setting_name(where, "special_tokens")
            raise LmlabError(f"{tokens} holds {twice!r} more than once",
                             f"give each special token once (drop the repeated {twice!r})")
        size = setting_name(where, "vocab_size")
        if vocab_size is None:
            raise LmlabError(f"{size} is missing: {cls.algo} training needs a vocabulary size",
                             f"set {size}, e.g. 8000")
        need = cls.min_vocab_size(special_tokens, options)
        if vocab_size < need:
            raise LmlabError(f"{size} {vocab_size} is too small for {cls.algo}: its "
                             f"{len(dict.fromkeys(special_tokens))} special tokens and base symbols already "
                             f"need {need}", f"set {size} >= {need}")

    @abstractmethod
    def _segment(self, text: str) -> list[tuple[str, int, int]]:
        """Segment ``text`` (free of special tokens) into ``(token, start, end)`` triples."""

    @abstractmethod
    def _decode_tokens(self, tokens: list[str]) -> str:
        """Join non-special tokens back into text."""

    @abstractmethod
    def _hf_parts(self) -> dict[str, Any]:
        """The algorithm's ``normalizer``, ``pre_tokenizer``, ``model`` and ``decoder`` (tokenizer.json)."""

    @classmethod
    @abstractmethod
    def _from_hf(cls, data: dict[str, Any], config: dict[str, Any]) -> Tokenizer:
        """Rebuild from a parsed tokenizer.json (``data``) and tokenizer_config.json (``config``)."""

    def _options(self) -> dict[str, Any]:
        """Algorithm options stored in tokenizer_config.json under ``lmlab_options``."""
        return {}

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def role_id(self, role: str) -> int | None:
        """Id of the special token playing ``role`` (``pad``, ``unk``, ``cls``...), or None."""
        tok = self.roles.get(role)
        return None if tok is None else self.token_to_id[tok]

    pad_id = property(lambda self: self.role_id("pad"))
    unk_id = property(lambda self: self.role_id("unk"))
    cls_id = property(lambda self: self.role_id("cls"))
    sep_id = property(lambda self: self.role_id("sep"))
    mask_id = property(lambda self: self.role_id("mask"))
    bos_id = property(lambda self: self.role_id("bos"))
    eos_id = property(lambda self: self.role_id("eos"))

    @property
    def special_ids(self) -> set[int]:
        return set(self._special_ids)

    def add_special_tokens(self, tokens: Sequence[str]) -> list[int]:
        """Append special tokens (sentinels, ``<summarize>``...) not yet in the vocabulary; return ids."""
        for t in tokens:
            if t not in self.token_to_id:
                self.token_to_id[t] = len(self.vocab)
                self.vocab.append(t)
        Tokenizer.__init__(self, self.vocab, self.special_tokens + list(tokens), roles=self.roles)
        return [self.token_to_id[t] for t in tokens]

    def id_of(self, token: str) -> int:
        """Id of ``token``; unknown tokens map to the ``unk`` id (error if there is none)."""
        i = self.token_to_id.get(token)
        if i is not None:
            return i
        if self.unk_id is None:
            raise LmlabError(
                f"token {token!r} is not in the vocabulary and the tokenizer has no unknown token",
                "train with an [UNK] special token or a byte-level tokenizer",
            )
        return self.unk_id

    # ----------------------------------------------------------------- encoding
    def _token_ids(self, tokens: list[str]) -> list[int]:
        """Ids of ``tokens`` as :meth:`id_of` gives them (one C lookup each unless one is unknown)."""
        ids = list(map(self.token_to_id.get, tokens))
        return [self.id_of(t) for t in tokens] if None in ids else ids

    def _split_specials(self, text: str) -> list[tuple[str, int, bool]]:
        """Split text into (piece, start, is_special) around special tokens written literally."""
        if not self._special_re or not text:
            return [(text, 0, False)] if text else []
        out, pos = [], 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.append((text[pos : m.start()], pos, False))
            out.append((m.group(), m.start(), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], pos, False))
        return out

    def __getstate__(self) -> dict:
        """Pickled (``encode_many``'s spawned workers) without its per-word caches (every
        ``..._cache`` dict, emptied; an :class:`IdsCache` pickles empty by itself): a warm tokenizer
        would otherwise ship up to hundreds of thousands of cached words to every worker."""
        state = self.__dict__.copy()
        for name, value in state.items():
            if name.endswith("_cache") and isinstance(value, dict) and not isinstance(value, IdsCache):
                state[name] = {}
        return state

    def _cached_ids(self, text: str, split: Callable[[str], Iterable[str]],
                    fast_split: Callable[[str], Iterable[str]] | None = None) -> list[int]:
        """Ids of ``text`` with no offsets (the fast path of ``encode``): special tokens by id, the
        rest cut into words by ``split``, each word's ids from ``self._ids_cache`` (an
        :class:`IdsCache`, which computes and stores the words it lacks).

        A text without any character that starts a special token or is in ``_fast_split_unsafe``
        (one cheap search) is cut by ``fast_split`` (default ``split``) in one go, and its ids are
        gathered from the cache at C speed."""
        words = self._ids_cache.__getitem__
        find = self._slow_path_char
        try:
            fast = find is None or find(text) is None
        except TypeError:
            text_argument(text, "encode")  # not a string: the one-line error
            raise
        if fast:
            return list(chain.from_iterable(map(words, (fast_split or split)(text))))
        ids: list[int] = []
        for piece, _, special in self._split_specials(text):
            if special:
                ids.append(self.token_to_id[piece])
            else:
                ids += chain.from_iterable(map(words, split(piece)))
        return ids

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """``(token, start, end)`` for every token of ``text``, special tokens included where written."""
        text_argument(text, "tokenize")
        out: list[tuple[str, int, int]] = []
        for piece, start, special in self._split_specials(text):
            if special:
                out.append((piece, start, start + len(piece)))
            else:
                out.extend((t, s + start, e + start) for t, s, e in self._segment(piece))
        return out

    def tokenize(self, text: str) -> list[str]:
        """Text -> token strings (no special tokens added)."""
        return [t for t, _, _ in self.tokenize_with_offsets(text)]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids. With ``add_special_tokens`` the template adds e.g. ``[CLS] ... [SEP]``."""
        if add_special_tokens:
            return self.encode_plus(text).ids
        return [self.id_of(t) for t in self.tokenize(text)]

    def encode_many(
        self, texts: Sequence[str], workers: int | None = None, chunk_size: int = 2000
    ) -> list[list[int]]:
        """Encode many texts (no special tokens added), on ``workers`` processes.

        ``workers`` defaults to the CPUs this process may use; inputs of at most one chunk
        (``chunk_size`` texts) stay in-process. Every process, this one included, encodes its own
        contiguous share of the chunks, then takes chunks left in the others' shares; on Linux the
        workers are forked copies of this process (see :mod:`lmlab.tokenizers.bulk`). The cyclic
        garbage collector is paused for the call. The result equals
        ``[self.encode(t) for t in texts]``.
        """
        from lmlab import values
        from lmlab.arguments import number_argument, optional_number

        number_argument(values.Count, chunk_size, "encode_many's chunk_size")
        optional_number(values.Workers, workers, "encode_many's workers")  # None: the CPUs it may use
        texts = texts if isinstance(texts, list) else list(texts)
        if workers is None:
            from lmlab.runtime import available_cpus

            workers = available_cpus()
        workers = max(1, min(workers, -(-len(texts) // chunk_size)))
        from multiprocessing import current_process

        from lmlab.tokenizers.bulk import encode_parallel
        from lmlab.tokenizers.gc_pause import gc_paused

        if workers == 1 or current_process().daemon:  # a pool's worker may not start processes
            with gc_paused():
                return [self.encode(t) for t in texts]
        return encode_parallel(self, texts, workers, chunk_size)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        from lmlab.arguments import describe, not_text_argument

        ids = list(not_text_argument(ids, "decode"))
        n = len(self.vocab)
        for i in ids:
            if not isinstance(i, numbers.Integral) or isinstance(i, bool):
                raise LmlabError(f"decode takes token ids (whole numbers), got {describe(i)} among them",
                                 "pass a list of ids, such as tokenizer.encode(text) gives")
            if not 0 <= int(i) < n:
                raise LmlabError(
                    f"token id {i!r} is out of range for a vocabulary of {n}",
                    f"pass ids between 0 and {n - 1} (was this produced by another tokenizer?)",
                )
        return [self.vocab[int(i)] for i in ids]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text. Special tokens are written as themselves unless skipped."""
        tokens = self.convert_ids_to_tokens(ids)
        out, run = [], []
        for t in tokens:
            if t in self.token_to_id and self.token_to_id[t] in self._special_ids:
                if run:
                    out.append(self._decode_tokens(run))
                    run = []
                if not skip_special_tokens:
                    out.append(t)
            else:
                run.append(t)
        if run:
            out.append(self._decode_tokens(run))
        return "".join(out)


    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"
