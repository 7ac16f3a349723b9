"""LoRA, prefix and prompt tuning exported as peft folders load in ``peft`` itself (on lmlab's
Hugging Face export of the base) and compute lmlab's logits."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from peft import PeftModel

from lmlab.adapt import apply_method
from lmlab.adapt.peft_export import export_peft
from lmlab.errors import LmlabError
from lmlab.interop import hf_export
from lmlab.models import build_model, get_preset

V = 300
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
PREFIX = {"num_virtual_tokens": 3, "init": "random", "positions": "after_prefix"}
PROMPT = {"num_virtual_tokens": 3, "init": "random"}
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
CASES = [
    ("bert-tiny", ("seq_cls",), "BertForSequenceClassification", {"num_labels": 3}, "lora", LORA),
    ("llama-tiny", ("lm",), "LlamaForCausalLM", {}, "lora", LORA),
    ("t5-tiny", None, "T5ForConditionalGeneration", {}, "lora", LORA),
    ("bart-tiny", None, "BartForConditionalGeneration", {}, "lora", LORA),
    # GPT-2: q and v go into the fused, transposed c_attn; fc_in is a Conv1D of its own
    ("gpt2-tiny", ("lm",), "GPT2LMHeadModel", {}, "lora", {**LORA, "target_modules": ["qv", "fc_in"]}),
    ("gpt2-tiny", ("cls",), "GPT2ForSequenceClassification", {"num_labels": 3, "pad_token_id": 0}, "lora",
     LORA),
    ("gpt2-tiny", ("lm",), "GPT2LMHeadModel", {}, "prefix", PREFIX),
    ("gpt2-tiny", ("lm",), "GPT2LMHeadModel", {}, "prefix", {**PREFIX, "reparameterize": True, "hidden": 16}),
    ("llama-tiny", ("lm",), "LlamaForCausalLM", {}, "prefix", PREFIX),
    # rotary positions: a prefix trained with the input numbered from 0 exports too (keys rotated)
    ("llama-tiny", ("lm",), "LlamaForCausalLM", {}, "prefix", {**PREFIX, "positions": "from_start"}),
    pytest.param("bert-tiny", ("seq_cls",), "BertForSequenceClassification", {"num_labels": 3}, "prefix",
                 PREFIX, marks=pytest.mark.xfail(TRANSFORMERS_5, raises=ValueError, strict=True,
                                         reason="peft looks for past_key_values in BERT's forward, which "
                                         "transformers 5 calls cache")),
    pytest.param("roberta-tiny", ("token_cls",), "RobertaForTokenClassification", {"num_labels": 4}, "prefix",
                 PREFIX, marks=pytest.mark.xfail(TRANSFORMERS_5, raises=ValueError, strict=True,
                                                 reason="as for BERT")),
    ("bert-tiny", ("seq_cls",), "BertForSequenceClassification", {"num_labels": 3}, "prompt",
     {**PROMPT, "before_cls": True}),
    ("roberta-tiny", ("token_cls",), "RobertaForTokenClassification", {"num_labels": 4}, "prompt",
     {**PROMPT, "before_cls": True}),
    ("gpt2-tiny", ("lm",), "GPT2LMHeadModel", {}, "prompt", PROMPT),
    ("t5-tiny", None, "T5ForConditionalGeneration", {}, "prompt", PROMPT),
    ("bart-tiny", None, "BartForConditionalGeneration", {"scale_embedding": True}, "prompt", PROMPT),
]


def ids(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(5, V, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("preset, heads, hf_class, extra, method, options", CASES)
def test_peft_loads_the_export_and_computes_lmlabs_logits(tmp_path, preset, heads, hf_class, extra, method,
                                                          options):
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=V, dropout=0.0, **extra), heads=heads).eval()
    hf_export(model, tmp_path / "base")  # the base, before the method
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # padding at the end of one row
    kwargs = {"input_ids": ids(2, 12, 1), "attention_mask": mask}
    if model.config.pad_token_id is not None:  # (RoBERTa numbers positions around padding)
        kwargs["input_ids"][1, 9:] = model.config.pad_token_id
    if model.architecture == "seq2seq":
        kwargs["decoder_input_ids"] = ids(2, 5, 2)
    with torch.no_grad():
        plain = model(**kwargs).logits
    apply_method(model, method, options)
    with torch.no_grad():  # a trained-looking update and head (LoRA's B starts at zero)
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    export_peft(model, tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == {"lora": "LORA", "prefix": "PREFIX_TUNING", "prompt": "PROMPT_TUNING"}[
        method]

    base = getattr(transformers, hf_class).from_pretrained(tmp_path / "base").eval()
    peft_model = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    with torch.no_grad():
        ours, theirs = model(**kwargs).logits, peft_model(**kwargs).logits
    if method == "prompt" and heads and heads[0] in ("lm", "token_cls"):
        theirs = theirs[:, options["num_virtual_tokens"]:]  # peft returns the prompt's positions too
    if ours.dim() == 3 and model.architecture != "seq2seq":  # padding rows: only the real tokens count
        ours, theirs, plain = ours[mask.bool()], theirs[mask.bool()], plain[mask.bool()]
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain, ours, atol=1e-3)  # the method is really applied (the test can fail)


def test_what_peft_cannot_compute_is_refused(tmp_path):
    def adapted(preset, method, options, heads=None):
        model = build_model(get_preset(preset, vocab_size=V), heads=heads)
        apply_method(model, method, options)
        return model

    AFTER = {"num_virtual_tokens": 2, "positions": "after_prefix"}
    refused = [
        (adapted("gpt2-tiny", "prefix", {"num_virtual_tokens": 2}), "numbered from 0"),
        (adapted("t5-tiny", "prefix", {"num_virtual_tokens": 2}), "cross-attention"),
        (adapted("albert-tiny", "prefix", AFTER), "past_key_values"),
        (adapted("roberta-tiny", "prefix", AFTER, ("seq_cls",)), "pooled output"),
        (adapted("bert-tiny", "prompt", {"num_virtual_tokens": 2}, ("seq_cls",)), "before_cls=true"),
        (adapted("bert-tiny", "adapter", {}), "bottleneck adapters"),
        (build_model(get_preset("bert-tiny", vocab_size=V)), "without a method"),
    ]
    for model, reason in refused:
        with pytest.raises(LmlabError, match=reason):
            export_peft(model, tmp_path / "peft")
        assert not (tmp_path / "peft").exists()


@pytest.mark.parametrize("method", [["lora", "rank=4"], ["prompt", "before_cls=true"]],
                         ids=["lora", "prompt"])
def test_cli_exports_a_finetune_that_peft_serves(tmp_path, minilm_dir, data_dir, method):
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
                 "--method", method[0], "--method-option", method[1], "--max-steps", "4", "--batch-size", "8",
                 "--max-train-examples", "32", "--max-eval-examples", "16", "--lr", "1e-2", "--threads", "1",
                 "--no-progress"]) in (0, None)
    assert main(["export", "--checkpoint", str(tmp_path / "ft"), "--format", "peft", "--out",
                 str(tmp_path / "peft")]) == 2  # --base is required
    for _ in range(2):  # a second export replaces the first (an earlier output of the same kind)
        assert main(["export", "--checkpoint", str(tmp_path / "ft"), "--base", str(tmp_path / "bert"),
                     "--format", "peft", "--out", str(tmp_path / "peft")]) == 0
    base = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "peft" / "base")
    served = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
    ours = load_model(tmp_path / "ft").eval()  # lmlab's own output (LoRA: the merged model)
    enc = tok.encode_batch(["a gripping , funny film", "dull and far too long"], padding=True)
    ids, mask = torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"])
    with torch.no_grad():
        theirs = served(input_ids=ids, attention_mask=mask).logits
        mine = ours(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-4)


def test_cli_peft_export_says_what_the_input_is_before_asking_for_base(ckpt, tmp_path, capsys):
    """A full fine-tune or a bottleneck adapter cannot become a peft folder whatever --base is: that
    is said first (from the adapter's config alone), and --base is asked for only of an input peft
    can hold."""
    from lmlab.adapt.peft_io import save_peft
    from lmlab.cli import main
    from lmlab.loading import load_model

    for method, options in (("adapter", {}), ("lora", {"rank": 4})):
        model = load_model(ckpt)
        apply_method(model, method, options)
        save_peft(model, tmp_path / method / "adapter")
    cases = [(ckpt, "holds no adapter/ (not a parameter-efficient fine-tune)"),
             (tmp_path / "adapter", "PEFT export is for LoRA, prefix and prompt tuning, not adapter"),
             (tmp_path / "lora", "--format peft needs --base DIR"),
             # a path that is not there is said to be missing (as --format hf says), not to lack adapter/
             (tmp_path / "nonexist", f"model {tmp_path / 'nonexist'} does not exist"),
             (ckpt / "config.json", "is a file")]
    for given, words in cases:
        capsys.readouterr()
        assert main(["export", "--checkpoint", str(given), "--format", "peft", "--out",
                     str(tmp_path / "peft")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
        assert not (tmp_path / "peft").exists()
