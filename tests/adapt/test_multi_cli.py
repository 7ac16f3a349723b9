"""`lmlab generate --variant ... --prompts` and `lmlab evaluate --variant ...`: one batched pass,
the same outputs as each variant alone."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.adapt.peft_io import load_peft_model, save_peft
from lmlab.cli import main
from lmlab.generate import generate
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset
from tests.adapt.test_multi import tuned


def run(capsys, *args):
    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture(scope="module")
def gpt(tmp_path_factory, shakespeare):
    """A gpt2-tiny base with a byte-level tokenizer and two tuned variants of it."""
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", [shakespeare[:20000]], vocab_size=300)
    root = tmp_path_factory.mktemp("multi-cli")
    torch.manual_seed(0)
    cfg = get_preset("gpt2-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id)
    build_model(cfg).save(root / "base", tokenizer=tok)
    dirs = {}
    for i, (name, method, options) in enumerate([("lora", "lora", {"rank": 4}),
                                                 ("prompt", "prompt", {"num_virtual_tokens": 3})]):
        model = tuned(load_model(root / "base"), method, options, seed=i, std=0.5)
        dirs[name] = save_peft(model, root / name)
    return root, dirs, tok


def test_generate_variants_prints_each_rows_own_greedy_continuation(gpt, tmp_path, capsys):
    root, dirs, tok = gpt
    rows = [{"variant": "lora", "prompt": "ROMEO:"}, {"variant": "prompt", "prompt": "To be, or"},
            {"variant": "plain", "prompt": "KING"}, {"variant": "lora", "prompt": "First Citizen: we"}]
    prompts = tmp_path / "rows.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run(capsys, "generate", "--checkpoint", root / "base",
                         "--variant", f"lora={dirs['lora']}", "--variant", f"prompt={dirs['prompt']}",
                         "--variant", "plain", "--prompts", prompts, "--temperature", 0,
                         "--max-new-tokens", 6)
    assert code == 0, err
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(p["row"], p["variant"]) for p in printed] == [(i, r["variant"]) for i, r in enumerate(rows)]
    base = load_model(root / "base")
    for p, r in zip(printed, rows):
        model = base if r["variant"] == "plain" else load_peft_model(load_model(root / "base"),
                                                                     dirs[r["variant"]])
        ids = tok.encode(r["prompt"])
        ref = generate(model, torch.tensor([ids]), max_new_tokens=6, eos_token_id=tok.eos_id)[0, len(ids):]
        ref = ref.tolist()
        if tok.eos_id in ref:
            ref = ref[: ref.index(tok.eos_id)]
        assert p["text"] == tok.decode(ref, skip_special_tokens=True)
    assert len({p["text"] for p in printed}) > 2  # the variants differ


@pytest.mark.parametrize("args,message", [
    (["--variant", "x=/nonexistent"], "--variant applies only with --prompts"),
    (["--variant", "=d", "--prompts", "p.jsonl"], "is not NAME=DIR"),
    (["--variant", "a", "--variant", "a", "--prompts", "p.jsonl"], "named twice"),
    (["--variant", "a=/nonexistent", "--prompts", "p.jsonl"], "holds no lmlab adapter"),
    (["--variant", "a", "--prompts", "ROWS"], "unknown variant 'lora'"),
    (["--variant", "a", "--prompts", "ROWS", "--prompt", "x"], "--prompt cannot be combined with --variant"),
])
def test_generate_variant_errors_are_one_line(gpt, tmp_path, capsys, args, message):
    root, _, _ = gpt
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"variant": "lora", "prompt": "x"}) + "\n")
    args = [str(rows) if a == "ROWS" else a for a in args]
    code, _, err = run(capsys, "generate", "--checkpoint", root / "base", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def sst2_variants(tmp_path_factory, minilm_dir, data_dir):
    """A tiny BERT base (real WordPiece vocabulary) and two variants fine-tuned on SST-2 through
    `lmlab finetune` (a few steps: the point is identity, not accuracy)."""
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("sst2-variants")
    bert = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",))
    bert.save(root / "bert", tokenizer=tok)
    sst2 = data_dir / "glue" / "sst2"
    out = {}
    for method, option in (("lora", "rank=4"), ("prompt", "num_virtual_tokens=4")):
        out[method] = root / method
        code = main(["finetune", "--checkpoint", str(root / "bert"), "--task", "sst2", "--train",
                     str(sst2 / "train.tsv"), "--dev", str(sst2 / "dev.tsv"), "--out", str(out[method]),
                     "--method", method, "--method-option", option, "--max-steps", "3", "--batch-size", "8",
                     "--max-train-examples", "48", "--max-eval-examples", "16", "--max-length", "32",
                     "--lr", "1e-2", "--threads", "1", "--no-progress"])
        assert code in (0, None)
    return root / "bert", out, sst2 / "dev.tsv"


def test_evaluate_variants_in_one_pass_equals_each_alone(sst2_variants, tmp_path, capsys):
    base, dirs, dev = sst2_variants
    code, out, err = run(capsys, "evaluate", "--checkpoint", base, "--variant", f"l={dirs['lora']}",
                         "--variant", f"p={dirs['prompt']}", "--data", dev, "--max-examples", 48,
                         "--batch-size", 16, "--predictions", tmp_path / "both.jsonl")
    assert code == 0, err
    metrics, err_all = json.loads(out), err
    summary = [line for line in err.splitlines() if line.startswith("evaluated ")][-1]  # issue 27, on stderr
    assert summary.startswith("evaluated 2 variant(s) in ") and summary.split(": ", 1)[1].startswith(
        f"l accuracy {metrics['l']['accuracy']:.4f}; p accuracy {metrics['p']['accuracy']:.4f}; baseline (")
    both = [json.loads(line) for line in (tmp_path / "both.jsonl").read_text().splitlines()]
    for name, method in (("l", "lora"), ("p", "prompt")):
        code, out, err = run(capsys, "evaluate", "--checkpoint", dirs[method], "--data", dev,
                             "--max-examples", 48, "--predictions", tmp_path / f"{name}.jsonl")
        assert code == 0, err
        alone = json.loads(out)
        baseline = alone.pop("baseline")  # probe10b #4: the same baseline, said beside every variant's score
        assert metrics[name] == alone
        said = f"; baseline ({baseline['answer']}, no model): accuracy {baseline['metrics']['accuracy']:.4f}"
        assert said in summary
        assert (f"warning: variant {name}: accuracy" in err_all) == baseline["at_baseline"]
        alone = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        mine = [{k: r[k] for k in ("where", "prediction", "label")} for r in both if r["variant"] == name]
        assert mine == alone
    assert len(both) == 96


def test_evaluate_variant_errors_are_one_line(sst2_variants, capsys):
    base, dirs, dev = sst2_variants
    code, _, err = run(capsys, "evaluate", "--checkpoint", base, "--variant", "b", "--data", dev)
    assert code == 2 and "has no fine-tuned task to score" in err
    code, _, err = run(capsys, "evaluate", "--checkpoint", base, "--variant", f"l={dirs['lora']}",
                       "--data", dev, "--task", "rte")
    assert code == 2 and "not 'rte'" in err


def test_evaluate_variants_never_overwrite_a_file_that_is_not_predictions(sst2_variants, tmp_path, capsys):
    base, dirs, dev = sst2_variants
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    data = tmp_path / "dev.tsv"
    data.write_bytes(dev.read_bytes())
    for target, message in ((notes, "was not written by lmlab"), (data, "would replace the input")):
        code, out, err = run(capsys, "evaluate", "--checkpoint", base, "--variant", f"l={dirs['lora']}",
                             "--data", data, "--max-examples", 8, "--predictions", target)
        assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert notes.read_text() == "my notes\n" and data.read_bytes() == dev.read_bytes()
