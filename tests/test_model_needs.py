"""What a command needs of a model, told from the checkpoint's config before any weight is read:
the head it reads (lmlab.models.heads.require_head) and the input length it may use
(lmlab.models.config.max_length_for). The checkpoints here have their weights file removed, so a
command that opened the weights before checking would fail on that instead."""

from __future__ import annotations

import json

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError


def _save(path, preset: str, heads, **changes):
    import torch

    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer("bytelevel", ["to be or not to be, that is the question\n" * 40], vocab_size=280)
    model = build_model(get_preset(preset, vocab_size=tok.vocab_size, **changes), heads=heads)
    model.save(path, tokenizer=tok)
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A GPT-2 fine-tuned as a classifier (first head ``cls``, as `lmlab finetune` leaves it), a BERT
    classifier, and a GPT-2 language model; none with its weights; and the files the commands read."""
    root = tmp_path_factory.mktemp("needs")
    dirs = {"gpt_cls": _save(root / "gpt_cls", "gpt2-tiny", ("cls", "lm")),
            "bert_cls": _save(root / "bert_cls", "bert-tiny", ("seq_cls",)),
            "gpt_lm": _save(root / "gpt_lm", "gpt2-tiny", None, max_positions=64)}
    for d in dirs.values():
        (d / "model.safetensors").unlink()  # nothing below may read it
    pair = {"prompt": "to be", "chosen": " or not", "rejected": " the question"}
    (root / "prefs.jsonl").write_text(json.dumps(pair) + "\n", encoding="utf-8")
    (root / "tr.tsv").write_text("sentence\tlabel\nto be\t1\nnot to be\t0\n", encoding="utf-8")
    (root / "task.yaml").write_text("task: lmlab_needs\ndataset_path: json\ntest_split: test\n"
                                    "output_type: loglikelihood\ndoc_to_text: 'a'\ndoc_to_target: 'b'\n",
                                    encoding="utf-8")
    return root, dirs


def _one_line(capsys, *parts: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


COMMANDS = {  # command -> (arguments after --checkpoint CK, what the line says)
    "generate": (["--prompt", "to"], "generating text needs a model whose first head is the language-model"),
    "align dpo": (["--method", "dpo", "--train", "{root}/prefs.jsonl", "--dev", "{root}/prefs.jsonl",
                   "--out", "{root}/al", "--max-steps", "1"], "preference tuning (lmlab align) needs"),
    "align rlhf": (["--method", "rlhf", "--train", "{root}/prefs.jsonl", "--dev", "{root}/prefs.jsonl",
                    "--out", "{root}/al", "--max-steps", "1"], "preference tuning (lmlab align) needs"),
    "probe fill-mask": (["--text", "to [MASK]"], "fill-mask needs a model whose first head is the language"),
    "evaluate --harness": (["--harness", "{root}/task.yaml", "--out", "{root}/h.json"],
                           "lmlab evaluate --harness needs a model whose first head is the language-model"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_classifier_checkpoint_is_refused_before_its_weights_are_read(made, capsys, command):
    root, dirs = made
    rest, says = COMMANDS[command]
    words = command.split()[:2] if command.startswith("probe") else command.split()[:1]
    argv = [*words, "--checkpoint", str(dirs["gpt_cls"]), *(a.format(root=root) for a in rest)]
    assert main(argv) == 2
    _one_line(capsys, says, "first head is 'cls' (a fine-tuned classifier)")
    assert not (root / "al").exists()


def test_fill_mask_needs_the_mlm_head_of_an_encoder(made, capsys):
    _, dirs = made
    assert main(["probe", "fill-mask", "--checkpoint", str(dirs["bert_cls"]), "--text", "to [MASK]"]) == 2
    _one_line(capsys, "fill-mask needs a model with the MLM head ('mlm')", "no MLM head (its heads: seq_cls)",
              "(a fine-tuned classifier)", "pretrained with the mlm objective")


def test_the_check_reads_a_model_in_memory_as_it_reads_a_directory():
    from lmlab.generate.search import check_can_generate
    from lmlab.loading import model_facts
    from lmlab.models import build_model, get_preset
    from lmlab.models.heads import require_head

    clf = build_model(get_preset("gpt2-tiny"), heads=("cls", "lm"))
    assert model_facts(clf).heads == ("cls", "lm")
    with pytest.raises(LmlabError, match="first head is 'cls'"):
        check_can_generate(clf)
    require_head(clf, "lm", "x", "y", first=False)  # present: enough for a command that calls it by name
    with pytest.raises(LmlabError, match="no language-model head \\(no heads at all"):
        require_head(build_model(get_preset("gpt2-tiny"), heads=()), "lm", "x", "y")


@pytest.mark.parametrize("preset, heads", [("bert-tiny", ("seq_cls",)), ("t5-tiny", None),
                                          ("bart-tiny", None)])
def test_every_converter_tells_the_facts_from_the_config(tmp_path, preset, heads):
    from lmlab.interop import hf_export
    from lmlab.loading import model_facts
    from lmlab.models import build_model, get_preset

    model = build_model(get_preset(preset), heads=heads)
    hf_export(model, tmp_path / "hf")
    facts = model_facts(tmp_path / "hf")
    assert (facts.architecture, facts.family, facts.heads) == (model.architecture, preset.split("-")[0],
                                                              model.head_names)
    assert facts.config.max_positions == model.config.max_positions


def test_a_hugging_face_directory_is_told_from_its_config_alone(tmp_path, capsys):
    from lmlab.interop import hf_export
    from lmlab.loading import model_facts
    from lmlab.models import build_model, get_preset

    hf_export(build_model(get_preset("gpt2-tiny"), heads=("cls",)), tmp_path / "hf")  # a sequence classifier
    (tmp_path / "hf" / "model.safetensors").unlink()
    facts = model_facts(tmp_path / "hf")
    assert (facts.architecture, facts.family, facts.heads, facts.config.max_positions) == (
        "decoder", "gpt2", ("cls",), 1024)
    assert main(["generate", "--checkpoint", str(tmp_path / "hf"), "--prompt", "to"]) == 2
    _one_line(capsys, "first head is 'cls' (a fine-tuned classifier)")


# --------------------------------------------------------------------------- --max-length

LENGTH_COMMANDS = {
    "finetune": ["finetune", "--task", "sst2", "--train", "{root}/tr.tsv", "--dev", "{root}/tr.tsv",
                 "--out", "{root}/ft", "--max-steps", "1"],
    "align": ["align", "--train", "{root}/prefs.jsonl", "--dev", "{root}/prefs.jsonl", "--out", "{root}/al",
              "--max-steps", "1"],
}


@pytest.mark.parametrize("command", list(LENGTH_COMMANDS))
@pytest.mark.parametrize("length", ["65", "100000000"])
def test_a_max_length_beyond_the_positions_is_refused_before_any_work(made, capsys, command, length):
    root, dirs = made
    argv = [a.format(root=root) for a in LENGTH_COMMANDS[command]]
    assert main([*argv, "--checkpoint", str(dirs["gpt_lm"]), "--max-length", length]) == 2
    _one_line(capsys, f"--max-length {length} exceeds the model's 64 positions; use --max-length 64 or less")
    assert not (root / "ft").exists() and not (root / "al").exists()


def test_what_bounds_an_input_and_what_does_not():
    from lmlab.models import get_preset
    from lmlab.models.config import max_length_for, position_limit

    gpt = get_preset("gpt2-tiny", max_positions=64)
    assert position_limit(gpt) == 64
    assert max_length_for(gpt, 64, 128) == 64
    assert max_length_for(gpt, None, 128) == 64  # a default is cut down to the positions
    assert max_length_for(gpt, None, 32) == 32
    roberta = get_preset("roberta-tiny")  # its positions start after the padding id
    assert position_limit(roberta) == roberta.max_positions - roberta.pad_token_id - 1
    t5 = get_preset("t5-tiny")  # relative positions: nothing bounds the input
    assert position_limit(t5) is None and max_length_for(t5, 100_000, 128) == 100_000
    assert position_limit(get_preset("llama-tiny")) is None  # rotary
    with pytest.raises(LmlabError, match="--max-length 65 exceeds the model's 64 positions"):
        max_length_for(gpt, 65, 128)


def test_finetune_cuts_the_tasks_default_length_down_to_the_positions():
    from lmlab.config.finetune import FinetuneConfig
    from lmlab.finetune.loop import task_for_model
    from lmlab.models import build_model, get_preset

    model = build_model(get_preset("gpt2-tiny", max_positions=64))
    assert task_for_model("sst2", model, FinetuneConfig()).options.max_length == 64  # default 128
    assert task_for_model("sst2", model, FinetuneConfig(max_length=32)).options.max_length == 32
