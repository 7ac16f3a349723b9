"""The check shared by the tokenizers whose ``encode`` keeps a per-word ids cache."""

from __future__ import annotations


def check_cached_encode(tok, lines: list[str]) -> None:
    """``encode`` equals the uncached ``id_of(tokenize(...))`` with the cache cold, warm, and
    bounded to 40 words (which it never exceeds, while its size really changes)."""
    generic = [[tok.id_of(t) for t in tok.tokenize(line)] for line in lines]
    tok._ids_cache.clear()
    assert [tok.encode(line) for line in lines] == generic  # filling the cache
    assert [tok.encode(line) for line in lines] == generic  # hitting it
    limit = tok._ids_cache.limit
    try:
        tok._ids_cache.limit = 40
        tok._ids_cache.clear()
        sizes = []
        for line, expected in zip(lines, generic):
            sizes.append(len(tok._ids_cache))
            assert tok.encode(line) == expected
        assert max(sizes) <= 40 and len(set(sizes)) > 10
    finally:
        tok._ids_cache.limit = limit
        tok._ids_cache.clear()
