"""A LoRA fine-tune exported as a PEFT folder loads in ``peft`` itself (on lmlab's Hugging Face
export of the base) and computes lmlab's logits."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from peft import PeftModel

from lmlab.adapt import apply_method
from lmlab.adapt.peft_export import export_peft_lora
from lmlab.errors import LmlabError
from lmlab.interop import hf_export
from lmlab.models import build_model, get_preset

CASES = [
    ("bert-tiny", ("seq_cls",), "BertForSequenceClassification", {"num_labels": 3}),
    ("llama-tiny", ("lm",), "LlamaForCausalLM", {}),
    ("t5-tiny", None, "T5ForConditionalGeneration", {}),
    ("bart-tiny", None, "BartForConditionalGeneration", {}),
]


@pytest.mark.parametrize("preset, heads, hf_class, extra", CASES)
def test_peft_loads_the_export_and_computes_lmlabs_logits(tmp_path, preset, heads, hf_class, extra):
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=300, **extra), heads=heads).eval()
    hf_export(model, tmp_path / "base")  # the base, before LoRA
    apply_method(model, "lora", {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]})
    with torch.no_grad():  # a trained-looking update and head (B starts at zero)
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    export_peft_lora(model, tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0

    base = getattr(transformers, hf_class).from_pretrained(tmp_path / "base").eval()
    peft_model = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids}
    if preset.startswith(("t5", "bart")):
        gen = torch.Generator().manual_seed(2)
        kwargs["decoder_input_ids"] = torch.randint(5, 300, (2, 5), generator=gen)
    with torch.no_grad():
        ours, theirs = model(**kwargs).logits, peft_model(**kwargs).logits
        with peft_model.disable_adapter():  # peft wraps the base in place: this is the base alone
            plain = peft_model(**kwargs).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain, ours, atol=1e-3)  # the adapter is really applied (the test can fail)


def test_fused_targets_are_refused(tmp_path):
    model = build_model(get_preset("gpt2-tiny", vocab_size=300))
    apply_method(model, "lora", {"rank": 2})
    with pytest.raises(LmlabError, match="fused or transposed"):
        export_peft_lora(model, tmp_path / "peft")
    assert not (tmp_path / "peft").exists()
    with pytest.raises(LmlabError, match="LoRA"):
        export_peft_lora(build_model(get_preset("bert-tiny", vocab_size=300)), tmp_path / "peft")


def test_cli_exports_a_lora_finetune_that_peft_serves(tmp_path, minilm_dir, data_dir):
    from lmlab.cli import main
    from lmlab.loading import load_model
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",)).save(tmp_path / "bert",
                                                                                       tokenizer=tok)
    sst2 = data_dir / "glue" / "sst2"
    assert main(["finetune", "--checkpoint", str(tmp_path / "bert"), "--task", "sst2", "--train",
                 str(sst2 / "train.tsv"), "--dev", str(sst2 / "dev.tsv"), "--out", str(tmp_path / "ft"),
                 "--method", "lora", "--method-option", "rank=4", "--max-steps", "4", "--batch-size", "8",
                 "--max-train-examples", "32", "--max-eval-examples", "16", "--lr", "1e-2", "--threads", "1",
                 "--no-progress"]) in (0, None)
    assert main(["export", "--checkpoint", str(tmp_path / "ft"), "--format", "peft", "--out",
                 str(tmp_path / "peft")]) == 2  # --base is required
    for _ in range(2):  # a second export replaces the first (an earlier output of the same kind)
        assert main(["export", "--checkpoint", str(tmp_path / "ft"), "--base", str(tmp_path / "bert"),
                     "--format", "peft", "--out", str(tmp_path / "peft")]) == 0
    base = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "peft" / "base")
    served = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    ours = load_model(tmp_path / "ft").eval()  # lmlab's own output: the merged model
    enc = tok.encode_batch(["a gripping , funny film", "dull and far too long"], padding=True)
    ids, mask = torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"])
    with torch.no_grad():
        theirs = served(input_ids=ids, attention_mask=mask).logits
        mine = ours(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-4)
