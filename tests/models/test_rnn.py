"""ELMo bi-LM and LSTM LM: shapes, directionality, scalar mix, padding, training on real text, save/load."""

from __future__ import annotations

import collections
import re

import pytest
import torch
import torch.nn.functional as F

from lmlab.errors import LmlabError
from lmlab.losses import causal_lm_loss
from lmlab.models.config import RNNConfig, get_preset
from lmlab.models.rnn import (
    CHAR_BOW,
    CHAR_BYTE_OFFSET,
    CHAR_EOW,
    CHAR_PAD,
    ELMoBiLM,
    LSTMLanguageModel,
    ScalarMix,
    build_rnn,
    encode_token_chars,
)
from lmlab.objectives.elmo import bilm_losses

V = 40
VOCAB = [f"tok{i}" for i in range(V)]


def elmo(**overrides) -> ELMoBiLM:
    torch.manual_seed(0)
    cfg = get_preset("elmo-tiny", vocab_size=V, dropout=0.0, **overrides)
    return ELMoBiLM(cfg, vocab=VOCAB).eval()


def lstm(**overrides) -> LSTMLanguageModel:
    torch.manual_seed(0)
    return LSTMLanguageModel(get_preset("lstm-tiny", vocab_size=V, dropout=0.0, **overrides)).eval()


# --------------------------------------------------------------------------- character input
def test_char_ids_format():
    ids = encode_token_chars(["ab", "é", "abcdefgh"], max_chars=6)
    a, b = CHAR_BYTE_OFFSET + 97, CHAR_BYTE_OFFSET + 98
    assert ids[0].tolist() == [CHAR_BOW, a, b, CHAR_EOW, CHAR_PAD, CHAR_PAD]
    assert ids[1].tolist()[:4] == [CHAR_BOW, CHAR_BYTE_OFFSET + 0xC3, CHAR_BYTE_OFFSET + 0xA9, CHAR_EOW]
    # long tokens keep their first max_chars - 2 bytes and still end with EOW
    assert ids[2].tolist() == [CHAR_BOW] + [CHAR_BYTE_OFFSET + ord(c) for c in "abcd"] + [CHAR_EOW]


def test_elmo_input_ids_and_char_ids_agree():
    m = elmo()
    ids = torch.randint(0, V, (2, 5))
    chars = encode_token_chars([VOCAB[i] for i in ids.flatten().tolist()], m.config.max_chars).view(2, 5, -1)
    a, b = m(ids), m(char_ids=chars)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)


# --------------------------------------------------------------------------- shapes
def test_elmo_shapes_and_layer_zero():
    m = elmo()
    B, T, D = 3, 6, m.config.d_model
    out = m(torch.randint(0, V, (B, T)))
    assert out.logits.shape == (B, T, V) and out.extra["backward_logits"].shape == (B, T, V)
    assert len(out.hidden_states) == m.config.n_layers + 1
    assert all(h.shape == (B, T, 2 * D) for h in out.hidden_states)
    h0 = out.hidden_states[0]
    torch.testing.assert_close(h0[..., :D], h0[..., D:], rtol=0, atol=0)   # layer 0 = [x; x]
    assert out.last_hidden_state is out.hidden_states[-1]
    stacked = m.layer_outputs(torch.randint(0, V, (B, T)))
    assert stacked.shape == (m.config.n_layers + 1, B, T, 2 * D)


