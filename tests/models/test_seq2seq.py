"""Encoder-decoder models (T5, BART): forward contract, caching, sharing, checkpoints, training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.losses import token_loss
from lmlab.models import build_model, get_preset
from lmlab.models.seq2seq import Seq2SeqModel, shift_right
from lmlab.objectives.base import teacher_forced

V = 120


def tiny(family: str, **kw) -> Seq2SeqModel:
    torch.manual_seed(0)
    kw = {"vocab_size": V, "d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.0, "attn_dropout": 0.0, **kw}
    if family == "bart":
        kw.setdefault("max_positions", 64)
    return build_model(get_preset(f"{family}-tiny", **kw)).eval()


FAMILIES = {
    "t5": {},
    "t5-v1.1": {"activation": "gated-gelu", "tie_embeddings": False, "scale_decoder_output": False,
                "n_decoder_layers": 3},
    "t5-shared": {"share_encoder_decoder": True},
    "bart": {},
    "bart-scaled": {"scale_embedding": True, "n_decoder_layers": 1},
}


def make(name: str) -> Seq2SeqModel:
    model = tiny(name.split("-")[0], **FAMILIES[name])
    if model.final_logits_bias is not None:
        model.final_logits_bias.normal_()  # exercise the buffer (it is zero at init)
    return model


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (2, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # second source is padded
    dec = torch.randint(3, V, (2, 7), generator=g)
    return ids, mask, dec


@pytest.mark.parametrize("name", list(FAMILIES))
def test_forward_shapes_and_hidden_states(name, batch):
    ids, mask, dec = batch
    model = make(name)
    out = model(ids, attention_mask=mask, decoder_input_ids=dec, output_hidden_states=True)
    assert out.logits.shape == (2, 7, V)
    assert out.encoder_last_hidden_state.shape == (2, 11, 32)
    assert len(out.hidden_states) == len(model.decoder.layers) + 1
    assert len(out.extra["encoder_hidden_states"]) == len(model.encoder.layers) + 1
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert torch.equal(out.extra["encoder_hidden_states"][-1], out.encoder_last_hidden_state)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_labels_shift_right_and_ignore_index(name, batch):
    ids, mask, dec = batch
    model = make(name)
    labels = dec.clone()
    labels[0, 5:] = -100
    out, loss = teacher_forced(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    start = model.config.decoder_start_token_id
    shifted = shift_right(labels, start, model.config.pad_token_id)
    assert shifted[0, 0] == start and torch.equal(shifted[:, 1:3], labels[:, :2])
    assert shifted[0, 6] == model.config.pad_token_id  # -100 became pad
    explicit = model(ids, attention_mask=mask, decoder_input_ids=shifted)
    torch.testing.assert_close(out.logits, explicit.logits)
    keep = labels != -100
    manual = F.cross_entropy(explicit.logits[keep], labels[keep])
    torch.testing.assert_close(loss, manual)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_cached_decoding_equals_full_forward(name, batch):
    """Prefill 3 tokens, then one token per call: the logits equal one full forward (1e-5), the
    encoder runs once, the cross k/v are computed once and the self-attention cache grows."""
    ids, mask, dec = batch
    model = make(name)
    with torch.no_grad():
        full = model(ids, attention_mask=mask, decoder_input_ids=dec).logits
        enc = model.encode(ids, attention_mask=mask)
        out = model(attention_mask=mask, decoder_input_ids=dec[:, :3], encoder_outputs=enc, use_cache=True)
        steps, past = [out.logits], out.past_key_values
        cross_k = past[0][2]
        for t in range(3, dec.shape[1]):
            out = model(attention_mask=mask, decoder_input_ids=dec[:, t:t + 1], encoder_outputs=enc,
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
            assert past[0][0].shape[2] == t + 1  # self-attention cache grew by one
            assert past[0][2] is cross_k  # cross-attention k/v reused, not recomputed
            steps.append(out.logits)
    assert len(past) == len(model.decoder.layers) and all(len(layer) == 4 for layer in past)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_decoder_is_causal_and_source_padding_is_ignored(batch):
    ids, mask, dec = batch
    for name in ("t5", "bart"):
        model = make(name)
        base = model(ids, attention_mask=mask, decoder_input_ids=dec).logits
        later = dec.clone()
        later[:, 4:] = 3
        torch.testing.assert_close(model(ids, attention_mask=mask, decoder_input_ids=later).logits[:, :4],
                                   base[:, :4])
        assert not torch.allclose(model(ids, attention_mask=mask, decoder_input_ids=later).logits[:, 4:],
                                  base[:, 4:])
        repadded = ids.clone()
        repadded[1, 8:] = 5  # different tokens under the padding mask
        torch.testing.assert_close(model(repadded, attention_mask=mask, decoder_input_ids=dec).logits, base)


def test_encoder_outputs_are_reused(batch):
    ids, mask, dec = batch
    model = make("t5")
    enc = model.encode(ids, attention_mask=mask)
    direct = model(ids, attention_mask=mask, decoder_input_ids=dec)
    for given in (enc, enc.last_hidden_state, (enc.last_hidden_state,), direct):
        reused = model(attention_mask=mask, decoder_input_ids=dec, encoder_outputs=given)
        torch.testing.assert_close(reused.logits, direct.logits)


def test_shared_encoder_decoder_parameters(batch, tmp_path):
    """T5 "Enc-dec, shared": the decoder reuses the encoder's layers; only cross-attention is new."""
    ids, mask, dec = batch
    plain, shared = make("t5"), make("t5-shared")
    d = shared.decoder
    for mine, theirs in zip(d.layers, shared.encoder.layers):
        assert mine.attn is theirs.attn and mine.ffn is theirs.ffn and mine.ffn_norm is theirs.ffn_norm
        assert mine.cross_attn is not None
    assert d.relative_bias.embedding is shared.encoder.relative_bias.embedding
    assert d.relative_bias.bidirectional is False and shared.encoder.relative_bias.bidirectional is True
    dec_only = sum(p.numel() for layer in plain.decoder.layers
                   for part in (layer.attn, layer.attn_norm, layer.ffn, layer.ffn_norm)
                   for p in part.parameters())
    dec_only += plain.decoder.relative_bias.embedding.weight.numel() + plain.decoder.final_norm.weight.numel()
    assert shared.num_parameters() == plain.num_parameters() - dec_only
    # one weight, gradients from both sides
    shared.train()
    teacher_forced(shared, {"input_ids": ids, "attention_mask": mask, "labels": dec})[1].backward()
    assert shared.encoder.layers[0].attn.q_proj.weight.grad.abs().sum() > 0
    # the checkpoint stores the shared weights once and loads back shared
    shared.eval().save(tmp_path / "ck")
    with safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt") as f:
        assert not any(k.startswith("decoder.layers.0.attn.") for k in f.keys())
    back = load_model(tmp_path / "ck")
    assert back.decoder.layers[0].attn is back.encoder.layers[0].attn
    assert back.num_parameters() == shared.num_parameters()
    torch.testing.assert_close(back(ids, attention_mask=mask, decoder_input_ids=dec).logits,
                               shared(ids, attention_mask=mask, decoder_input_ids=dec).logits)


