"""Fixtures for the objective tests: small tokenizers trained on real text, and packed batches.

``pack`` imitates what the trainer hands an objective: paragraphs of real text tokenized and
packed back to back into ``[B, T]`` rows, with ``doc_ids`` and per-document ``position_ids``.
"""

from __future__ import annotations

import pytest
import torch

from lmlab.objectives import TokenBatch
from lmlab.tokenizers import train_tokenizer

BOOK = "pretrain/gutenberg/pg14263_katrine.txt"


def paragraphs(text: str) -> list[str]:
    paras = [" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n")]
    return [p for p in paras if p]


@pytest.fixture(scope="session")
def book_paragraphs(data_dir) -> list[str]:
    text = (data_dir / BOOK).read_text(encoding="utf-8")
    return paragraphs(text[20_000:text.index("End of the Project Gutenberg")])  # the novel, no licence


@pytest.fixture(scope="session")
def wiki_paragraphs(wikitext_valid_lines) -> list[str]:
    return [line.strip() for line in wikitext_valid_lines if not line.strip().startswith("=")]


@pytest.fixture(scope="session")
def tokenizers(book_paragraphs) -> dict:
    """One small tokenizer per algorithm (default special tokens), trained on 1000 paragraphs of the book."""
    sample = book_paragraphs[:1000]
    return {algo: train_tokenizer(algo, sample, vocab_size=1000) for algo in ("bytelevel", "wordpiece",
                                                                                "unigram", "bpe")}


@pytest.fixture(scope="session")
def tok(tokenizers):
    return tokenizers["bytelevel"]


def pack(tokenizer, texts: list[str], rows: int, seq_len: int, start: int = 0) -> TokenBatch:
    """Pack consecutive paragraphs ``texts[start:]`` into ``rows`` rows of ``seq_len`` tokens."""
    stream, docs, pos = [], [], []
    doc = 0
    i = start
    while len(stream) < rows * seq_len:
        ids = tokenizer.encode(texts[i % len(texts)])
        i += 1
        stream += ids
        docs += [doc] * len(ids)
        pos += list(range(len(ids)))
        doc += 1
    n = rows * seq_len
    ids = torch.tensor(stream[:n]).view(rows, seq_len)
    doc_ids = torch.tensor(docs[:n]).view(rows, seq_len)
    doc_ids = doc_ids - doc_ids[:, :1]  # 0, 1, 2... within each row
    positions = torch.tensor(pos[:n]).view(rows, seq_len)
    # a row that starts inside a document restarts its positions at 0 (as a trainer's window would)
    first = doc_ids == 0
    positions = torch.where(first, positions - positions[:, :1], positions)
    return TokenBatch(ids, doc_ids, positions)


@pytest.fixture(scope="session")
def packer():
    return pack


def train_and_validate(objective, model, train_batches, val_batches, steps: int, lr: float = 3e-3):
    """A tiny manual loop: validation loss (fixed masks) before and after ``steps`` AdamW steps."""
    params = list({id(p): p for p in list(model.parameters()) + list(objective.parameters())}.values())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def val_loss() -> float:
        model.eval()
        objective.eval()
        g = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            losses = [float(objective.loss(model, objective.prepare(b, g))[0]) for b in val_batches]
        model.train()
        objective.train()
        return sum(losses) / len(losses)

    before = val_loss()
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        batch = train_batches[step % len(train_batches)]
        loss, _ = objective.loss(model, objective.prepare(batch, g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, val_loss()


@pytest.fixture(scope="session")
def trainer():
    return train_and_validate


def model_mask(inputs: dict, causal: bool):
    """Boolean ``[B, T, T]`` (True = may attend): the mask a model builds from an objective's
    inputs (``doc_ids``, ``prefix_mask``, ``attention_pattern``), via the one mask builder."""
    import torch

    from lmlab.models.attention_masks import self_attention_mask

    t = inputs["input_ids"].shape[1]
    mask, is_causal = self_attention_mask(causal=causal, q_len=t, doc_ids=inputs.get("doc_ids"),
                                          prefix_mask=inputs.get("prefix_mask"),
                                          pattern=inputs.get("attention_pattern"))
    b = inputs["input_ids"].shape[0]
    if mask is None:
        full = torch.ones(t, t, dtype=torch.bool)
        return (full.tril() if is_causal else full).expand(b, t, t)
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.expand(b, 1, t, t)[:, 0]
