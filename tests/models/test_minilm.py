"""Real pretrained weights: all-MiniLM-L6-v2 (a 6-layer BERT) in lmlab equals transformers.

Text is tokenised by lmlab's own WordPiece from the model's vocab.txt; transformers' tokenizer
(loaded from the same directory) and model are the oracle.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T

from lmlab.loading import load_model
from lmlab.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def models(minilm_dir):
    return T.AutoModel.from_pretrained(minilm_dir).eval(), load_model(minilm_dir)


@pytest.fixture(scope="module")
def sentences(wikitext_valid_lines):
    real = [s.strip() for s in wikitext_valid_lines[5:40] if 20 < len(s) < 300][:6]
    return ["The capital of Denmark is Copenhagen.", "He hit the ball with a bat."] + real


def test_minilm_hidden_states_equal_transformers(models, minilm_dir, sentences):
    ref, m = models
    assert m.config.family == "bert" and m.config.n_layers == 6 and m.config.d_model == 384
    assert m.num_parameters() == ref.num_parameters()
    tok = load_tokenizer(minilm_dir / "vocab.txt")
    ref_tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    batch = tok.encode_batch(sentences, return_tensors="pt", truncation=True, max_length=128)
    ref_batch = ref_tok(sentences, padding=True, truncation=True, max_length=128, return_tensors="pt")
    assert torch.equal(batch["input_ids"], ref_batch["input_ids"])  # lmlab WordPiece == BERT tokenizer
    mask = batch["attention_mask"]
    with torch.no_grad():
        r = ref(
            input_ids=batch["input_ids"],
            attention_mask=mask,
            token_type_ids=batch["token_type_ids"],
            output_hidden_states=True,
        )
        o = m(
            batch["input_ids"],
            attention_mask=mask,
            token_type_ids=batch["token_type_ids"],
            output_hidden_states=True,
        )
    real = mask.bool()
    worst = max((a - b)[real].abs().max().item() for a, b in zip(o.hidden_states, r.hidden_states))
    assert len(o.hidden_states) == 7 and worst < 1e-5, worst
    assert (o.extra["pooled"] - r.pooler_output).abs().max() < 1e-5
    # sentence embeddings (mean pooling, as sentence-transformers does) agree too
    emb = (o.last_hidden_state * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    ref_emb = (r.last_hidden_state * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    assert torch.allclose(emb, ref_emb, atol=1e-5)


def test_minilm_survives_lmlab_checkpoint_round_trip(models, tmp_path):
    _, m = models
    assert m.tokenizer is not None and m.tokenizer.vocab_size == 30522  # picked up from the HF directory
    m.save(tmp_path / "ck")
    back = load_model(tmp_path / "ck")
    ids = torch.tensor([m.tokenizer.encode("a bat flew out of the cave", add_special_tokens=True)])
    with torch.no_grad():
        assert torch.equal(back(ids).last_hidden_state, m(ids).last_hidden_state)
    assert back.tokenizer.encode("Copenhagen") == m.tokenizer.encode("Copenhagen")
