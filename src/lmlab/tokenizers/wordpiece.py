"""WordPiece, the subword tokenizer of BERT (Schuster & Nakajima 2012; Devlin et al. 2019).

Token segmenter (BERT's ``WordpieceTokenizer``): the text is first cleaned, normalized and split
into words by BERT's basic tokenizer (:mod:`lmlab.tokenizers.bert_normalize`). Each word is then
cut greedily, longest match first: take the longest prefix of the word that is in the
vocabulary, then the longest vocabulary entry ``##...`` that continues it, and so on::

    unaffable -> un ##aff ##able

A word with a piece that matches nothing, or longer than ``max_input_chars_per_word`` (100)
characters, becomes a single ``[UNK]``. Segmentations are cached per whitespace-free chunk of
text, so real text costs little more than a dictionary lookup per word.

Token learner: like BPE, start from characters (the first character of a word plain, the others
``##c``) and merge adjacent pairs, but pick the pair whose merge most increases the likelihood
of the training data under a unigram model instead of the most frequent pair: by default the
exact log-likelihood gain of the merge (``score="gain"``), or the textbook ratio
``count(ab) / (count(a) * count(b))`` (``score="ratio"``); see
:mod:`lmlab.tokenizers.merge_trainer`. The vocabulary is the special tokens, every initial
symbol, then the merged symbols in the order learned. At segmentation time only the vocabulary
matters (no merge list is kept), exactly as in BERT.

Files: a real BERT ``vocab.txt`` (one token per line, id = line number) loads with
:meth:`WordPieceTokenizer.from_vocab_file`; saving writes ``tokenizer.json`` (``BertNormalizer``
+ ``BertPreTokenizer`` + ``WordPiece`` model and decoder) and a ``vocab.txt`` beside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import chain
from typing import Any

from lmlab.errors import LmlabError, UnsupportedInput
from lmlab.fileio import check_input_file
from lmlab.tokenizers.base import Tokenizer, hf_special_tokens, hf_vocab_by_id, roles_from_config
from lmlab.tokenizers.bert_normalize import BertNormalizer
from lmlab.tokenizers.counting import count_chunks
from lmlab.tokenizers.gain_learner import learn_gain_merges
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.tokenizers.merge_trainer import learn_merges
from lmlab.values import Count, Size, Text, Workers, choice

#: Special tokens of a BERT vocab.txt, recognised when present in the file.
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: BERT's decoding clean-up, applied to each decoded token: no space before these marks, etc.
_CLEANUP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]
_CACHE_LIMIT = 1 << 18
#: Merge scores of the learner: the likelihood gain of the merge (default) and the plain ratio.
WORDPIECE_SCORES = ("gain", "ratio")
WordPieceScore = choice(*WORDPIECE_SCORES)


def _chunks(normalizer: BertNormalizer, text: str) -> list[str]:
    """Module-level (picklable) splitter for :func:`count_chunks`: the whitespace-free chunks."""
    if text.isascii() and text.isprintable():  # no whitespace but " ": str.split cuts where the pattern does
        return text.split()
    return normalizer.chunk_pattern.findall(text)


def _count_words(texts: Iterable[str], normalizer: BertNormalizer, workers: int) -> dict[str, int]:
    """Word counts in first-seen order: count whitespace-free chunks, then split each distinct one.

    Each distinct chunk is normalized and split once, with no cache (a cache of every chunk's
    words and offsets cost more memory than the learner itself): ASCII letters and digits are one
    word, other printable ASCII goes through the fast path of :meth:`BertNormalizer.ascii_words`;
    the order of first occurrence is the same as splitting the whole stream.
    """
    counts: dict[str, int] = {}
    lower = normalizer.lowercase
    for chunk, n in count_chunks(texts, partial(_chunks, normalizer), workers=workers).items():
        if chunk.isascii() and chunk.isalnum():  # ASCII letters and digits (most chunks): one word
            word = chunk.lower() if lower else chunk
            counts[word] = counts.get(word, 0) + n
            continue
        words = normalizer.ascii_words(chunk)  # other printable ASCII: one regex split
        for word in (w for w, _ in normalizer.split_chunk(chunk)) if words is None else words:
            counts[word] = counts.get(word, 0) + n
    if not counts:
        raise LmlabError("the training corpus is empty (no words found)",
                         "pass files or texts that contain text")
    return counts


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece: basic tokenizer + greedy longest-match-first with ``##`` continuations."""

    algo = "wordpiece"

    def __init__(self, vocab: Sequence[str], special_tokens: Sequence[str] = (), roles: dict | None = None, *,
                 lowercase: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, clean_text: bool = True, unk_token: str = "[UNK]",
                 continuing_subword_prefix: str = "##", max_input_chars_per_word: int = 100):
        roles = dict(roles or {})
        if "unk" not in roles and unk_token in set(vocab):
            roles["unk"] = unk_token
        super().__init__(vocab, special_tokens, roles)
        if not continuing_subword_prefix:
            raise LmlabError("WordPiece needs a non-empty continuing_subword_prefix", "use the default '##'")
        self.normalizer = BertNormalizer(lowercase, strip_accents, tokenize_chinese_chars, clean_text)
        self.unk_token = unk_token
        self.prefix = continuing_subword_prefix
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        self._chunk_re = self.normalizer.chunk_pattern
        # longest piece (without the prefix) worth trying, so a long word costs O(len * longest)
        n = len(self.prefix)
        self._longest = max((len(t) - n if t.startswith(self.prefix) else len(t) for t in self.vocab),
                            default=1)
        self._chunk_cache: dict[str, list[tuple[str, int, int]]] = {}
        self._word_cache: dict[str, list[tuple[str, int, int]]] = {}
        self._ids_cache = IdsCache(self._chunk_ids)

    @property
    def lowercase(self) -> bool:
        return self.normalizer.lowercase

    # ------------------------------------------------------------------ segmenter
    def segment_word(self, word: str) -> list[tuple[str, int, int]]:
        """Greedy longest-match-first pieces of one normalized word, with character spans in it.

        ``[(unk_token, 0, len(word))]`` when some position matches no vocabulary entry or the word
        is longer than ``max_input_chars_per_word``.
        """
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [(self.unk_token, 0, n)]
        vocab, prefix, longest = self.token_to_id, self.prefix, self._longest
        pieces = []
        start = 0
        while start < n:
            end = min(n, start + longest)
            while end > start:
                piece = word[start:end] if start == 0 else prefix + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            else:
                return [(self.unk_token, 0, n)]
            pieces.append((piece, start, end))
            start = end
        return pieces

    def _cached_word(self, word: str) -> list[tuple[str, int, int]]:
        pieces = self._word_cache.get(word)
        if pieces is None:
            pieces = self.segment_word(word)
            if len(self._word_cache) >= _CACHE_LIMIT:
                self._word_cache.clear()
            self._word_cache[word] = pieces
        return pieces

    def _segment_chunk(self, chunk: str) -> list[tuple[str, int, int]]:
        """Tokens of a whitespace-free chunk with offsets into it (cached by the caller)."""
        out = []
        for word, src in self.normalizer.split_chunk(chunk):
            pieces = self._cached_word(word)
            out.extend((tok, src[a], src[b - 1] + 1) for tok, a, b in pieces)
        return out

    def _segment(self, text: str) -> list[tuple[str, int, int]]:
        out: list[tuple[str, int, int]] = []
        cache = self._chunk_cache
        append = out.append
        for m in self._chunk_re.finditer(text):
            chunk = m[0]
            toks = cache.get(chunk)
            if toks is None:
                toks = self._segment_chunk(chunk)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[chunk] = toks
            base = m.start()
            if len(toks) == 1:
                t, s, e = toks[0]
                append((t, s + base, e + base))
            else:
                out += [(t, s + base, e + base) for t, s, e in toks]
        return out

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids; same result as the base class, with ids cached per chunk (the fast path)."""
        if add_special_tokens:
            return super().encode(text, add_special_tokens=True)
        return self._cached_ids(text, self._chunk_re.findall)

    def _chunk_ids(self, chunk: str) -> list[int]:
        """Ids of a whitespace-free chunk; printable ASCII skips the offset bookkeeping."""
        words = self.normalizer.ascii_words(chunk)
        if words is None:
            return [self.id_of(t) for t, _, _ in self._segment(chunk)]
        return [self.id_of(t) for w in words for t, _, _ in self._cached_word(w)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text. Special tokens are words like any other (``"[CLS] hello [SEP]"``), as in BERT."""
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            tokens = [t for t in tokens if self.token_to_id[t] not in self._special_ids]
        return self._decode_tokens(tokens)

    def _decode_tokens(self, tokens: list[str]) -> str:
        """Join tokens with spaces, gluing ``##`` pieces to the previous one, then BERT's clean-up.

        Like Hugging Face's WordPiece decoder, the clean-up runs on each token with its leading
        space, so in practice ``. ? ! ,`` attach to the previous word: ``"hello , world"`` ->
        ``"hello, world"``. Lower-casing, accents and spacing around other punctuation are not
        restored.
        """
        parts = []
        for i, tok in enumerate(tokens):
            if i:
                tok = tok[len(self.prefix):] if tok.startswith(self.prefix) else " " + tok
            for dirty, clean in _CLEANUP:
                tok = tok.replace(dirty, clean)
            parts.append(tok)
        return "".join(parts)

    # ------------------------------------------------------------------ learner
    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int | None, special_tokens: Sequence[str], *,
              lowercase: bool = False, strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
              clean_text: bool = True, max_input_chars_per_word: Count = 100, min_frequency: Size = 1,
              unk_token: Text = "[UNK]", score: WordPieceScore = "gain", progress: bool = False,
              workers: Workers = 1) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary of ``vocab_size`` tokens (special tokens included).

        Words come from the BERT basic tokenizer with the given options (``lowercase`` also strips
        accents unless ``strip_accents`` says otherwise). The vocabulary is ``special_tokens``
        (``unk_token`` is appended if missing: WordPiece needs it), every initial symbol (``c`` and
        ``##c`` forms seen in the corpus), then merged symbols chosen by likelihood score until
        ``vocab_size`` is reached or no pair occurs ``min_frequency`` times. Words longer than
        ``max_input_chars_per_word`` are skipped (they always segment to ``[UNK]``). ``workers``
        > 1 counts words in that many processes.

        ``score`` picks the likelihood criterion: ``"gain"`` (default) merges the pair whose merge
        raises the unigram log-likelihood of the corpus most (frequent, strongly associated pairs:
        a vocabulary like BERT's); ``"ratio"`` is the textbook ``count(ab) / (count(a) * count(b))``,
        which ranks pairs of rare symbols first (see docs/tokenizers-wordpiece.md).
        """
        cls.check_train_options(vocab_size, special_tokens, {"unk_token": unk_token})
        if score not in WORDPIECE_SCORES:
            raise LmlabError(f"unknown WordPiece score {score!r}",
                             f"use one of {', '.join(WORDPIECE_SCORES)}")
        prefix = "##"
        normalizer = BertNormalizer(lowercase, strip_accents, tokenize_chinese_chars, clean_text)
        counts = _count_words(texts, normalizer, workers)
        mark = prefix.__add__
        word_counts = {(w[0], *map(mark, w[1:])): n for w, n in counts.items()
                       if len(w) <= max_input_chars_per_word}
        alphabet = sorted(set(chain.from_iterable(word_counts)), key=lambda s: (s.startswith(prefix), s))
        specials = list(dict.fromkeys([*special_tokens, unk_token]))
        base = list(dict.fromkeys([*specials, *alphabet]))
        if vocab_size < len(base):
            raise LmlabError(f"vocab_size {vocab_size} is too small: the {len(specials)} special tokens and "
                             f"{len(alphabet)} initial symbols (characters and ##characters) of the corpus "
                             f"already need {len(base)}", f"use vocab_size >= {len(base)}")
        budget = vocab_size - len(base)

        def join(a: str, b: str) -> str:
            return a + b[len(prefix):]

        # Allow a few extra merges: two merges may build the same string (a+##bc, ab+##c), and a
        # merged word may equal a special token; learning stops at ``budget`` new symbols anyway.
        learn = learn_gain_merges if score == "gain" else partial(learn_merges, score=score)
        merges = learn(word_counts, 2 * budget + 16, join=join, min_count=min_frequency, progress=progress,
                       max_new_symbols=budget)
        vocab = list(dict.fromkeys([*base, *(join(a, b) for a, b in merges)]))[:vocab_size]
        return cls(vocab, specials, lowercase=lowercase, strip_accents=strip_accents,
                   tokenize_chinese_chars=tokenize_chinese_chars, clean_text=clean_text, unk_token=unk_token,
                   continuing_subword_prefix=prefix, max_input_chars_per_word=max_input_chars_per_word)

    @classmethod
    def min_vocab_size(cls, special_tokens: Sequence[str], options: dict[str, Any]) -> int:
        """The special tokens, the unknown token and one character of the text."""
        return len(dict.fromkeys([*special_tokens, options.get("unk_token", "[UNK]")])) + 1

    # ------------------------------------------------------------------ files
    @classmethod
    def from_vocab_file(cls, path: str | os.PathLike,
                        config: dict[str, Any] | None = None) -> WordPieceTokenizer:
        """Load a BERT ``vocab.txt`` (one token per line; the id is the line number).

        ``config`` is the parsed ``tokenizer_config.json`` found beside it (or ``{}``):
        ``do_lower_case`` (default True, as for BERT's uncased models), ``strip_accents`` (default:
        follow lower-casing) and ``tokenize_chinese_chars`` (default True) are honoured, as are
        lmlab's own ``lmlab_options`` and role names (``unk_token``...). Special tokens are
        ``[PAD] [UNK] [CLS] [SEP] [MASK]``, those present in the file.
        """
        config = dict(config or {})
        p = check_input_file(path)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise LmlabError(f"{p} is not UTF-8 text", "pass a BERT vocab.txt (one token per line)") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        vocab = [line[:-1] if line.endswith("\r") else line for line in lines]
        seen: dict[str, int] = {}
        for i, tok in enumerate(vocab):
            if tok in seen:
                raise LmlabError(f"{p} lists token {tok!r} twice (lines {seen[tok] + 1} and {i + 1})",
                                 "remove the duplicate line")
            seen[tok] = i
        options = dict(config.get("lmlab_options") or {})
        if not options:
            lower = config.get("do_lower_case", True)
            options = {"lowercase": bool(lower), "strip_accents": config.get("strip_accents"),
                       "tokenize_chinese_chars": config.get("tokenize_chinese_chars", True) is not False}
        roles = roles_from_config(config)
        specials = config.get("lmlab_special_tokens")
        if specials is None:
            specials = [t for t in BERT_SPECIAL_TOKENS if t in seen]
            specials += [t for t in roles.values() if t in seen and t not in specials]
        roles = {r: t for r, t in roles.items() if t in seen}
        return cls(vocab, specials, roles, **_known_options(options))

    def _extra_files(self) -> dict[str, str]:
        """A BERT ``vocab.txt`` beside tokenizer.json, for tools that read only that."""
        return {"vocab.txt": "".join(t + "\n" for t in self.vocab)}

    def _options(self) -> dict[str, Any]:
        n = self.normalizer
        return {"lowercase": n.lowercase, "strip_accents": n.strip_accents,
                "tokenize_chinese_chars": n.tokenize_chinese_chars, "clean_text": n.clean_text,
                "unk_token": self.unk_token, "continuing_subword_prefix": self.prefix,
                "max_input_chars_per_word": self.max_input_chars_per_word}

    def tokenizer_config(self) -> dict[str, Any]:
        """Base config plus BERT's own option names, for tools that read a vocab.txt."""
        cfg = super().tokenizer_config()
        n = self.normalizer
        cfg.update({"do_lower_case": n.lowercase, "strip_accents": n.strip_accents,
                    "tokenize_chinese_chars": n.tokenize_chinese_chars})
        return cfg

    # ------------------------------------------------------------------ tokenizer.json
    def _hf_parts(self) -> dict[str, Any]:
        n = self.normalizer
        return {
            "normalizer": {"type": "BertNormalizer", "clean_text": n.clean_text,
                           "handle_chinese_chars": n.tokenize_chinese_chars,
                           "strip_accents": n.strip_accents, "lowercase": n.lowercase},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "unk_token": self.unk_token,
                      "continuing_subword_prefix": self.prefix,
                      "max_input_chars_per_word": self.max_input_chars_per_word,
                      "vocab": dict(self.token_to_id)},
            "decoder": {"type": "WordPiece", "prefix": self.prefix, "cleanup": True},
        }

    @classmethod
    def _from_hf(cls, data: dict[str, Any], config: dict[str, Any]) -> WordPieceTokenizer:
        """Read a WordPiece tokenizer.json (lmlab's or one written by Hugging Face for a BERT model)."""
        model = data["model"]
        if model.get("type") != "WordPiece":
            raise LmlabError(f"tokenizer.json holds a {model.get('type')} model, not WordPiece",
                             "load it with the matching algorithm")
        by_id = dict(enumerate(hf_vocab_by_id(data, "WordPiece")))
        norm = data.get("normalizer")
        if norm is None:
            options = {"lowercase": False, "strip_accents": False, "tokenize_chinese_chars": False,
                       "clean_text": False}
        elif norm.get("type") == "BertNormalizer":
            options = {"lowercase": norm.get("lowercase", True), "strip_accents": norm.get("strip_accents"),
                       "tokenize_chinese_chars": norm.get("handle_chinese_chars", True),
                       "clean_text": norm.get("clean_text", True)}
        else:
            raise UnsupportedInput(f"tokenizer.json normalizer {norm.get('type')!r} is not supported by "
                                   "lmlab's WordPiece",
                                   "use a BertNormalizer (as BERT tokenizers do) or load it with "
                                   "Hugging Face tokenizers")
        pre = data.get("pre_tokenizer") or {}
        if pre.get("type") != "BertPreTokenizer":
            raise UnsupportedInput(f"tokenizer.json pre_tokenizer {pre.get('type')!r} is not supported by "
                                   "lmlab's WordPiece", "use a BertPreTokenizer (as BERT tokenizers do)")
        options.update(unk_token=model.get("unk_token", "[UNK]"),
                       continuing_subword_prefix=model.get("continuing_subword_prefix") or "##",
                       max_input_chars_per_word=model.get("max_input_chars_per_word", 100))
        specials = hf_special_tokens(data, config)
        roles = {r: t for r, t in roles_from_config(config).items() if t in model["vocab"] or t in specials}
        return cls(list(by_id.values()), specials, roles, **options)


def _known_options(options: dict[str, Any]) -> dict[str, Any]:
    names = ("lowercase", "strip_accents", "tokenize_chinese_chars", "clean_text", "unk_token",
             "continuing_subword_prefix", "max_input_chars_per_word")
    return {k: options[k] for k in names if k in options}