@pytest.mark.parametrize("name", ["t5", "t5-v1.1", "bart"])
def test_checkpoint_round_trip(name, batch, tmp_path):
    ids, mask, dec = batch
    model = make(name)
    model.save(tmp_path / "ck")
    back = load_model(tmp_path / "ck")
    assert type(back) is Seq2SeqModel and back.config == model.config
    torch.testing.assert_close(back(ids, attention_mask=mask, decoder_input_ids=dec).logits,
                               model(ids, attention_mask=mask, decoder_input_ids=dec).logits, atol=0, rtol=0)
    with safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert ("lm_head.weight" in keys) == (not model.config.tie_embeddings)  # tied head stored once
    if model.config.tie_embeddings:
        assert back.lm_head.weight is back.embed_tokens.weight


def test_t5_conventions():
    model = make("t5")
    assert all(layer.attn.scale == 1.0 for layer in model.encoder.layers)  # no 1/sqrt(d) in T5
    assert not any(n.endswith("bias") for n, _ in model.named_parameters())
    assert model.encoder.layers[1].attn is not None and not hasattr(model.encoder.layers[1], "relative_bias")
    # the decoder output is rescaled by d_model**-0.5 before the tied head
    h = torch.randn(1, 2, 32)
    torch.testing.assert_close(model.lm_head(h * 32 ** -0.5), h @ model.embed_tokens.weight.T * 32 ** -0.5)


def test_bart_positions_use_offset_two():
    model = make("bart")
    assert model.encoder.embed_positions.weight.shape[0] == 64 + 2
    with pytest.raises(LmlabError, match="max_positions"):
        model(torch.randint(3, V, (1, 65)), decoder_input_ids=torch.randint(3, V, (1, 2)))


def test_bad_input_is_one_line_error(batch):
    ids, mask, dec = batch
    model = make("t5")
    with pytest.raises(LmlabError, match="decoder_input_ids or labels"):
        model(ids)
    with pytest.raises(LmlabError, match="vocabulary"):
        model(ids, decoder_input_ids=dec + V)
    with pytest.raises(LmlabError, match="labels have shape"), pytest.warns(DeprecationWarning):
        model(ids, decoder_input_ids=dec, labels=dec[:, :3])  # the deprecated labels= path, one release
    with pytest.raises(LmlabError, match="share_encoder_decoder"):
        get_preset("t5-tiny", share_encoder_decoder=True, n_decoder_layers=3)
    with pytest.raises(LmlabError, match="rotary"):
        get_preset("bart-tiny", positions="rotary")
    with pytest.raises(LmlabError, match="'lm' head"):
        build_model(get_preset("t5-tiny"), heads=["mlm"])
    # BART, like transformers, denoises input_ids when no decoder input is given
    bart = make("bart")
    torch.testing.assert_close(bart(ids).logits, bart(ids, decoder_input_ids=shift_right(ids, 2, 1)).logits)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_training_reduces_loss_on_real_text(name, shakespeare):
    """Denoising on real text: reconstruct 24-byte windows of Shakespeare from a copy with every
    fourth byte replaced by a mask id. Loss must drop well below its start in 40 Adam steps."""
    data = torch.tensor(list(shakespeare[:20000].encode("utf-8")), dtype=torch.long) % (V - 3) + 3
    torch.manual_seed(0)
    model = make(name).train()
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        starts = torch.randint(0, len(data) - 24, (8,))
        target = torch.stack([data[s:s + 24] for s in starts])
        noisy = target.clone()
        noisy[:, step % 4::4] = 2
        loss = token_loss(model(noisy, decoder_input_ids=shift_right(target, start, pad)).logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.75 * sum(losses[:5]) / 5, losses
