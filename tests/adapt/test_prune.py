"""Magnitude pruning: measured sparsity equals the target, the smallest weights go, structured
variants remove whole rows / heads, and pruned weights stay zero through further fine-tuning."""

from __future__ import annotations

import json

import pytest
import torch
from assertions import exit_code

from lmlab.adapt.prune import PruneMasks, nonzero_parameters, prunable_weights, prune_model, sparsity_note
from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return load_model(minilm_dir)


def zeros_share(model) -> float:
    ws = [m.weight for m in prunable_weights(model).values()]
    return sum(int((w == 0).sum()) for w in ws) / sum(w.numel() for w in ws)


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_unstructured_sparsity_equals_target_and_removes_the_smallest(minilm_dir, scope):
    model = load_model(minilm_dir)
    before = {n: m.weight.detach().clone() for n, m in prunable_weights(model).items()}
    assert zeros_share(model) == 0
    masks = prune_model(model, 0.3, scope=scope)
    n = sum(w.numel() for w in before.values())
    assert abs(zeros_share(model) - 0.3) <= len(before) / n    # round(0.3 n) weights (per matrix: layer)
    assert masks.sparsity() == pytest.approx(zeros_share(model), abs=1 / n)
    if scope == "global":
        kept = torch.cat([before[k][m].abs() for k, m in masks.masks.items()])
        gone = torch.cat([before[k][~m].abs() for k, m in masks.masks.items()])
        assert float(gone.max()) <= float(kept.min())          # one threshold for all layers
        shares = [float((~m).float().mean()) for m in masks.masks.values()]
        assert max(shares) - min(shares) > 0.02                # ... so layers lose different fractions
    else:
        for k, m in masks.masks.items():
            assert float((~m).float().mean()) == pytest.approx(0.3, abs=1 / m.numel())
            assert float(before[k][~m].abs().max()) <= float(before[k][m].abs().min())
    emb = model.embeddings.word.weight                          # not a target: untouched
    assert int((emb == 0).sum()) < emb.numel() * 0.01


def test_rows_and_heads_are_removed_whole():
    torch.manual_seed(0)
    model = build_model(get_preset("bert-small", vocab_size=500), heads=("seq_cls",)).eval()
    masks = prune_model(model, 0.5, scope="layer", structure="rows")
    fc_in = model.layers[0].ffn.fc_in
    dead = (fc_in.weight == 0).all(dim=1)
    assert int(dead.sum()) == fc_in.out_features // 2
    assert bool((fc_in.bias[dead] == 0).all())                  # the neuron outputs exactly zero
    assert masks.sparsity(model) == pytest.approx(0.5, abs=1e-3)

    model = build_model(get_preset("bert-small", vocab_size=500), heads=("seq_cls",)).eval()
    prune_model(model, 0.5, scope="layer", structure="heads")
    attn = model.layers[1].attn
    d = attn.head_dim
    cols = attn.o_proj.weight.view(attn.o_proj.out_features, attn.n_heads, d)
    dead_heads = (cols == 0).flatten(0).view(-1, attn.n_heads, d).permute(1, 0, 2).flatten(1).all(dim=1)
    assert int(dead_heads.sum()) == attn.n_heads // 2
    q = attn.q_proj.weight.view(attn.n_heads, d, -1)
    assert bool((q[dead_heads] == 0).all()) and bool((q[~dead_heads] != 0).any())
    # the pruned heads contribute nothing: scaling their value rows changes no output
    ids = torch.randint(5, 500, (2, 9))
    with torch.no_grad():
        ref = model(ids).logits
        v = attn.v_proj.weight.view(attn.n_heads, d, -1)
        v[dead_heads] += 1.0
        assert torch.allclose(model(ids).logits, ref, atol=1e-6)


@pytest.mark.parametrize("structure,sparsity,scope", [
    ("heads", 0.9, "layer"), ("rows", 0.999, "layer"), ("unstructured", 0.9999999, "layer"),
    ("heads", 0.9999999, "global"), ("rows", 0.9999999, "global"), ("unstructured", 0.9999999, "global")])
def test_a_sparsity_near_one_keeps_one_head_row_or_weight(structure, sparsity, scope):
    """--sparsity 0.9 --structure heads --scope layer removed every head (sparsity 1.0, a dead
    model); the selection (adapt.prune._select) now keeps one per layer (layer) / in the model
    (global), and the note says why the sparsity is not the one asked for."""
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=300), heads=("seq_cls",)).eval()
    masks = prune_model(model, sparsity, scope=scope, structure=structure)
    assert 0 < masks.sparsity(model) < 1 and masks.floored
    kept = {n: int(m.sum()) for n, m in masks.masks.items() if n.endswith("weight")}
    if scope == "layer":
        assert all(kept.values()), kept                             # something left in every layer
    else:
        assert sum(kept.values()) > 0
    note = sparsity_note(masks, sparsity, structure, scope, model)
    assert note.startswith(f"; asked for {sparsity:.10g}: at least one") and "kept" in note
    exact = prune_model(build_model(get_preset("bert-tiny", vocab_size=300)), 0.5)
    assert not exact.floored and sparsity_note(exact, 0.5, "unstructured", "global") == ""


