"""int8 quantization: the per-channel error bound, closeness of a real model's outputs, 4x smaller
linear weights, safetensors checkpoints that load back exactly, task accuracy kept on real SST-2."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors import safe_open

from lmlab.adapt.quantize import (
    Int8Linear,
    dequantize_rows,
    linear_weight_bytes,
    quantize_model,
    quantize_rows,
    save_quantized,
)
from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return load_model(minilm_dir)


@pytest.fixture(scope="module")
def sentences(data_dir) -> list[str]:
    lines = (data_dir / "glue" / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:33]
    return [line.split("\t")[0] for line in lines]


def encode(model, sentences):
    enc = model.tokenizer.encode_batch(sentences, truncation=True, max_length=64, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def test_quantize_dequantize_error_is_at_most_half_a_step_per_channel(minilm):
    for name in ("layers.0.attn.q_proj", "layers.3.ffn.fc_in", "layers.5.ffn.fc_out"):
        w = minilm.get_submodule(name).weight.detach()
        q, scale = quantize_rows(w)
        assert q.dtype == torch.int8 and scale.shape == (w.shape[0],)
        assert int(q.abs().max()) == 127                       # each row's largest weight uses the full range
        err = (w - dequantize_rows(q, scale)).abs().amax(dim=1)
        assert bool((err <= scale / 2 * (1 + 1e-5)).all()), name
        assert float(err.max()) > 0                             # it really is lossy: the bound is tight-ish
    zero_row = torch.zeros(2, 8)
    q, scale = quantize_rows(zero_row)
    assert torch.equal(dequantize_rows(q, scale), zero_row)


def test_int8_matmul_path_equals_integer_arithmetic():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 24)
    layer = Int8Linear.from_linear(lin, "dynamic")
    x = torch.randn(3, 5, 48)
    qx, a = quantize_rows(x.reshape(-1, 48))
    expected = (qx.long() @ layer.qweight.long().t()).float() * a[:, None] * layer.scale + lin.bias
    assert torch.allclose(layer(x).reshape(-1, 24), expected.detach(), atol=1e-5)


@pytest.mark.parametrize("activations", ["dynamic", "none"])
def test_real_minilm_outputs_stay_close(minilm, sentences, activations):
    ids, mask = encode(minilm, sentences)
    q = copy.deepcopy(minilm)
    names = quantize_model(q, activations)
    assert len(names) == 6 * 6 + 1                             # q,k,v,o,fc_in,fc_out per layer + pooler
    with torch.no_grad():
        ref = minilm(ids, attention_mask=mask).last_hidden_state
        out = q(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()                                          # padding positions carry no meaning
    rel = float((out - ref)[real].norm() / ref[real].norm())
    pooled = [(h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True) for h in (out, ref)]
    cos = float(torch.nn.functional.cosine_similarity(*pooled).min())   # the sentence embeddings
    # measured: dynamic 0.077 / 0.9929, weight-only 0.030 / 0.9991 (activation outliers cost the rest)
    limit = 0.1 if activations == "dynamic" else 0.05
    assert 0 < rel < limit and cos > 0.99, (rel, cos)
    ratio = linear_weight_bytes(minilm) / linear_weight_bytes(q)
    assert 3.9 < ratio <= 4.0, ratio


def test_checkpoint_is_int8_safetensors_and_loads_back_identically(minilm, sentences, tmp_path):
    ids, mask = encode(minilm, sentences[:4])
    q = copy.deepcopy(minilm)
    quantize_model(q)
    save_quantized(q, tmp_path / "q")
    with safe_open(str(tmp_path / "q" / "model.safetensors"), "pt") as f:
        assert f.get_slice("layers.0.attn.q_proj.qweight").get_dtype() == "I8"
        assert f.get_slice("layers.0.attn.q_proj.scale").get_dtype() == "F32"
        assert "layers.0.attn.q_proj.weight" not in f.keys()
    back = load_model(tmp_path / "q")                           # the ordinary loader reads it
    assert isinstance(back.layers[2].ffn.fc_in, Int8Linear) and back.tokenizer is not None
    with torch.no_grad():
        assert torch.equal(back(ids, attention_mask=mask).last_hidden_state,
                           q(ids, attention_mask=mask).last_hidden_state)
    float_size = sum(p.numel() * 4 for p in minilm.parameters())
    assert (tmp_path / "q" / "model.safetensors").stat().st_size < 0.65 * float_size  # embeddings stay float


def test_tied_head_stays_float_and_errors_are_clear(tmp_path):
    model = build_model(get_preset("bert-tiny", vocab_size=300))          # MLM decoder tied to embeddings
    names = quantize_model(model)
    assert "heads.mlm.decoder" not in names and "heads.mlm.dense" in names
    assert model.heads["mlm"].decoder.weight is model.embeddings.word.weight
    with pytest.raises(LmlabError, match="already quantized"):
        quantize_model(model)
    with pytest.raises(LmlabError, match="activation"):
        quantize_model(build_model(get_preset("bert-tiny", vocab_size=300)), "int4")
    with pytest.raises(LmlabError, match="no linear layer"):
        quantize_model(build_model(get_preset("gpt2-tiny", vocab_size=300)), include=("nothing*",))


def test_task_accuracy_within_one_point_and_cli_roundtrip(tmp_path, data_dir, minilm_dir, capsys):
    """A small encoder trained on real SST-2 keeps its dev accuracy (300 examples) within 1 point;
    `lmlab compress quantize` writes a checkpoint that `lmlab evaluate` scores the same way."""
    from lmlab.finetune import finetune
    from lmlab.tokenizers import load_tokenizer

    g = data_dir / "glue" / "sst2"
    tok = load_tokenizer(minilm_dir / "vocab.txt")              # the real BERT WordPiece vocabulary
    torch.manual_seed(0)
    base = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size))
    base.tokenizer = tok
    res = finetune(base, "sst2", g / "train.tsv", g / "dev.tsv", tmp_path / "ft", max_train_examples=3000,
                   max_eval_examples=300, max_steps=100, batch_size=32, lr=3e-3, max_length=32,
                   progress=False, log=lambda m: None)
    assert res.metrics["accuracy"] > 0.55                       # it learnt something to keep

    code = main(["compress", "quantize", "--checkpoint", str(tmp_path / "ft"), "--dev", str(g / "dev.tsv"),
                 "--max-eval-examples", "300", "--out", str(tmp_path / "q")])
    assert code == 0
    printed = capsys.readouterr().out                           # a summary for people, before -> after
    report = json.loads((tmp_path / "q" / "compress.json").read_text())
    assert printed.startswith("quantized ") and "size on disk" in printed and "dev accuracy" in printed
    before, after = report["before"]["metrics"]["accuracy"], report["after"]["metrics"]["accuracy"]
    assert before == pytest.approx(res.metrics["accuracy"])
    assert abs(after - before) <= 0.01, (before, after)
    assert report["before"]["linear_weight_bytes"] / report["after"]["linear_weight_bytes"] > 3.5
    assert report["after"]["size_bytes"] < report["before"]["size_bytes"]
    code = main(["evaluate", "--checkpoint", str(tmp_path / "q"), "--data", str(g / "dev.tsv"),
                 "--max-examples", "300"])
    assert code == 0 and json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(after)


def test_every_command_that_trains_refuses_int8_weights_before_loading(ckpt, tmp_path, capsys, monkeypatch):
    """`lmlab finetune` (any --method), `lmlab align` and `compress distill --init teacher` took an int8
    checkpoint and wrote a broken model (a fine-tune trained half the weights; evaluate then refused
    it). The one place a model is opened for training (lmlab.finetune.loop.load_trainable_model)
    refuses it from config.json, as export and prune do (lmlab.models.refuse_int8); in memory too."""
    import lmlab.loading
    from lmlab.adapt.distill import distill, make_student
    from lmlab.finetune import finetune

    model = load_model(ckpt)
    quantize_model(model)
    save_quantized(model, tmp_path / "q", tokenizer=model.tokenizer)
    (tmp_path / "q" / "task.json").write_text("{}")                    # as if fine-tuned (distill's test)
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"prompt": "a", "chosen": " b", "rejected": " c"}) + "\n")
    monkeypatch.setattr(lmlab.loading, "load_model",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights read")))
    q, out = str(tmp_path / "q"), str(tmp_path / "out")
    commands = {
        "fine-tuning": [["finetune", "--checkpoint", q, "--task", "sst2", "--train", str(data), "--dev",
                         str(data), "--out", out, *more] for more in ([], ["--method", "lora"],
                                                                      ["--lr", "auto"])],
        "preference tuning": [["align", "--checkpoint", q, "--train", str(pairs), "--dev", str(pairs),
                               "--out", out]],
        "--init teacher": [["compress", "distill", "--teacher", q, "--train", str(data), "--out", out]],
    }
    for reader, argvs in commands.items():
        for argv in argvs:
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert err.startswith(f"error: {q} holds int8 weights") and reader in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    with pytest.raises(LmlabError, match="int8 weights"):
        finetune(model, "sst2", str(data), str(data), None, max_steps=1)
    with pytest.raises(LmlabError, match="int8 weights"):
        make_student(model, 1)
    float_model = build_model(get_preset("gpt2-tiny", vocab_size=model.config.vocab_size))
    with pytest.raises(LmlabError, match="int8 weights"):
        distill(float_model, model, None, [])


def test_cli_exclude_patterns_are_checked_before_anything_is_said(ckpt, tmp_path, capsys):
    """--exclude matching no linear layer (a typo that quantized everything) and --exclude leaving
    none are one line each, naming --exclude (there is no --include flag) and listing the model's
    layers, before the 'quantizing' line."""
    from lmlab.cli import main

    out = tmp_path / "q"
    listed = "linear layers: layers.*.attn.q_proj"
    for pattern, words in (("nonexistent*", "error: --exclude 'nonexistent*' matches no linear layer of this "
                                            f"model; use a pattern over its {listed}"),
                           ("*", "error: --exclude '*' leaves no linear layer to quantize; exclude fewer "
                                 f"of its {listed}")):
        capsys.readouterr()
        assert main(["compress", "quantize", "--checkpoint", str(ckpt), "--out", str(out), "--exclude",
                     pattern]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(words) and "include" not in err, err
        assert not out.exists()
    with pytest.raises(LmlabError, match="exclude 'heads.nothing' matches no linear layer"):
        quantize_model(build_model(get_preset("gpt2-tiny", vocab_size=300)), exclude=("heads.nothing",))
