"""Encoder and decoder models: wiring, heads, losses, masks, cache, sharing and input errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmlab.errors import LmlabError
from lmlab.losses import head_loss, selected_mean_cross_entropy
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import MaskSpec, prefix_lm_mask
from lmlab.models.decoder import DecoderModel
from lmlab.models.encoder import EncoderModel
from lmlab.models.encoder.model import masked_rows

V = 120


def tiny(name, heads=None, **kw):
    torch.manual_seed(0)
    cfg = get_preset(name, vocab_size=V, dropout=0.0, attn_dropout=0.0, **kw)
    return build_model(cfg, heads=heads).eval()


def ids(b=2, t=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, V, (b, t), generator=g)


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-tiny", "albert-tiny", "electra-tiny"])
def test_encoders_build_and_return_hidden_states(preset):
    m = tiny(preset)
    out = m(ids(), output_hidden_states=True)
    assert isinstance(m, EncoderModel)
    assert len(out.hidden_states) == m.config.n_layers + 1
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    expected = (2, 10) if preset == "electra-tiny" else (2, 10, V)
    assert out.logits.shape == expected


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_decoders_are_causal_and_cache_equals_full_pass(preset):
    m = tiny(preset)
    x = ids(t=12)
    with torch.no_grad():
        full = m(x).logits
        changed = x.clone()
        changed[:, 8:] = 7
        assert torch.allclose(m(changed).logits[:, :8], full[:, :8], atol=1e-6)  # no peeking ahead
        assert not torch.allclose(m(changed).logits[:, 8:], full[:, 8:])
        # padded rows (left padding) and one token at a time through the cache
        mask = torch.ones_like(x)
        mask[1, :3] = 0
        ref = m(x, attention_mask=mask).logits
        out = m(x[:, :6], attention_mask=mask[:, :6], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        assert len(cache) == m.config.n_layers and cache[0][0].shape[2] == 6
        for t in range(6, 12):
            out = m(x[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    inc = torch.cat(steps, 1)
    assert (inc - ref)[mask.bool()].abs().max() < 1e-5


def test_llama_uses_grouped_query_attention_and_untied_head():
    m = tiny("llama-tiny")
    attn = m.layers[0].attn
    assert (
        attn.n_kv_heads == m.config.n_heads // 2 and attn.k_proj.out_features == attn.q_proj.out_features // 2
    )
    assert m.heads["lm"].proj.weight is not m.tok_embed.weight
    g = tiny("gpt2-tiny")
    assert g.heads["lm"].proj.weight is g.tok_embed.weight  # tied: counted once
    n_untied = tiny("gpt2-tiny", tie_embeddings=False).num_parameters()
    assert n_untied - g.num_parameters() == V * g.config.d_model


def test_mlm_logits_only_where_labels_are_given():
    m = tiny("bert-tiny")
    x = ids()
    labels = torch.full_like(x, -100)
    labels[0, 2], labels[1, 5], labels[1, 7] = 11, 12, 13
    with torch.no_grad():
        out = m(x)
        logits, targets, count = masked_rows(m.heads["mlm"], out.last_hidden_state, labels)
    sel = labels != -100
    assert logits.shape == (3, V) and torch.equal(targets, labels[sel])
    assert torch.allclose(logits, out.logits[sel], atol=1e-5)
    loss = selected_mean_cross_entropy(logits, targets, count)
    assert torch.isclose(loss, F.cross_entropy(out.logits[sel], labels[sel]), atol=1e-5)


def test_encoder_padding_does_not_change_real_positions():
    m = tiny("bert-tiny")
    x = ids(b=1, t=6)
    padded = torch.cat([x, torch.zeros(1, 4, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 6 + [0] * 4])
    with torch.no_grad():
        a = m(x).last_hidden_state
        b = m(padded, attention_mask=mask).last_hidden_state
    assert torch.allclose(a, b[:, :6], atol=1e-5)


def test_roberta_positions_start_after_padding_id():
    m = tiny("roberta-tiny")
    x = torch.tensor([[5, 6, 7, 1, 1]])
    assert m.embeddings.position_ids(x).tolist() == [[2, 3, 4, 1, 1]]


def test_rotary_encoder_attends_by_relative_offset(tmp_path):
    torch.manual_seed(0)
    opts = {"vocab_size": 300, "dropout": 0.0, "init_std": 0.2}
    model = build_model(get_preset("bert-tiny", positions="rotary", **opts)).eval()
    assert model.embeddings.position is None and model.rotary is not None
    ids = torch.randint(5, 300, (2, 12))
    out = model(input_ids=ids).logits
    # only offsets matter: shifting every position by 7 changes nothing ...
    shifted = model(input_ids=ids, position_ids=torch.arange(12)[None] + 7).logits
    assert torch.allclose(out, shifted, atol=1e-5)
    # ... but order does (unlike positions="none", a bag of tokens)
    flipped = model(input_ids=ids.flip(1)).logits
    assert not torch.allclose(out[:, :1], flipped[:, -1:], atol=1e-2)
    bag = build_model(get_preset("bert-tiny", positions="none", **opts)).eval()
    bag_flipped = bag(input_ids=ids.flip(1)).logits
    assert torch.allclose(bag(input_ids=ids).logits[:, :1], bag_flipped[:, -1:], atol=1e-5)
    # it saves and reloads like any encoder
    model.save(tmp_path / "rope")
    from lmlab.loading import load_model

    assert torch.equal(load_model(tmp_path / "rope")(input_ids=ids).logits, out)
    with pytest.raises(LmlabError, match="positions"):
        get_preset("bert-tiny", positions="relative").validate()


def test_albert_shares_layers_and_factorizes_embeddings():
    one = tiny("albert-tiny", n_layers=1)
    four = tiny("albert-tiny", n_layers=4)
    assert one.num_parameters() == four.num_parameters()  # cross-layer sharing
    assert four.layer(0) is four.layer(3)
    small = tiny("albert-small")
    assert small.embeddings.word.weight.shape == (V, 128) and small.embeddings.project.out_features == 256


def test_encoder_heads_and_losses():
    m = tiny("bert-tiny", heads=("mlm", "nsp"))
    x = ids()
    labels = torch.full_like(x, -100)
    labels[:, 3] = 9
    out = m(x)
    assert out.extra["nsp_logits"].shape == (2, 2)
    mlm_loss = head_loss("mlm", out.extra["mlm_logits"], labels)
    nsp_loss = head_loss("nsp", out.extra["nsp_logits"], torch.tensor([0, 1]))
    assert torch.isclose(mlm_loss, F.cross_entropy(out.logits[:, 3], labels[:, 3]))
    assert torch.isclose(nsp_loss, F.cross_entropy(out.extra["nsp_logits"], torch.tensor([0, 1])))
    (mlm_loss + nsp_loss).backward()
    assert m.pooler.weight.grad is not None

    span = tiny("bert-tiny", heads=("span",))
    out = span(x)
    s, e = out.extra["start_logits"], out.extra["end_logits"]
    expect = (F.cross_entropy(s, torch.tensor([1, 2])) + F.cross_entropy(e, torch.tensor([3, 4]))) / 2
    assert torch.isclose(head_loss("span", out.logits, torch.tensor([[1, 3], [2, 4]])), expect)

    reg = tiny("roberta-tiny", heads=("seq_cls",), num_labels=1)
    out = reg(x)
    assert out.logits.shape == (2, 1)
    loss = head_loss("seq_cls", out.logits, torch.tensor([0.5, -1.0]))
    assert torch.isclose(loss, F.mse_loss(out.logits.squeeze(-1), torch.tensor([0.5, -1.0])))

    tok = tiny("electra-tiny", heads=("token_cls",), num_labels=5)
    lab = torch.randint(0, 5, x.shape)
    lab[0, 0] = -100
    out = tok(x)
    expect = F.cross_entropy(out.logits.view(-1, 5), lab.view(-1), ignore_index=-100)
    assert torch.isclose(head_loss("token_cls", out.logits, lab), expect)


def test_electra_discriminator_loss_ignores_padding():
    m = tiny("electra-tiny")
    x = ids()
    lab = torch.randint(0, 2, x.shape)
    mask = torch.ones_like(x)
    mask[1, 7:] = 0
    out = m(x, attention_mask=mask)
    keep = mask.bool()
    expect = F.binary_cross_entropy_with_logits(out.logits[keep], lab[keep].float())
    assert torch.isclose(head_loss("discriminator", out.logits, lab, mask), expect)


def test_last_token_classification_reads_the_last_real_token():
    m = tiny("gpt2-tiny", heads=("cls",), num_labels=3)
    x = ids(b=1, t=5)
    with torch.no_grad():
        alone = m(x).logits
        right = m(
            torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], 1),
            attention_mask=torch.tensor([[1] * 5 + [0] * 3]),
        ).logits
    assert alone.shape == (1, 3) and torch.allclose(alone, right, atol=1e-5)
    out = m(x)
    assert torch.isclose(head_loss("cls", out.logits, torch.tensor([2])),
                         F.cross_entropy(out.logits, torch.tensor([2])))


def test_lm_loss_is_shifted_next_token_cross_entropy():
    m = tiny("llama-tiny")
    x = ids()
    out = m(x)
    expect = F.cross_entropy(out.logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
    assert torch.isclose(head_loss("lm", out.logits, x), expect)


def test_prefix_lm_pattern_in_a_decoder():
    m = tiny("gpt2-tiny")
    x = ids(b=1, t=8)
    pattern = MaskSpec(causal=True, pattern=prefix_lm_mask(8, 4))
    with torch.no_grad():
        base = m(x, mask=pattern).logits
        changed = x.clone()
        changed[0, 3] = 5  # inside the prefix: earlier prefix positions now see it
        after = m(changed, mask=pattern).logits
    assert not torch.allclose(base[:, 0], after[:, 0])
    with torch.no_grad():
        late = x.clone()
        late[0, 6] = 5  # after the prefix: still causal, earlier positions cannot see it
        assert torch.allclose(m(late, mask=pattern).logits[:, :6], base[:, :6], atol=1e-6)
        assert not torch.allclose(m(x).logits[:, 0], base[:, 0])  # plain causal differs inside the prefix


def test_training_steps_reduce_the_loss():
    for name in ("bert-tiny", "gpt2-tiny"):
        m = tiny(name).train()
        x = ids(b=4, t=16)
        labels = x.clone()
        if name == "bert-tiny":
            labels[:, ::2] = -100
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        losses = []
        for _ in range(15):
            loss = head_loss(m.head_names[0], m(x).logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.7 * losses[0], (name, losses)


def test_bad_inputs_are_one_line_errors():
    enc, dec = tiny("bert-tiny"), tiny("gpt2-tiny")
    with pytest.raises(LmlabError, match="out of range"):
        enc(torch.tensor([[1, 2, V]]))
    with pytest.raises(LmlabError, match="out of range"):
        dec(torch.tensor([[-1, 2]]))
    with pytest.raises(LmlabError, match="longer than the model's 512 positions"):
        enc(torch.ones(1, 600, dtype=torch.long))
    with pytest.raises(LmlabError, match="longer than the model's 1024 positions"):
        dec(torch.ones(1, 1025, dtype=torch.long))
    with pytest.raises(LmlabError, match="decoder_input_ids"):
        enc(ids(), decoder_input_ids=ids())
    with pytest.raises(LmlabError, match="unexpected arguments"):
        dec(ids(), frobnicate=True)
    with pytest.raises(LmlabError, match="token_type_ids"):
        dec(ids(), token_type_ids=torch.zeros(2, 10, dtype=torch.long))
    with pytest.raises(LmlabError, match="batch"):
        enc(torch.tensor([1, 2, 3]))
    with pytest.raises(LmlabError, match="unknown encoder heads"):
        tiny("bert-tiny", heads=("lm",))
    with pytest.raises(LmlabError, match="DecoderConfig"):
        DecoderModel(get_preset("bert-tiny"))
