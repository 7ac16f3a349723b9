"""A LoRA fine-tune whose task grew the vocabulary (GPT-style decoder classification adds
[START]/[DELIM]/[EXTRACT]: three new, frozen embedding rows) still goes with its own base:
`lmlab finetune --method lora` keeps the grown base in OUT/base/, and `lmlab export --format peft
--base RUN` and `lmlab evaluate --checkpoint RUN --variant NAME=OUT` put the adapter on it
(lmlab.adapt.peft_io.base_for_adapter); a run folder is accepted for --base as for --checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from lmlab.adapt.peft_io import load_peft_model
from lmlab.cli import main
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset

SENTENCES = [("a gripping , beautiful film", 1), ("dull and lifeless", 0), ("a warm , funny story", 1),
             ("the plot makes no sense", 0), ("wonderful acting all round", 1), ("a tedious mess", 0)]


def write_run(root, tok, seed):
    """What `lmlab pretrain --out RUN` leaves: RUN/checkpoints/step_4 (a tiny GPT-2)."""
    torch.manual_seed(seed)
    cfg = get_preset("gpt2-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id)
    step = root / "checkpoints" / "step_4"
    build_model(cfg).save(step, tokenizer=tok)
    (step / "train_state.json").write_text("{}")
    save_file({"rng.torch": torch.zeros(1)}, step / "train_state.safetensors")
    return step


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, shakespeare):
    from lmlab.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("grown")
    tok = train_tokenizer("bytelevel", [shakespeare[:20000]], vocab_size=300)
    step = write_run(root / "run", tok, seed=0)
    data = root / "sst2.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in SENTENCES))
    out = root / "ft"
    assert main(["finetune", "--checkpoint", str(root / "run"), "--task", "sst2", "--train", str(data),
                 "--dev", str(data), "--out", str(out), "--max-steps", "2", "--method", "lora",
                 "--method-option", "rank=4", "--lr", "1e-2", "--no-progress"]) == 0
    return root, step, data, out, tok


def test_the_lora_output_keeps_its_grown_base_and_still_serves_the_merged_model(tuned):
    root, step, data, out, tok = tuned
    grown = json.loads((out / "base" / "config.json").read_text())["config"]
    assert grown["vocab_size"] == tok.vocab_size + 3  # [START] [DELIM] [EXTRACT]
    merged, adapted = load_model(out), load_peft_model(step, out / "adapter")
    assert not hasattr(merged, "peft") and adapted.peft["method"] == "lora"  # the top level is the merged one
    ids = torch.tensor([[5, 17, 42, 9, tok.vocab_size + 2]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-5)


def test_peft_export_and_variant_evaluation_work_from_the_original_run(tuned, tmp_path, capsys):
    root, step, data, out, tok = tuned
    assert main(["export", "--checkpoint", str(out), "--format", "peft", "--base", str(root / "run"),
                 "--out", str(tmp_path / "pe")]) == 0
    cap = capsys.readouterr()
    assert "using its newest checkpoint" in cap.err
    hf_config = json.loads((tmp_path / "pe" / "base" / "config.json").read_text())
    assert hf_config["vocab_size"] == tok.vocab_size + 3
    assert json.loads((tmp_path / "pe" / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    # the frozen auxiliary LM head stays out of the base: a GPT2ForSequenceClassification
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "pe" / "base")
    ids = torch.tensor([[5, 17, 42, 9, tok.vocab_size + 2]])  # ends with [EXTRACT], the cls head's token
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "pe").eval()(input_ids=ids).logits
        assert torch.allclose(theirs, load_peft_model(step, out / "adapter")(ids).logits, atol=1e-5)
    assert main(["evaluate", "--checkpoint", str(out), "--data", str(data)]) == 0
    alone = json.loads(capsys.readouterr().out)
    alone.pop("baseline")  # one checkpoint's scores carry their trivial baseline; the variants' map does not
    assert main(["evaluate", "--checkpoint", str(root / "run"), "--variant", f"a={out}",
                 "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out) == {"a": alone}


def test_another_base_is_still_refused(tuned, tmp_path, capsys):
    root, step, data, out, tok = tuned
    write_run(tmp_path / "other", tok, seed=1)
    assert main(["export", "--checkpoint", str(out), "--format", "peft", "--base", str(tmp_path / "other"),
                 "--out", str(tmp_path / "pe")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "was trained on another base model" in err[-1]
    assert not (tmp_path / "pe").exists()
    # the fine-tune's own top level is the merged model: an adapter on it would count twice
    assert main(["export", "--checkpoint", str(out), "--format", "peft", "--base", str(out),
                 "--out", str(tmp_path / "pe")]) == 2
    assert "is a LoRA fine-tune with its update merged in" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", str(out), "--variant", f"a={out}", "--data", str(data)]) == 2
    assert "is a LoRA fine-tune with its update merged in" in capsys.readouterr().err


def test_export_and_variant_refuse_the_same_bases(tuned, tmp_path, capsys):
    """`export --format peft --base X` checked only the shapes (and the grown rows), so a base of the
    same size with other weights (another fine-tune of the run) was exported as the adapter's base,
    while `evaluate --variant` refused it by fingerprint. One check now (peft_io.check_same_base,
    called by base_for_adapter): both refuse it, naming the fingerprints."""
    root, step, data, out, tok = tuned
    other = load_model(out / "base")                      # the adapter's own (grown) base, retouched
    with torch.no_grad():
        other.final_norm.weight.add_(0.5)
    other.save(tmp_path / "other", tokenizer=tok)
    runs = {"export": ["export", "--checkpoint", str(out), "--format", "peft", "--base",
                       str(tmp_path / "other"), "--out", str(tmp_path / "pe")],
            "variant": ["evaluate", "--checkpoint", str(tmp_path / "other"), "--variant", f"a={out}",
                        "--data", str(data)]}
    for argv in runs.values():
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("error: ") and "was trained on another base model (fingerprint" in err, err
    assert not (tmp_path / "pe").exists()
