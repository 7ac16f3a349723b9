"""BERT's "basic tokenizer": clean, normalize and split text into words, keeping character offsets.

This is the text pipeline in front of WordPiece in BERT (Devlin et al., 2019, ``tokenization.py``
``BasicTokenizer``), in the order Hugging Face ``tokenizers`` applies it (``BertNormalizer`` then
``BertPreTokenizer``), so that ids match ``BertTokenizerFast`` exactly:

1. **clean** - drop NUL, U+FFFD and control/format characters (Unicode Cc, Cf, Co, Cs; tab,
   newline and carriage return are whitespace, not control); every whitespace character
   separates words;
2. **CJK** - each CJK ideograph becomes a word of its own (Chinese has no spaces; BERT's
   multilingual models rely on this);
3. **strip accents** - NFD-decompose and drop nonspacing marks (Mn): ``é`` -> ``e``. On by
   default exactly when lower-casing is on (BERT's ``strip_accents=None``);
4. **lower-case** - character by character, without context (``Σ`` -> ``σ`` even at a word end);
5. **split** - on whitespace (dropped) and on punctuation (ASCII punctuation and Unicode P*),
   each punctuation character being a word of its own: ``"don't!"`` -> ``don ' t !``.

Every step maps one original character to zero or more normalized characters, so each normalized
character remembers the index of the original character it came from; a token's offsets are
``(src[first], src[last] + 1)`` in the original text, as in Hugging Face's ``offset_mapping``.

Normalization never creates or removes whitespace, so the words of a text are the words of each
of its whitespace-separated chunks: :meth:`BertNormalizer.split_chunk` works on one chunk and its
result can be cached by the caller (WordPiece does), which makes encoding real text fast.

Unicode tables: Python's ``unicodedata`` decides the classes, except for a few hundred rare
characters whose class in Hugging Face ``tokenizers`` (which uses older, Unicode 8/9-era tables)
differs from Unicode 14 (Python 3.11's database); they are listed in ``_HF_*`` below so the
result is identical to the reference on every code point.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

#: Unicode White_Space characters (Rust's ``char::is_whitespace``, which Hugging Face uses).
_WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
                + "\u2028\u2029\u202f\u205f\u3000")
#: Whitespace that survives cleaning (the C0/C1 controls among White_Space are removed instead).
_WHITE_SPACE_CLEAN = "".join(c for c in _WHITE_SPACE if c not in "\x0b\x0c\x85")

_ASCII_PUNCT = frozenset('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')
#: Cuts a string around each ASCII punctuation mark, keeping the marks.
_ASCII_PUNCT_SPLIT = re.compile("([" + re.escape("".join(sorted(_ASCII_PUNCT))) + "])")

#: CJK Unified Ideographs blocks (and compatibility ideographs), as in BERT's ``_is_chinese_char``.
#: Hangul, Hiragana and Katakana are not included: they are written with spaces. Extension E
#: starts at U+2B920 rather than U+2B820 because Hugging Face tokenizers does so.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _codepoints(spec: str) -> frozenset[str]:
    """Characters of a space-separated list of hex code points and ranges (``"61d 2e43-2e4f"``)."""
    out = set()
    for item in spec.split():
        lo, _, hi = item.partition("-")
        out.update(map(chr, range(int(lo, 16), int(hi or lo, 16) + 1)))
    return frozenset(out)


# Characters Hugging Face tokenizers classifies differently from Unicode 14 (found by comparing
# every code point against tokenizers 0.22 and 0.23; most were added to Unicode after its tables).
_HF_NOT_CONTROL = _codepoints("890-891 8e2 110cd 13430-13438")
_HF_NOT_PUNCT = _codepoints(
    "61d 9fd a76 c77 c84 1b7d-1b7e 2e43-2e4f 2e52-2e5d 10ead 10f55-10f59 10f86-10f89 1144b-1144f "
    "1145a-1145b 1145d 11660-1166c 116b9 1183b 11944-11946 119e2 11a3f-11a46 11a9a-11a9c "
    "11a9e-11aa2 11c41-11c45 11c70-11c71 11ef7-11ef8 11fff 12ff1-12ff2 16e97-16e9a 16fe2 1e95e-1e95f")
_HF_EXTRA_PUNCT = _codepoints("166d 111c9")
_HF_NOT_NONSPACING = _codepoints(
    "7fd 898-89f 8ca-8e1 9fe afa-aff b55 c04 c3c d00 d3b-d3c d81 eba 180f 1885-1886 1abf-1ace "
    "1df6-1dfb a82c a8c5 a8ff a9bd 10d24-10d27 10eab-10eac 10f46-10f50 10f82-10f85 11070 "
    "11073-11074 110c2 111c9 111cf 1123e 1133b 11438-1143f 11442-11444 11446 1145e 1182f-11837 "
    "11839-1183a 1193b-1193c 1193e 11943 119d4-119d7 119da-119db 119e0 11a01-11a0a 11a33-11a38 "
    "11a3b-11a3e 11a47 11a51-11a56 11a59-11a5b 11a8a-11a96 11a98-11a99 11c30-11c36 11c38-11c3d "
    "11c3f 11c92-11ca7 11caa-11cb0 11cb2-11cb3 11cb5-11cb6 11d31-11d36 11d3a 11d3c-11d3d "
    "11d3f-11d45 11d47 11d90-11d91 11d95 11d97 11ef3-11ef4 16f4f 16fe4 1cf00-1cf2d 1cf30-1cf46 "
    "1e000-1e006 1e008-1e018 1e01b-1e021 1e023-1e024 1e026-1e02a 1e130-1e136 1e2ae 1e2ec-1e2ef "
    "1e944-1e94a")
_HF_EXTRA_NONSPACING = _codepoints("1734")
_HF_NO_DECOMPOSITION = _codepoints("11938")
# Lower-case mappings of Unicode 16 letters, unknown to Python 3.11-3.13's database.
_HF_LOWER = {chr(a): chr(b) for a, b in [(0x1C89, 0x1C8A), (0xA7CB, 0x264), (0xA7CC, 0xA7CD),
                                         (0xA7CE, 0xA7CF), (0xA7D2, 0xA7D3), (0xA7D4, 0xA7D5),
                                         (0xA7DA, 0xA7DB), (0xA7DC, 0x19B)]}
_HF_LOWER.update({chr(c): chr(c + 0x20) for c in range(0x10D50, 0x10D66)})
_HF_LOWER.update({chr(c): chr(c + 0x1B) for c in range(0x16EA0, 0x16EB9)})


def is_control(c: str) -> bool:
    """True for characters BERT's cleaning removes (besides NUL and U+FFFD): Cc, Cf, Co, Cs."""
    if c in "\t\n\r":
        return False
    return unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs") and c not in _HF_NOT_CONTROL


