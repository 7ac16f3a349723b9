"""Saving only the method's weights (+ task head) and reloading them on the base checkpoint gives
identical predictions; `lmlab finetune --method ...` writes directories that reload the same."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from lmlab.adapt import apply_method
from lmlab.adapt.peft_io import CONFIG_NAME, OLD_NAMES, WEIGHTS_NAME, load_peft, load_peft_model, save_peft
from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset

V = 300
METHODS = [
    ("lora", {"rank": 4, "target_modules": ["all-linear"], "dropout": 0.1}),
    ("adapter", {"kind": "houlsby", "bottleneck": 8}),
    ("adapter", {"kind": "pfeiffer"}),
    ("prefix", {"num_virtual_tokens": 4, "reparameterize": True, "hidden": 16}),
    ("prompt", {"num_virtual_tokens": 4}),
]


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory):
    """A "pretrained" bert-tiny with an MLM head (the task head does not exist yet)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base") / "bert"
    build_model(get_preset("bert-tiny", vocab_size=V), heads=("mlm",)).save(path)
    return path


def task_model(base_checkpoint, seed: int = 1):
    """The base body with a fresh seq_cls head (what fine-tuning starts from)."""
    base = load_model(base_checkpoint)
    torch.manual_seed(seed)
    model = build_model(base.config.replace(num_labels=3), heads=("seq_cls",))
    state = {k: v for k, v in base.state_dict().items() if k in model.state_dict()}
    model.load_state_dict(state, strict=False)
    return model


def batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, V, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[2, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def train_a_little(model, steps: int = 3):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    model.train()
    for _ in range(steps):
        head_loss(model.head_names[0], model(**batch()).logits, torch.tensor([0, 1, 2, 1])).backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.mark.parametrize("method,options", METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_reload_on_the_base_checkpoint_gives_identical_predictions(
    base_checkpoint, tmp_path, method, options
):
    model = train_a_little(apply_method_to(task_model(base_checkpoint), method, options))
    with torch.no_grad():
        expected = model(**batch()).logits
    save_peft(model, tmp_path / "peft", base_model=str(base_checkpoint))
    cfg = json.loads((tmp_path / "peft" / CONFIG_NAME).read_text())
    assert cfg["method"] == method and cfg["heads"] == ["seq_cls"]
    with safe_open(str(tmp_path / "peft" / WEIGHTS_NAME), framework="pt") as f:
        saved = set(f.keys())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert saved == trainable and cfg["trainable_parameters"] < cfg["total_parameters"] / 2
    assert not any(n.startswith(("embeddings.", "layers.0.attn.q_proj.weight")) for n in saved)

    reloaded = load_peft_model(base_checkpoint, tmp_path / "peft")
    with torch.no_grad():
        got = reloaded(**batch()).logits
    assert torch.equal(got, expected)


def test_own_files_do_not_take_peft_names_and_old_folders_still_load(base_checkpoint, tmp_path):
    model = train_a_little(apply_method_to(task_model(base_checkpoint), "prompt", {"num_virtual_tokens": 2}))
    with torch.no_grad():
        expected = model(**batch()).logits
    save_peft(model, tmp_path / "peft")
    written = sorted(f.name for f in (tmp_path / "peft").iterdir() if f.name != ".lmlab-manifest.json")
    assert written == sorted((CONFIG_NAME, WEIGHTS_NAME))
    assert not {"adapter_config.json", "adapter_model.safetensors"} & {CONFIG_NAME, WEIGHTS_NAME}
    for new, old in zip((CONFIG_NAME, WEIGHTS_NAME), OLD_NAMES):  # a folder saved by an older lmlab
        (tmp_path / "peft" / new).rename(tmp_path / "peft" / old)
    with torch.no_grad():
        assert torch.equal(load_peft_model(base_checkpoint, tmp_path / "peft")(**batch()).logits, expected)
    (tmp_path / "peft" / OLD_NAMES[0]).write_text('{"peft_type": "LORA"}')  # what the peft library writes
    with pytest.raises(LmlabError, match="not lmlab's"):
        load_peft_model(base_checkpoint, tmp_path / "peft")


def apply_method_to(model, method, options):
    apply_method(model, method, options)
    return model


def test_wrong_base_or_missing_files_are_one_line_errors(base_checkpoint, tmp_path):
    model = train_a_little(apply_method_to(task_model(base_checkpoint), "lora", {"rank": 2}))
    save_peft(model, tmp_path / "peft")
    other = build_model(get_preset("bert-tiny", vocab_size=V, d_model=32, n_heads=2), heads=("seq_cls",))
    with pytest.raises(LmlabError, match="d_model"):
        load_peft(other, tmp_path / "peft")
    with pytest.raises(LmlabError, match="heads"):
        load_peft(build_model(get_preset("bert-tiny", vocab_size=V), heads=("token_cls",)), tmp_path / "peft")
    with pytest.raises(LmlabError, match="no lmlab adapter"):
        load_peft_model(base_checkpoint, tmp_path)
    (tmp_path / "peft" / WEIGHTS_NAME).write_bytes(b"garbage")
    with pytest.raises(LmlabError, match="corrupt"):
        load_peft_model(base_checkpoint, tmp_path / "peft")
    with pytest.raises(LmlabError, match="no parameter-efficient method"):
        save_peft(task_model(base_checkpoint), tmp_path / "x")


@pytest.fixture(scope="module")
def sst2_checkpoint(tmp_path_factory, minilm_dir):
    """A tiny BERT body with the real BERT WordPiece vocabulary (from the MiniLM package)."""
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("sst2") / "bert"
    build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",)).save(path, tokenizer=tok)
    return path


@pytest.mark.parametrize("method,option", [("lora", "rank=4"), ("prefix", "num_virtual_tokens=4")])
def test_lmlab_finetune_with_a_peft_method(sst2_checkpoint, data_dir, tmp_path, method, option):
    """The CLI trains only the method (+ head) and the output reloads with the same dev metrics."""
    from lmlab.cli import main
    from lmlab.finetune import evaluate, load_finetuned

    sst2 = data_dir / "glue" / "sst2"
    out = tmp_path / "ft"
    code = main(
        [
            "finetune",
            "--checkpoint",
            str(sst2_checkpoint),
            "--task",
            "sst2",
            "--train",
            str(sst2 / "train.tsv"),
            "--dev",
            str(sst2 / "dev.tsv"),
            "--out",
            str(out),
            "--method",
            method,
            "--method-option",
            option,
            "--max-steps",
            "3",
            "--batch-size",
            "8",
            "--max-train-examples",
            "48",
            "--max-eval-examples",
            "32",
            "--max-length",
            "32",
            "--lr",
            "1e-2",
            "--threads",
            "1",
            "--no-progress",
        ]
    )
    assert code in (0, None)
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["method"] == method and summary["trainable_parameters"] < summary["total_parameters"] / 4
    assert (out / "adapter" / CONFIG_NAME).is_file()
    model, _ = load_finetuned(out)
    if method == "lora":
        assert not hasattr(model, "peft")  # the merged model, an ordinary checkpoint
    else:
        assert model.peft["method"] == method
    metrics = evaluate(out, sst2 / "dev.tsv", max_examples=32)
    assert metrics == json.loads((out / "eval.json").read_text())
    # the contract: `--out` is load_model-able for every method, with identical predictions
    plain = load_model(out)
    ids = torch.tensor([model.tokenizer.encode("a gorgeous , witty film", add_special_tokens=True)])
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