def test_masks_keep_pruned_weights_zero_during_finetuning(data_dir, minilm_dir, tmp_path):
    from lmlab.finetune import finetune
    from lmlab.tasks import make_task
    from lmlab.tokenizers import load_tokenizer

    g = data_dir / "glue" / "sst2"
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=30522), heads=("seq_cls",))
    model.tokenizer = load_tokenizer(minilm_dir / "vocab.txt")
    task = make_task("sst2", "encoder", max_length=32)
    train, dev = task.read(g / "train.tsv")[:256], task.read(g / "dev.tsv")[:64]
    task.fit(train)
    model = task.prepare_model(model)
    masks = prune_model(model, 0.6).attach(model)
    pruned = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = finetune(model, task, train, dev, None, max_steps=8, batch_size=32, lr=1e-3, weight_decay=0.1,
                   progress=False, log=lambda m: None)
    assert res.model is model                                   # the loop trained this very model
    after = dict(model.named_parameters())
    for name, mask in masks.masks.items():
        assert bool((after[name][~mask] == 0).all()), name      # pruned: still exactly zero
        assert not torch.equal(after[name][mask], pruned[name][mask]), name   # kept: trained
    assert masks.sparsity(model) == pytest.approx(0.6, abs=1e-5)
    # without the masks the same training moves the pruned weights
    masks.detach()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    from lmlab.tasks import collate

    batch = collate(task.features(train[:32], model.tokenizer), 0)
    model.train()
    task.loss(model, batch).backward()
    opt.step()
    assert masks.sparsity(model) < 0.5
    assert PruneMasks.from_zeros(model).sparsity() < 0.5


def test_cli_prune_finetune_and_bad_input(data_dir, minilm_dir, tmp_path, capsys):
    from lmlab.tokenizers import load_tokenizer

    g = data_dir / "glue" / "sst2"
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=30522), heads=("seq_cls",))
    model.save(tmp_path / "ck", tokenizer=load_tokenizer(minilm_dir / "vocab.txt"))
    from lmlab.finetune import finetune

    finetune(tmp_path / "ck", "sst2", g / "train.tsv", g / "dev.tsv", tmp_path / "ft", max_train_examples=64,
             max_eval_examples=32, max_steps=2, batch_size=32, max_length=32, progress=False,
             log=lambda m: None)
    code = main(["compress", "prune", "--checkpoint", str(tmp_path / "ft"), "--sparsity", "0.5",
                 "--dev", str(g / "dev.tsv"), "--max-eval-examples", "32", "--train", str(g / "train.tsv"),
                 "--steps", "3", "--max-train-examples", "64", "--batch-size", "16", "--lr", "1e-3",
                 "--out", str(tmp_path / "pr")])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("pruned to 50% sparsity (unstructured, global), then fine-tuned 3 steps")
    assert "zeros kept in dense matrices" in printed                # why it is no smaller, no faster
    report = json.loads((tmp_path / "pr" / "compress.json").read_text())
    assert report["method"]["measured_sparsity"] == pytest.approx(0.5, abs=1e-5)
    assert report["method"]["measured_sparsity_after_finetune"] == pytest.approx(0.5, abs=1e-5)
    back = load_model(tmp_path / "pr")
    assert PruneMasks.from_zeros(back).sparsity() == pytest.approx(0.5, abs=1e-5)
    nz, total = nonzero_parameters(back)
    assert report["after"]["nonzero_parameters"] == nz < report["before"]["nonzero_parameters"]
    assert "accuracy" in report["after"]["metrics"] and report["after"]["examples_per_s"] > 0

    for bad, msg in ((["--sparsity", "1.5"], "argument --sparsity: must be less than 1 (got '1.5')"),
                     (["--sparsity", "0.5", "--steps", "3"], "--train")):
        code = exit_code(["compress", "prune", "--checkpoint", str(tmp_path / "ft"), *bad,
                          "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error:") and msg in err and "Traceback" not in err
    with pytest.raises(LmlabError, match="structure"):
        prune_model(model, 0.5, structure="blocks")


def test_an_int8_checkpoint_and_train_without_steps_are_refused_before_loading(tmp_path, capsys, monkeypatch):
    """prune on an int8 checkpoint said 'no weight matrix matched the include/exclude patterns'
    (options prune does not have); quantize said 'already quantized' after loading it; `--train`
    without `--steps` did nothing. One refusal for int8 (lmlab.models.refuse_int8, export's), before
    any weight is read; --train alone is refused."""
    import lmlab.loading
    from lmlab.adapt.quantize import quantize_model, save_quantized

    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=300), heads=("seq_cls",)).eval()
    model.save(tmp_path / "float")
    quantize_model(model)
    save_quantized(model, tmp_path / "q")
    with pytest.raises(LmlabError, match="int8 weights"):
        prune_model(model, 0.5)                                     # the Python API says so too
    monkeypatch.setattr(lmlab.loading, "load_model",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights read")))
    for cmd in (["prune", "--sparsity", "0.5"], ["quantize"]):
        code = exit_code(["compress", *cmd, "--checkpoint", str(tmp_path / "q"),
                          "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"error: {tmp_path / 'q'} holds int8 weights")
        assert err.count("\n") == 1
        assert f"lmlab compress {cmd[0]}" in err
    code = exit_code(["compress", "prune", "--sparsity", "0.5", "--train", "tr.tsv",
                      "--checkpoint", str(tmp_path / "float"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --train applies only with --steps N above 0")
    assert "--steps" in err
    assert not (tmp_path / "x").exists()