def is_whitespace(c: str) -> bool:
    """True for Unicode White_Space characters."""
    return c in _WHITE_SPACE


def is_punctuation(c: str) -> bool:
    """True for ASCII punctuation (``$``, ``+``, ``^``... included) and Unicode punctuation (P*)."""
    if c in _ASCII_PUNCT or c in _HF_EXTRA_PUNCT:
        return True
    return unicodedata.category(c).startswith("P") and c not in _HF_NOT_PUNCT


def is_cjk(c: str) -> bool:
    """True for a CJK ideograph (see ``_CJK_RANGES``)."""
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_nonspacing_mark(c: str) -> bool:
    if c in _HF_EXTRA_NONSPACING:
        return True
    return unicodedata.category(c) == "Mn" and c not in _HF_NOT_NONSPACING


#: A word after normalization and the index (in the chunk) of the original character behind each
#: of its characters.
Word = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class BertNormalizer:
    """BERT's basic tokenizer with Hugging Face's option names.

    ``strip_accents=None`` follows ``lowercase`` (BERT's default); ``clean_text`` removes control
    characters; ``tokenize_chinese_chars`` makes each CJK ideograph its own word.
    """

    lowercase: bool = True
    strip_accents: bool | None = None
    tokenize_chinese_chars: bool = True
    clean_text: bool = True

    @property
    def strips_accents(self) -> bool:
        return self.lowercase if self.strip_accents is None else self.strip_accents

    @property
    def chunk_pattern(self) -> re.Pattern:
        """Regex matching the whitespace-free chunks of a text (the unit of caching)."""
        return _chunk_re(_WHITE_SPACE_CLEAN if self.clean_text else _WHITE_SPACE)

    def normalize_char(self, c: str) -> str:
        """One original character -> its normalized characters (possibly none)."""
        if self.clean_text and (c == "\0" or c == "\ufffd" or is_control(c)):
            return ""
        if c.isascii():
            return c.lower() if self.lowercase else c
        if self.strips_accents:
            nfd = c if c in _HF_NO_DECOMPOSITION else unicodedata.normalize("NFD", c)
            c = "".join(ch for ch in nfd if not _is_nonspacing_mark(ch))
        if self.lowercase:
            # character by character: str.lower() on a whole word would apply the final-sigma rule
            c = "".join(_HF_LOWER.get(ch) or ch.lower() for ch in c)
        return c

    def split_chunk(self, chunk: str) -> list[Word]:
        """Normalize and split a whitespace-free chunk into words, each with its source indices."""
        words: list[Word] = []
        chars: list[str] = []
        src: list[int] = []

        def flush():
            if chars:
                words.append(("".join(chars), tuple(src)))
                chars.clear()
                src.clear()

        for i, c in enumerate(chunk):
            if self.tokenize_chinese_chars and is_cjk(c):
                norm = self.normalize_char(c)
                flush()
                if norm:
                    words.append((norm, (i,) * len(norm)))
                continue
            for nc in self.normalize_char(c):
                if is_punctuation(nc):
                    flush()
                    words.append((nc, (i,)))
                elif is_whitespace(nc):
                    flush()
                else:
                    chars.append(nc)
                    src.append(i)
        flush()
        return words

    def ascii_words(self, chunk: str) -> list[str] | None:
        """The words of a printable-ASCII chunk (the common case, fast), else None.

        On printable ASCII, BERT's normalisation is lower-casing (when on) and nothing else, and
        every ASCII punctuation mark is a word of its own: the words of :meth:`split_chunk`.
        """
        if not (chunk.isascii() and chunk.isprintable()) or " " in chunk:
            return None
        return [w for w in _ASCII_PUNCT_SPLIT.split(chunk.lower() if self.lowercase else chunk) if w]

    def words_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """``(word, start, end)`` for every word of ``text``; offsets index the original text."""
        out = []
        for m in self.chunk_pattern.finditer(text):
            base = m.start()
            for word, src in self.split_chunk(m.group()):
                out.append((word, base + src[0], base + src[-1] + 1))
        return out

    def words(self, text: str) -> list[str]:
        """The normalized words of ``text`` (what the WordPiece learner counts)."""
        return [w for m in self.chunk_pattern.finditer(text) for w, _ in self._cached_split(m.group())]

    def _cached_split(self, chunk: str) -> list[Word]:
        return _split_cached(self, chunk)


@lru_cache(maxsize=2)
def _chunk_re(whitespace: str) -> re.Pattern:
    return re.compile("[^" + re.escape(whitespace) + "]+")


@lru_cache(maxsize=1 << 18)
def _split_cached(normalizer: BertNormalizer, chunk: str) -> list[Word]:
    return normalizer.split_chunk(chunk)
