"""Instruction tuning end to end: a tiny decoder learns to follow held-out instructions, through the
fine-tuning loop (train/engine.py), the CLI and `lmlab generate --instruction`."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmlab.cli import main
from lmlab.finetune import load_finetuned
from lmlab.models import build_model, get_preset, save_checkpoint
from lmlab.tasks import make_task
from lmlab.tokenizers import train_tokenizer

WORDS = "red green blue cat dog sun moon tree fish bird rock star".split()
RULES = {"Repeat the words.": lambda w: w, "Reverse the order of the words.": lambda w: w[::-1],
         "Write the words in capital letters.": lambda w: [x.upper() for x in w]}
TEMPLATE = "Task: {instruction}\n\nWords: {input}\n\nAnswer:\n"


def records(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    out = []
    for _ in range(n):
        rule = r.choice(list(RULES))
        words = r.sample(WORDS, r.randint(2, 3))
        out.append({"instruction": rule, "input": " ".join(words), "output": " ".join(RULES[rule](words))})
    return out


def write(path, recs):
    path.write_text("".join(json.dumps(x) + "\n" for x in recs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("instruct")
    seen = {(r["instruction"], r["input"]) for r in records(400, 0)}
    held_out = [r for r in records(40, 1) if (r["instruction"], r["input"]) not in seen][:24]
    train, dev = write(d / "train.jsonl", records(400, 0)), write(d / "dev.jsonl", held_out)
    tok = train_tokenizer("bytelevel", [json.dumps(records(200, 5))] * 3 + [TEMPLATE] * 50, vocab_size=400)
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size), heads=("lm",))
    ckpt = save_checkpoint(model, d / "base", tokenizer=tok)
    (d / "template.txt").write_text(TEMPLATE, encoding="utf-8")
    return d, ckpt, train, dev


def test_tiny_decoder_learns_held_out_instances_via_the_cli(setup, capsys):
    d, ckpt, train, dev = setup
    out = d / "ft"
    rc = main(["finetune", "--checkpoint", str(ckpt), "--task", "instruct", "--train", str(train),
               "--dev", str(dev), "--out", str(out), "--template", str(d / "template.txt"), "--epochs", "4",
               "--batch-size", "8", "--lr", "3e-3", "--max-length", "96", "--max-target-length", "12",
               "--no-progress"])
    assert rc == 0
    model, task = load_finetuned(out)
    assert task.name == "instruct" and task.template == TEMPLATE and task.packing
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["steps"] < 400 / 8 * 4            # packed: fewer rows than examples
    base = make_task("instruct", "decoder", template=TEMPLATE, max_length=96, max_target_length=12)
    from lmlab.loading import load_model

    before_model = load_model(ckpt)
    examples = base.read(dev)
    before = base.evaluate(base.prepare_model(before_model), examples)
    after = task.evaluate(model, examples)
    assert after["loss"] < before["loss"] - 2.0          # held-out instances, unseen inputs
    assert after["rougeL"] > before["rougeL"] + 0.05
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--instruction", "Repeat the words.",
                 "--prompt", "cat dog", "--temperature", "0", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.strip()
    from types import SimpleNamespace

    from lmlab.cli.generate import _instruction_ids

    tok = model.tokenizer
    args = SimpleNamespace(checkpoint=str(out), instruction="Repeat the words.", prompt="cat dog")
    want = [tok.bos_id] + tok.encode("Task: Repeat the words.\n\nWords: cat dog\n\nAnswer:\n")
    assert _instruction_ids(args, tok, tok.eos_id, False) == want      # the stored template, as trained
    one = write(d / "one.jsonl", [{"instruction": "Repeat the words.", "input": "cat dog", "output": "x"}])
    assert want == task.prompt_ids(task.read(one)[0], tok)
    rc = main(["evaluate", "--checkpoint", str(out), "--data", str(dev), "--max-examples", "4"])
    assert rc == 0 and "exact_match" in capsys.readouterr().out


def test_instruct_flags_are_checked(setup, capsys):
    d, ckpt, train, dev = setup
    bad = d / "bad_template.txt"
    bad.write_text("no placeholder here\n", encoding="utf-8")
    args = ["finetune", "--checkpoint", str(ckpt), "--task", "instruct", "--train", str(train),
            "--dev", str(dev), "--out", str(d / "never")]
    assert main(args + ["--template", str(bad)]) == 2
    assert "no {instruction} placeholder" in capsys.readouterr().err
    args[4] = "sst2"
    assert main(args + ["--no-packing"]) == 2
    assert "--packing/--no-packing applies only with --task instruct" in capsys.readouterr().err
    args[4] = "instruct"
    assert main(args + ["--method", "prefix", "--no-progress"]) == 2
    assert "packed rows cannot take a prefix" in capsys.readouterr().err
    assert not (d / "never").exists()
