"""Pre-tokenization shared by the BPE tokenizers: whitespace words and GPT-2 byte-level chunks.

Two pieces of GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners", and its ``encoder.py``):

* ``GPT2_PATTERN`` cuts text into chunks that merges never cross: English contractions
  (``'s 't 're 've 'm 'll 'd``), an optional space plus a run of letters, an optional space plus a
  run of digits, an optional space plus a run of other symbols, and whitespace (a run of
  whitespace gives its last space to the following word: ``"a  b"`` -> ``"a", " ", " b"``).
  The same pattern is what Hugging Face's ``ByteLevel(use_regex=True)`` pre-tokenizer applies,
  and ``regex``'s ``\\s``, ``\\p{L}``, ``\\p{N}`` agree with its Oniguruma engine.
* ``BYTE_ENCODER`` maps each of the 256 byte values to one printable Unicode character, so a
  chunk's UTF-8 bytes become an ordinary string that never contains whitespace or control
  characters: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onwards
  (space -> ``Ġ``, newline -> ``Ċ``).
"""

from __future__ import annotations

import regex

#: GPT-2's pre-tokenization pattern, as published.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Hugging Face tokenizers (0.23) matches that pattern with Unicode 16.0 character properties,
# ``regex`` (2026) with Unicode 17.0. The letters and digits new in 17.0 are excluded here, so
# both treat them alike (as "other" symbols) and give the same chunks on every string.
_UNICODE17_LETTERS = (
    r"\U0000088f\U00000c5c\U00000cdc\U0000a7ce-\U0000a7cf\U0000a7d2\U0000a7d4\U0000a7f1\U00010940-\U00010959"
    r"\U00010ec5-\U00010ec7\U00011db0-\U00011ddb\U00016ea0-\U00016eb8\U00016ebb-\U00016ed3\U00016ff2-\U00016ff3"
    r"\U000187f8-\U000187ff\U00018d09-\U00018d1e\U00018d80-\U00018df2\U0001e6c0-\U0001e6de\U0001e6e0-\U0001e6e2"
    r"\U0001e6e4-\U0001e6e5\U0001e6e7-\U0001e6ed\U0001e6f0-\U0001e6f4\U0001e6fe-\U0001e6ff\U0002b73a-\U0002b73f"
    r"\U0002cea2-\U0002cead\U000323b0-\U00033479")
_UNICODE17_DIGITS = r"\U00011de0-\U00011de9\U00016ff4-\U00016ff6"
_L = rf"[\p{{L}}--[{_UNICODE17_LETTERS}]]"
_N = rf"[\p{{N}}--[{_UNICODE17_DIGITS}]]"
GPT2_RE = regex.compile(rf"""'s|'t|'re|'ve|'m|'ll|'d| ?{_L}+| ?{_N}+| ?[^\s{_L}{_N}]+|\s+(?!\S)|\s+""",
                        regex.V1)

#: Whitespace-separated words; ``\s`` here is Unicode White_Space, the same set as Rust's
#: ``char::is_whitespace`` used by Hugging Face's ``WhitespaceSplit`` (``str.split`` differs: it
#: also splits on U+001C..U+001F).
WORD_RE = regex.compile(r"\S+")


def gpt2_split(text: str) -> list[str]:
    """GPT-2 pre-tokens of ``text`` (their concatenation is ``text``)."""
    return GPT2_RE.findall(text)


def whitespace_split(text: str) -> list[str]:
    """Whitespace-separated words of ``text``."""
    return WORD_RE.findall(text)


def bytes_to_unicode() -> list[str]:
    """The GPT-2 table: ``table[b]`` is the printable character standing for byte ``b``."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_ENCODER: list[str] = bytes_to_unicode()
BYTE_DECODER: dict[str, int] = {c: b for b, c in enumerate(BYTE_ENCODER)}
_TO_UNICODE = {b: c for b, c in enumerate(BYTE_ENCODER)}  # for str.translate on latin-1 text
_FROM_UNICODE = {ord(c): chr(b) for b, c in enumerate(BYTE_ENCODER)}


def to_byte_symbols(text: str) -> str:
    """``text``'s UTF-8 bytes written with ``BYTE_ENCODER`` characters (one character per byte)."""
    return text.encode("utf-8").decode("latin-1").translate(_TO_UNICODE)


def from_byte_symbols(symbols: str) -> bytes:
    """Inverse of :func:`to_byte_symbols`: the bytes that the characters stand for.

    Characters outside the table (possible only in a foreign vocabulary) are encoded as UTF-8.
    """
    out = symbols.translate(_FROM_UNICODE)
    try:
        return out.encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(ch.encode("latin-1") if ord(ch) < 256 else ch.encode("utf-8") for ch in out)