def test_lstm_lm_shapes_and_tying():
    m = lstm()
    out = m(torch.randint(0, V, (2, 7)), output_hidden_states=True, use_cache=True)
    assert out.logits.shape == (2, 7, V)
    assert len(out.hidden_states) == m.config.n_layers + 1
    assert len(out.past_key_values) == m.config.n_layers
    assert m.lm_head.weight is m.embed.weight
    untied = lstm(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.embed.weight
    assert untied.num_parameters() - m.num_parameters() == V * m.config.d_model


# --------------------------------------------------------------------------- directionality
def test_elmo_directions_see_only_their_side():
    """d fwd[t] / d x[s] = 0 for s > t; d bwd[t] / d x[s] = 0 for s < t (and non-zero otherwise)."""
    m = elmo()
    T = 5
    x = m.token_representation(torch.randint(0, V, (1, T))).detach().requires_grad_(True)
    fwd, bwd = m.contextualize(x)
    for t in range(T):
        for name, layers in (("forward", fwd), ("backward", bwd)):
            (g,) = torch.autograd.grad(layers[-1][0, t].sum(), x, retain_graph=True)
            norms = g[0].abs().sum(-1)
            for s in range(T):
                if (s > t) if name == "forward" else (s < t):
                    assert norms[s] == 0, f"{name} LM at {t} sees token {s}"
                else:
                    assert norms[s] > 0, f"{name} LM at {t} ignores token {s}"


def test_elmo_token_change_only_reaches_its_side():
    m = elmo()
    ids = torch.randint(0, V, (1, 7))
    changed = ids.clone()
    s = 3
    changed[0, s] = (ids[0, s] + 1) % V
    a, b = m(ids), m(changed)
    torch.testing.assert_close(a.logits[0, :s], b.logits[0, :s], rtol=0, atol=0)
    torch.testing.assert_close(a.extra["backward_logits"][0, s + 1:], b.extra["backward_logits"][0, s + 1:],
                               rtol=0, atol=0)
    assert not torch.allclose(a.logits[0, s], b.logits[0, s])
    assert not torch.allclose(a.extra["backward_logits"][0, s], b.extra["backward_logits"][0, s])


def test_elmo_padding_left_or_right_changes_nothing():
    m = elmo()
    ids = torch.randint(1, V, (1, 5))
    ref = m(ids)
    pad = torch.zeros(1, 3, dtype=torch.long)
    ones, zeros = torch.ones(1, 5, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)
    right = m(torch.cat([ids, pad], 1), torch.cat([ones, zeros], 1))
    left = m(torch.cat([pad, ids], 1), torch.cat([zeros, ones], 1))
    for out, sl in ((right, slice(0, 5)), (left, slice(3, 8))):
        torch.testing.assert_close(out.logits[:, sl], ref.logits, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out.extra["backward_logits"][:, sl], ref.extra["backward_logits"],
                                   atol=1e-6, rtol=1e-5)
    # the deprecated labels= loss skips the padding on either side (kept one release)
    with pytest.warns(DeprecationWarning, match=r"ELMo.forward\(labels=\.\.\.\)"):
        ref_loss = m(ids, labels=ids).loss
        padded = [m(torch.cat(order, 1), torch.cat(mask, 1), labels=torch.cat(order, 1)).loss
                  for order, mask in (([ids, pad], [ones, zeros]), ([pad, ids], [zeros, ones]))]
    for loss in padded:
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)


def test_elmo_loss_is_sum_of_both_directions():
    m = elmo()
    ids = torch.randint(0, V, (2, 6))
    with pytest.warns(DeprecationWarning, match=r"ELMo.forward\(labels=\.\.\.\)"):  # kept one release
        out = m(ids, labels=ids)
    fwd = F.cross_entropy(out.logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    bwd = F.cross_entropy(out.extra["backward_logits"][:, 1:].reshape(-1, V), ids[:, :-1].reshape(-1))
    torch.testing.assert_close(out.extra["forward_loss"], fwd)
    torch.testing.assert_close(out.extra["backward_loss"], bwd)
    torch.testing.assert_close(out.loss, fwd + bwd)


# --------------------------------------------------------------------------- scalar mix
def test_scalar_mix_maths():
    torch.manual_seed(0)
    layers = torch.randn(3, 2, 4, 6)
    mix = ScalarMix(3)
    torch.testing.assert_close(mix(layers), layers.mean(0))          # s = 0, gamma = 1: plain average
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.7)
    w = torch.exp(torch.tensor([0.5, -1.0, 2.0]))
    w = w / w.sum()
    expected = 1.7 * (w[0] * layers[0] + w[1] * layers[1] + w[2] * layers[2])
    torch.testing.assert_close(mix(list(layers)), expected)
    mix(layers).sum().backward()
    assert mix.scalars.grad is not None and mix.gamma.grad is not None and mix.scalars.grad.abs().sum() > 0
    normed = ScalarMix(3, layer_norm=True)(layers)
    torch.testing.assert_close(normed, F.layer_norm(layers, (6,)).mean(0))
    with pytest.raises(LmlabError, match="3 layers"):
        mix(layers[:2])


