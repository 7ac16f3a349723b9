"""T5 / BART parity with Hugging Face transformers, both directions (transformers is the oracle)."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.cli import main as cli_main
from lmlab.errors import LmlabError
from lmlab.interop import hf_export
from lmlab.loading import load_model
from lmlab.losses import token_loss
from lmlab.models import build_model, get_preset
from lmlab.models.seq2seq.hf import from_hf, to_hf
from lmlab.objectives.base import teacher_forced

T = pytest.importorskip("transformers")  # a dev dependency; the import is only for the oracle

V = 300


def hf_cases():
    return {
        # the configs of /work/shared/acceptance/models-interop
        "t5": (T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
               T.T5ForConditionalGeneration),
        # T5 v1.1: gated-GELU, untied head without the output rescale; plus an uneven decoder and d_kv
        "t5-v1.1": (T.T5Config(vocab_size=V, d_model=64, d_kv=8, d_ff=96, num_layers=2, num_decoder_layers=3,
                               num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                               relative_attention_num_buckets=8, relative_attention_max_distance=16),
                    T.T5ForConditionalGeneration),
        "bart": (T.BartConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_position_embeddings=128),
                 T.BartForConditionalGeneration),
        "bart-scaled": (T.BartConfig(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=2,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=40, scale_embedding=True,
                                     activation_function="relu"), T.BartForConditionalGeneration),
    }


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 17:] = 0
    dec = torch.randint(5, V, (2, 9), generator=g)
    dec_mask = torch.ones_like(dec)
    dec_mask[1, 7:] = 0
    labels = dec.clone()
    labels[1, 7:] = -100
    return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                labels=labels)


def scored(model, inputs, **kw):
    """An lmlab seq2seq model's output on ``inputs`` less the labels, and the labels' mean
    cross-entropy from its logits (what transformers' ``loss`` is)."""
    out = model(**{k: v for k, v in inputs.items() if k != "labels"}, **kw)
    return out, token_loss(out.logits, inputs["labels"])


@pytest.mark.parametrize("name", list(hf_cases()))
def test_hf_checkpoint_loads_with_identical_outputs(name, inputs, tmp_path):
    torch.manual_seed(0)
    cfg, cls = hf_cases()[name]
    ref = cls(cfg).eval()
    if name.startswith("bart"):
        ref.final_logits_bias.normal_()  # zero at init: make it count
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = load_model(tmp_path)
    assert model.config.family == name.split("-")[0]
    assert model.num_parameters() == ref.num_parameters()
    with torch.no_grad():
        r = ref(**inputs, output_hidden_states=True)
        o, loss = scored(model, inputs, output_hidden_states=True)
    torch.testing.assert_close(o.logits, r.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(loss, r.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(o.encoder_last_hidden_state, r.encoder_last_hidden_state, atol=1e-5, rtol=0)
    for mine, theirs in zip(o.hidden_states, r.decoder_hidden_states, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    for mine, theirs in zip(o.extra["encoder_hidden_states"], r.encoder_hidden_states, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    # the same model back out through `lmlab export` loads in transformers with the same logits
    model.save(tmp_path / "ck")
    assert cli_main(["export", "--checkpoint", str(tmp_path / "ck"), "--format", "hf", "--out",
                     str(tmp_path / "hf")]) == 0
    back = cls.from_pretrained(tmp_path / "hf").eval()
    assert back.num_parameters() == ref.num_parameters()
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs).logits, r.logits, atol=1e-4, rtol=0)


def test_hf_cached_step_matches_lmlab_cache(inputs, tmp_path):
    """One cached decoding step in transformers equals one cached step in lmlab (T5: the relative
    bias of the new query must use its true position)."""
    torch.manual_seed(0)
    cfg, cls = hf_cases()["t5"]
    ref = cls(cfg).eval()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = load_model(tmp_path)
    ids, mask, dec = inputs["input_ids"], inputs["attention_mask"], inputs["decoder_input_ids"]
    with torch.no_grad():
        r = ref(input_ids=ids, attention_mask=mask, decoder_input_ids=dec[:, :5], use_cache=True)
        r2 = ref(encoder_outputs=(r.encoder_last_hidden_state,), attention_mask=mask,
                 decoder_input_ids=dec[:, 5:6], past_key_values=r.past_key_values, use_cache=True)
        o = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec[:, :5], use_cache=True)
        o2 = model(attention_mask=mask, decoder_input_ids=dec[:, 5:6], past_key_values=o.past_key_values,
                   use_cache=True)
    torch.testing.assert_close(o2.logits, r2.logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name, overrides", [
    ("t5", {}),
    ("t5", {"activation": "gated-gelu", "tie_embeddings": False, "scale_decoder_output": False}),
    ("t5", {"share_encoder_decoder": True}),
    ("bart", {"scale_embedding": True, "n_decoder_layers": 3}),
])
def test_lmlab_model_exports_to_transformers(name, overrides, inputs, tmp_path):
    torch.manual_seed(0)
    model = build_model(get_preset(f"{name}-tiny", vocab_size=V, max_positions=64, **overrides)).eval()
    if model.final_logits_bias is not None:
        model.final_logits_bias.normal_()
    hf_export(model, tmp_path)
    cls = T.T5ForConditionalGeneration if name == "t5" else T.BartForConditionalGeneration
    ref = cls.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        o, loss = scored(model, inputs)
        r = ref(**inputs)
    torch.testing.assert_close(r.logits, o.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(r.loss, loss, atol=1e-5, rtol=0)
    if not overrides.get("share_encoder_decoder"):  # transformers cannot share: it holds two copies
        assert ref.num_parameters() == model.num_parameters()
    # labels alone: both shift right with the decoder start token
    with torch.no_grad():
        _, loss = teacher_forced(model, {"input_ids": inputs["input_ids"], "labels": inputs["labels"]})
        torch.testing.assert_close(loss, ref(input_ids=inputs["input_ids"], labels=inputs["labels"]).loss)


def test_conversion_errors_are_one_line(tmp_path):
    torch.manual_seed(0)
    cfg, cls = hf_cases()["t5"]
    hf_config, state = to_hf(build_model(get_preset("t5-tiny", vocab_size=V)))
    with pytest.raises(LmlabError, match="T5ForQuestionAnswering"):
        from_hf(hf_config, state, ["T5ForQuestionAnswering"])
    broken = dict(state)
    broken.pop("encoder.block.1.layer.1.DenseReluDense.wo.weight")
    with pytest.raises(LmlabError, match="lacks encoder.block.1"):
        from_hf(hf_config, broken, hf_config["architectures"])
    with pytest.raises(LmlabError, match="shape"):
        from_hf({**hf_config, "d_ff": 100}, state, hf_config["architectures"])
    with pytest.raises(LmlabError, match="does not know"):
        from_hf(hf_config, {**state, "classifier.weight": torch.zeros(2, 64)}, hf_config["architectures"])
    odd = build_model(get_preset("t5-tiny", vocab_size=V, positions="learned"))
    with pytest.raises(LmlabError, match="no transformers equivalent"):
        to_hf(odd)
    json.dumps(hf_config)  # the exported config is plain JSON
