"""lmlab checkpoints: safetensors + config.json + tokenizer, atomic, with clear errors when broken."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset, load_checkpoint
from lmlab.tokenizers import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer(shakespeare):
    return train_tokenizer("bytelevel", [shakespeare[:20000]], vocab_size=300)


def model(preset="gpt2-tiny", **kw):
    torch.manual_seed(0)
    return build_model(get_preset(preset, vocab_size=300, **kw)).eval()


@pytest.mark.parametrize(
    "preset,heads",
    [
        ("gpt2-tiny", None),
        ("llama-tiny", ("lm", "cls")),
        ("bert-tiny", ("mlm", "nsp")),
        ("albert-tiny", None),
    ],
)
def test_round_trip_gives_identical_outputs(tmp_path, preset, heads):
    torch.manual_seed(0)
    m = build_model(get_preset(preset, vocab_size=300), heads=heads).eval()
    m.save(tmp_path / "ck")
    back = load_model(tmp_path / "ck")
    assert type(back) is type(m) and back.head_names == m.head_names and back.config == m.config
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, m(ids).logits)
    assert not back.training


def test_layout_tied_weights_once_and_tokenizer_inside(tmp_path, tokenizer):
    m = model("gpt2-tiny")
    m.tokenizer = tokenizer
    m.save(tmp_path / "ck")
    meta = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert (
        meta["lmlab_format_version"] == 1 and meta["architecture"] == "decoder" and meta["family"] == "gpt2"
    )
    assert meta["heads"] == ["lm"] and meta["config"]["d_model"] == 64
    with safe_open(tmp_path / "ck" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "tok_embed.weight" in keys and "heads.lm.proj.weight" not in keys  # tied matrix stored once
    back = load_model(tmp_path / "ck")
    assert back.heads["lm"].proj.weight is back.tok_embed.weight
    assert back.tokenizer.encode("To be, or not to be") == tokenizer.encode("To be, or not to be")
    assert not list(tmp_path.glob(".ck*"))  # no temporary leftovers


def test_failed_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    m = model()
    m.save(tmp_path / "ck")
    before = (tmp_path / "ck" / "model.safetensors").read_bytes()
    import safetensors.torch

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        model(d_ff=128).save(tmp_path / "ck")
    assert (tmp_path / "ck" / "model.safetensors").read_bytes() == before
    assert load_model(tmp_path / "ck").config.d_ff == 256


def test_broken_checkpoints_are_one_line_errors(tmp_path):
    m = model()
    m.save(tmp_path / "ck")
    w = tmp_path / "ck" / "model.safetensors"
    data = w.read_bytes()

    w.write_bytes(data[: len(data) // 2])
    with pytest.raises(LmlabError, match="corrupt or truncated") as e:
        load_model(tmp_path / "ck")
    assert "\n" not in str(e.value)

    w.unlink()
    with pytest.raises(LmlabError, match="does not exist"):
        load_model(tmp_path / "ck")
    w.write_bytes(data)

    cfg_path = tmp_path / "ck" / "config.json"
    meta = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**meta, "lmlab_format_version": 99}))
    with pytest.raises(LmlabError, match="format version 99"):
        load_model(tmp_path / "ck")

    cfg_path.write_text(json.dumps({**meta, "config": {**meta["config"], "n_experts": 8}}))
    with pytest.raises(LmlabError, match="no fields"):
        load_model(tmp_path / "ck")

    cfg_path.write_text(json.dumps({**meta, "config": {**meta["config"], "d_ff": 128}}))
    with pytest.raises(LmlabError, match="has shape"):
        load_model(tmp_path / "ck")

    cfg_path.write_text(json.dumps({**meta, "config": {**meta["config"], "n_heads": 5}}))
    with pytest.raises(LmlabError, match="does not divide d_model"):
        load_model(tmp_path / "ck")

    cfg_path.write_text("{not json")
    with pytest.raises(LmlabError, match="corrupt"):
        load_model(tmp_path / "ck")

    with pytest.raises(LmlabError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, tokenizer):
    small = build_model(get_preset("bert-tiny", vocab_size=100))
    with pytest.raises(LmlabError, match="tokenizer has .* tokens but the model's vocab_size is 100"):
        small.save(tmp_path / "ck", tokenizer=tokenizer)
    assert not (tmp_path / "ck").exists()


def test_missing_weights_are_named(tmp_path):
    m = model("bert-tiny")
    m.save(tmp_path / "ck")
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "ck" / "model.safetensors")
    state.pop("layers.1.ffn.fc_in.weight")
    save_file(state, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(LmlabError, match="layers.1.ffn.fc_in.weight"):
        load_checkpoint(tmp_path / "ck")