def test_scalar_mix_over_elmo_layers():
    m = elmo()
    layers = m.layer_outputs(torch.randint(0, V, (2, 4)))
    emb = ScalarMix(m.config.n_layers + 1)(layers)
    assert emb.shape == (2, 4, 2 * m.config.d_model)


# --------------------------------------------------------------------------- LSTM LM state = cache
def test_lstm_lm_incremental_state_matches_full_forward():
    m = lstm()
    ids = torch.randint(0, V, (2, 9))
    full = m(ids).logits
    out = m(ids[:, :4], use_cache=True)
    steps = [out.logits]
    past = out.past_key_values
    for t in range(4, 9):
        out = m(ids[:, t:t + 1], past_key_values=past, use_cache=True)
        past = out.past_key_values
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- errors
def test_bad_inputs_and_configs_are_one_line_errors():
    m = elmo()
    with pytest.raises(LmlabError, match="out of range"):
        m(torch.tensor([[0, V]]))
    with pytest.raises(LmlabError, match="no character table"):
        ELMoBiLM(get_preset("elmo-tiny", vocab_size=V))(torch.tensor([[1, 2]]))
    with pytest.raises(LmlabError, match="vocabulary has"):
        ELMoBiLM(get_preset("elmo-tiny", vocab_size=V), vocab=VOCAB[:-1])
    with pytest.raises(LmlabError, match="d_hidden"):
        RNNConfig(family="lstm", d_model=64, d_hidden=32).validate()
    with pytest.raises(LmlabError, match="wider than max_chars"):
        RNNConfig(family="elmo", max_chars=4, char_filters=[[5, 8]]).validate()
    with pytest.raises(LmlabError, match="family"):
        build_rnn(RNNConfig(family="gru"))
    with pytest.raises(LmlabError, match="out of range"):
        lstm()(torch.tensor([[-1, 2]]))
    with pytest.raises(LmlabError, match="does not take position_ids"):
        lstm()(torch.tensor([[1, 2]]), position_ids=torch.tensor([[0, 1]]))


# --------------------------------------------------------------------------- training on real text
def _shakespeare_batches(text: str, n_vocab: int, T: int = 24, B: int = 8):
    words = re.findall(r"\w+|[^\w\s]", text[:60000])
    vocab = ["<unk>"] + [w for w, _ in collections.Counter(words).most_common(n_vocab - 1)]
    index = {w: i for i, w in enumerate(vocab)}
    ids = torch.tensor([index.get(w, 0) for w in words])
    n = (len(ids) // T) * T
    return vocab, ids[:n].view(-1, T)


@pytest.mark.parametrize("family", ["elmo", "lstm"])
def test_a_few_steps_lower_the_loss_on_shakespeare(shakespeare, family):
    vocab, windows = _shakespeare_batches(shakespeare, 300)
    torch.manual_seed(0)
    cfg = get_preset(f"{family}-tiny", vocab_size=len(vocab))
    model = ELMoBiLM(cfg, vocab=vocab) if family == "elmo" else LSTMLanguageModel(cfg)
    held_out = windows[-16:]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def loss_of(ids):  # ELMo: the sum of both directions' mean NLLs; LSTM: next-token NLL
        out = model(ids)
        if family == "elmo":
            return sum(bilm_losses(out.logits, out.extra["backward_logits"], ids, torch.zeros_like(ids)))
        return causal_lm_loss(out.logits, ids)

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            return float(loss_of(held_out))

    before = held_out_loss()
    model.train()
    for step in range(40):
        batch = windows[(step * 8) % 400:(step * 8) % 400 + 8]
        loss = loss_of(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = held_out_loss()
    assert after < before - 1.0, (before, after)


# --------------------------------------------------------------------------- save / load
@pytest.mark.parametrize("family", ["elmo", "lstm"])
def test_save_and_load_round_trip(tmp_path, family):
    from lmlab.loading import load_model

    model = elmo() if family == "elmo" else lstm()
    ids = torch.randint(0, V, (2, 6))
    model.save(tmp_path / "ck")
    loaded = load_model(tmp_path / "ck").eval()
    assert type(loaded) is type(model) and loaded.config == model.config
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    if family == "elmo":
        assert torch.equal(loaded.char_table, model.char_table)
    else:
        assert loaded.lm_head.weight is loaded.embed.weight
