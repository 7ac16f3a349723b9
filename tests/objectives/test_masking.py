"""Shared masking helpers: word boundaries per tokenizer, selection, 80/10/10, span lengths."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.objectives.masking import (
    geometric_lengths,
    poisson_lengths,
    replace_80_10_10,
    row_generator,
    select_words,
    word_boundary_tables,
    word_ids,
)
from lmlab.tokenizers import load_tokenizer
from lmlab.tokenizers.pretokenize import gpt2_split


def groups(tokenizer, text: str) -> list[list[int]]:
    """Token ids of ``text`` grouped into words by :func:`word_ids`."""
    ids = torch.tensor([tokenizer.encode(text)])
    words = word_ids(ids, torch.zeros_like(ids), *word_boundary_tables(tokenizer))[0]
    out: list[list[int]] = [[] for _ in range(int(words.max()) + 1)]
    for i, w in zip(ids[0].tolist(), words.tolist()):
        out[w].append(i)
    return out


@pytest.mark.parametrize("algo", ["bytelevel", "wordpiece", "unigram", "bpe"])
def test_words_never_straddle_whitespace(tokenizers, book_paragraphs, algo):
    tok = tokenizers[algo]
    text = " ".join(book_paragraphs[1000:1015])
    gs = groups(tok, text)
    texts = [tok.decode(g).strip() for g in gs]
    assert all(len(t.split()) <= 1 for t in texts), [t for t in texts if len(t.split()) > 1][:5]
    assert sum(len(g) > 1 for g in gs) > 20  # real multi-token words exist, not one word per token
    if algo in ("unigram", "bpe"):  # both mark whitespace words: one group per word exactly
        assert len(gs) == len(text.split())
    if algo == "bytelevel":  # the letter-only words are exactly GPT-2's letter chunks
        chunks = [c.strip() for c in gpt2_split(text)]
        assert [t for t in texts if t.isalpha()] == [c for c in chunks if c.isalpha()]


def test_wordpiece_words_on_real_bert_vocab(minilm_dir):
    tok = load_tokenizer(minilm_dir / "vocab.txt")
    assert tok.tokenize("the unaffable cat") == ["the", "una", "##ffa", "##ble", "cat"]
    ids = torch.tensor([tok.encode("the unaffable cat [SEP] sat", add_special_tokens=True)])
    words = word_ids(ids, torch.zeros_like(ids), *word_boundary_tables(tok))
    # [CLS] the una ##ffa ##ble cat [SEP] sat [SEP]
    assert words[0].tolist() == [0, 1, 2, 2, 2, 3, 4, 5, 6]


def test_document_start_starts_a_word(tokenizers):
    tok = tokenizers["wordpiece"]
    ids = torch.tensor([tok.encode("walking walking")])
    cont = [i for i, t in enumerate(tok.vocab) if t.startswith("##")][0]
    ids = torch.tensor([[ids[0, 0].item(), cont, cont, cont]])
    docs = torch.tensor([[0, 0, 1, 1]])
    assert word_ids(ids, docs, *word_boundary_tables(tok))[0].tolist() == [0, 0, 1, 1]


def test_select_words_takes_whole_words():
    g = torch.Generator().manual_seed(0)
    words = torch.arange(400).repeat_interleave(3)[None]  # 400 words of 3 tokens
    sel = select_words(words, torch.ones_like(words, dtype=torch.bool), 0.5, g)[0].view(400, 3)
    assert bool((sel.all(1) | ~sel.any(1)).all())
    assert 150 < int(sel[:, 0].sum()) < 250


def test_replace_80_10_10_per_unit_keeps_spans_together():
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(10, 10 + 3000)[None] % 500 + 10
    units = (torch.arange(3000) // 5)[None]  # spans of 5 tokens
    sel = torch.ones_like(ids, dtype=torch.bool)
    pool = torch.arange(10, 510)
    out = replace_80_10_10(ids, sel, 4, pool, g, units=units)[0].view(600, 5)
    masked = out == 4
    assert bool((masked.all(1) | ~masked.any(1)).all())
    assert abs(masked[:, 0].float().mean().item() - 0.8) < 4 * math.sqrt(0.16 / 600)


def test_replace_rejects_bad_split():
    with pytest.raises(LmlabError, match="mask_prob"):
        replace_80_10_10(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), 4,
                         torch.arange(5), torch.Generator(), mask_prob=0.9, random_prob=0.2)


def test_geometric_lengths_match_spanbert():
    g = torch.Generator().manual_seed(0)
    lengths = geometric_lengths(50_000, 0.2, 10, g).float()
    # clipped geometric: E = sum_{k=1}^{10} P(L >= k) = sum_{k=0}^{9} 0.8^k
    expected = sum(0.8 ** k for k in range(10))
    assert lengths.min() == 1 and lengths.max() == 10
    assert abs(lengths.mean().item() - expected) < 0.03  # 3.57 words
    assert abs((lengths == 1).float().mean().item() - 0.2) < 0.01


def test_poisson_lengths_mean_and_zeros():
    g = torch.Generator().manual_seed(0)
    lengths = poisson_lengths(50_000, 3.0, g).float()
    assert abs(lengths.mean().item() - 3.0) < 0.05
    assert abs((lengths == 0).float().mean().item() - math.exp(-3)) < 0.005


def test_row_generator_depends_on_seed_and_content():
    row = torch.arange(50)
    a = torch.rand(5, generator=row_generator(0, row))
    assert torch.equal(a, torch.rand(5, generator=row_generator(0, row.clone())))
    assert not torch.equal(a, torch.rand(5, generator=row_generator(1, row)))
    assert not torch.equal(a, torch.rand(5, generator=row_generator(0, row.flip(0))))
