"""Hugging Face interop for bert, roberta, albert, electra, gpt2 and llama: exact parity both ways.

transformers is the oracle: a randomly initialised HF model saved with save_pretrained must give
the same logits and hidden states in lmlab (import), and a randomly initialised lmlab model
exported with hf_export must give the same logits in transformers (export). Parameter counts match.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.interop import hf_export, hf_import
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset

V = 300
CASES = {
    "bert": lambda: (
        T.BertConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
        ),
        T.BertForMaskedLM,
    ),
    "roberta": lambda: (
        T.RobertaConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=40,
        ),
        T.RobertaForMaskedLM,
    ),
    "albert": lambda: (
        T.AlbertConfig(
            vocab_size=V,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
        ),
        T.AlbertForMaskedLM,
    ),
    "electra": lambda: (
        T.ElectraConfig(
            vocab_size=V,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
        ),
        T.ElectraForPreTraining,
    ),
    "gpt2": lambda: (
        T.GPT2Config(
            vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2
        ),
        T.GPT2LMHeadModel,
    ),
    "llama": lambda: (
        T.LlamaConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            rope_theta=500.0,
        ),
        T.LlamaForCausalLM,
    ),
}


def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, V, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def hf_save(tmp_path, name, extra_cls=None):
    torch.manual_seed(0)
    cfg, cls = CASES[name]()
    cls = extra_cls or cls
    ref = cls(cfg).eval()
    d = tmp_path / f"hf-{name}"
    ref.save_pretrained(d, safe_serialization=True)
    return ref, d


def max_diff(a, b, mask=None):
    d = (a - b).abs()
    if mask is not None and d.dim() >= 2 and d.shape[:2] == mask.shape:
        d = d[mask.bool()]
    return d.max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_import_matches_transformers(tmp_path, name):
    ref, d = hf_save(tmp_path, name)
    m = load_model(d)
    assert m.num_parameters() == ref.num_parameters()
    ids, mask = batch()
    with torch.no_grad():
        r = ref(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        o = m(ids, attention_mask=mask, output_hidden_states=True)
    assert max_diff(o.logits, r.logits, mask) < 1e-4
    assert len(o.hidden_states) == len(r.hidden_states)
    assert max(max_diff(a, b, mask) for a, b in zip(o.hidden_states, r.hidden_states)) < 1e-4


@pytest.mark.parametrize("name", list(CASES))
def test_lmlab_model_exports_to_transformers(tmp_path, name):
    preset = {
        "bert": "bert-tiny",
        "roberta": "roberta-tiny",
        "albert": "albert-tiny",
        "electra": "electra-small",
        "gpt2": "gpt2-tiny",
        "llama": "llama-tiny",
    }[name]
    torch.manual_seed(1)
    over = dict(n_layers=2, max_positions=64) if name == "electra" else {}
    m = build_model(get_preset(preset, vocab_size=V, **over)).eval()
    out = hf_export(m, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    cls = getattr(T, cfg["architectures"][0])
    ref = cls.from_pretrained(out).eval()
    assert ref.num_parameters() == m.num_parameters()
    ids, mask = batch()
    with torch.no_grad():
        assert (
            max_diff(m(ids, attention_mask=mask).logits, ref(input_ids=ids, attention_mask=mask).logits, mask)
            < 1e-4
        )


def hf_main_output(r):
    """The tensor lmlab returns as ``logits`` for this HF output (QA: start/end stacked)."""
    if hasattr(r, "start_logits"):
        return torch.stack([r.start_logits, r.end_logits], -1)
    for k in ("logits", "prediction_logits", "last_hidden_state"):
        if getattr(r, k, None) is not None:
            return getattr(r, k)
    raise AssertionError(type(r))


def test_other_head_classes_round_trip(tmp_path):
    ids, mask = batch()
    for name, cls in [
        ("bert", T.BertForPreTraining),
        ("bert", T.BertForSequenceClassification),
        ("roberta", T.RobertaForSequenceClassification),
        ("electra", T.ElectraForMaskedLM),
        ("albert", T.AlbertForQuestionAnswering),
        ("gpt2", T.GPT2ForSequenceClassification),
        ("llama", T.LlamaModel),
    ]:
        ref, d = hf_save(tmp_path, name, cls)
        m = load_model(d)
        assert m.num_parameters() == ref.num_parameters(), cls.__name__
        kwargs = dict(input_ids=ids[:1], attention_mask=mask[:1])
        with torch.no_grad():
            r, o = ref(**kwargs), m(ids[:1], attention_mask=mask[:1])
            ours = o.logits if o.logits is not None else o.last_hidden_state
            assert max_diff(ours, hf_main_output(r)) < 1e-4, cls.__name__
            if cls is T.BertForPreTraining:
                assert max_diff(o.extra["nsp_logits"], r.seq_relationship_logits) < 1e-4
            back = cls.from_pretrained(hf_export(m, tmp_path / f"back-{cls.__name__}")).eval()
            assert max_diff(hf_main_output(back(**kwargs)), hf_main_output(r)) < 1e-4, cls.__name__


def test_cli_import_and_export(tmp_path, capsys):
    ref, d = hf_save(tmp_path, "gpt2")
    assert main(["import", "--hf", str(d), "--out", str(tmp_path / "ck")]) == 0
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["family"] == "gpt2"
    assert (
        main(
            ["export", "--checkpoint", str(tmp_path / "ck"), "--format", "hf", "--out", str(tmp_path / "hf")]
        )
        == 0
    )
    assert "parameters" in capsys.readouterr().out
    back = T.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids, _ = batch()
    with torch.no_grad():
        assert max_diff(back(ids).logits, ref(ids).logits) < 1e-5
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unsupported_or_unsafe_inputs(tmp_path):
    d = tmp_path / "weird"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(LmlabError, match="model type 'mamba' is not supported"):
        hf_import(d)
    (d / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (d / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(LmlabError, match="pickle"):
        hf_import(d)
    _, hf = hf_save(tmp_path, "llama")
    cfg = json.loads((hf / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LmlabError, match="rope_type 'yarn'"):
        load_model(hf)
    prenorm_bert = build_model(get_preset("bert-tiny", vocab_size=V, prenorm=True))
    with pytest.raises(LmlabError, match="bert export needs the standard architecture"):
        hf_export(prenorm_bert, tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_exported_decoder_generates_with_transformers_own_calls_as_lmlab_does(tmp_path, shakespeare):
    """After export, ``model.generate(**tokenizer(text))`` and the text-generation pipeline give
    lmlab's greedy tokens: the prompt is not wrapped in [CLS] ... [SEP], no token_type_ids."""
    from lmlab.generate import generate
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", [shakespeare[:100_000]], vocab_size=400)
    torch.manual_seed(3)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))
    model.tokenizer = tok
    model.eval()
    hf_export(model, tmp_path / "hf")
    hf_model = T.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = T.AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompt = "ROMEO: what light"
    enc = hf_tok(prompt, return_tensors="pt")
    assert set(enc) == {"input_ids", "attention_mask"} and enc["input_ids"][0].tolist() == tok.encode(prompt)
    theirs = hf_model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=0)
    ours = generate(model, torch.tensor([tok.encode(prompt)]), max_new_tokens=12, eos_token_id=[])
    assert theirs.tolist() == ours.tolist()
    pipe = T.pipeline("text-generation", model=hf_model, tokenizer=hf_tok)
    text = pipe(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0]["generated_text"]
    assert text == tok.decode(ours[0].tolist())
