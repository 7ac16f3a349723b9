"""LoRA: identity at init, merge/unmerge, targets, frozen base, and Hugging Face peft as the oracle."""

from __future__ import annotations

import pytest
import torch

from lmlab.adapt import apply_method, trainable_parameters
from lmlab.adapt.lora import LoRALinear, find_targets, merge_lora, unmerge_lora
from lmlab.errors import LmlabError
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset

V = 300


def tiny(preset: str = "bert-tiny", heads=("seq_cls",)):
    torch.manual_seed(0)
    return build_model(get_preset(preset, vocab_size=V, dropout=0.0, attn_dropout=0.0), heads=heads).eval()


def batch(seed: int = 1, b: int = 3, t: int = 9):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def randomize_lora(model, seed: int = 2, std: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * std)


@pytest.mark.parametrize("preset,heads", [("bert-tiny", ("seq_cls",)), ("llama-tiny", ("lm",))])
def test_zero_b_starts_as_the_base_model(preset, heads):
    model = tiny(preset, heads)
    x = batch()
    with torch.no_grad():
        base = model(**x).logits
    apply_method(model, "lora", {"rank": 4, "target_modules": ["all-linear"]})
    with torch.no_grad():
        assert torch.equal(model(**x).logits, base)
    randomize_lora(model)  # and the branch is really in the forward pass
    with torch.no_grad():
        assert (model(**x).logits - base).abs().max() > 1e-3


def test_merge_gives_the_same_logits_and_unmerge_restores_the_weights():
    model = tiny("gpt2-tiny", ("lm",))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    apply_method(model, "lora", {"rank": 4, "alpha": 8, "target_modules": ["attention", "ffn"]})
    randomize_lora(model)
    x = batch()
    with torch.no_grad():
        unmerged = model(**x).logits
        merge_lora(model)
        merged = model(**x).logits
    assert (merged - unmerged).abs().max() < 1e-5
    changed = [k for k, v in original.items() if not torch.equal(model.state_dict()[k], v)]
    assert any(k.endswith("q_proj.weight") for k in changed)  # merging really moved the weights
    unmerge_lora(model)
    for k, v in original.items():
        assert torch.allclose(model.state_dict()[k], v, atol=1e-6), k


def test_merge_and_unload_leaves_a_plain_model(tmp_path):
    from lmlab.loading import load_model

    model = tiny()
    apply_method(model, "lora", {"rank": 2})
    randomize_lora(model)
    x = batch()
    with torch.no_grad():
        before = model(**x).logits
    merge_lora(model, unload=True)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert not hasattr(model, "peft")
    model.save(tmp_path / "merged")
    with torch.no_grad():
        after = load_model(tmp_path / "merged")(**x).logits
    assert (after - before).abs().max() < 1e-5


def test_targets_by_name_group_and_glob():
    model = tiny()  # bert-tiny: 2 layers
    assert len(find_targets(model, ["q_proj", "v_proj"])) == 4
    assert len(find_targets(model, ["all-linear"])) == 2 * 6  # q k v o fc_in fc_out
    assert len(find_targets(model, ["layers.1.*"])) == 6
    with pytest.raises(LmlabError, match="matches no linear layer"):
        find_targets(model, ["query"])


def test_trainable_count_matches_the_formula():
    model = tiny()
    d, r, layers = 64, 4, 2
    head = sum(p.numel() for p in model.heads.parameters()) + sum(
        p.numel() for p in model.pooler.parameters()
    )
    apply_method(model, "lora", {"rank": r})
    n, total, share = trainable_parameters(model)
    assert n == layers * 2 * r * (d + d) + head
    assert share == pytest.approx(n / total)


def test_only_lora_and_head_train_and_the_base_stays():
    model = tiny()
    apply_method(model, "lora", {"rank": 4, "dropout": 0.1})
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    trained = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n or n.startswith(("heads.", "pooler.")) for n in trained)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)  # all params: frozen get no grad
    model.train()
    for _ in range(3):
        loss = head_loss("seq_cls", model(**batch()).logits, torch.tensor([0, 1, 1]))
        loss.backward()
        opt.step()
        opt.zero_grad()
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in frozen.items())
    assert all(not torch.equal(now[n], p) for n, p in trained.items() if "lora_A" not in n)


def test_bad_options_are_one_line_errors():
    with pytest.raises(LmlabError, match="rank"):
        apply_method(tiny(), "lora", {"rank": 0})
    with pytest.raises(LmlabError, match="has no option 'rnak'; did you mean rank"):
        apply_method(tiny(), "lora", {"rnak": 4})
    with pytest.raises(LmlabError, match="rank must be a whole number"):
        apply_method(tiny(), "lora", {"rank": "eight"})
    model = tiny()
    apply_method(model, "lora", {"rank": "4", "target_modules": "q_proj,k_proj"})  # CLI strings
    assert model.peft["options"]["rank"] == 4 and len(find_targets(model, ["k_proj"])) == 2
    with pytest.raises(LmlabError, match="already has lora"):
        apply_method(model, "prefix")


def hf_bert_config(layers: int, **kw):
    """A small transformers BertConfig without dropout (seeds torch for the model built from it)."""
    import transformers as tf

    torch.manual_seed(0)
    return tf.BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                         intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         **kw)


def test_same_output_as_hugging_face_peft(tmp_path):
    """transformers BertModel + peft LoRA on query/value vs lmlab's import of the same weights
    with the same A and B: the hidden states agree."""
    import peft  # the dev extra installs it
    import transformers as tf

    from lmlab.loading import load_model

    hf = tf.BertModel(hf_bert_config(2)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_model(tmp_path).eval()
    hf = peft.get_peft_model(
        hf, peft.LoraConfig(r=4, lora_alpha=12, target_modules=["query", "value"], lora_dropout=0.0)
    )
    apply_method(ours, "lora", {"rank": 4, "alpha": 12})
    hf_state = {k: v for k, v in hf.state_dict().items() if "lora_" in k}
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for i in range(2):
            for hf_name, our_name in (("query", "q_proj"), ("value", "v_proj")):
                prefix = f"base_model.model.encoder.layer.{i}.attention.self.{hf_name}"
                a = hf_state[f"{prefix}.lora_A.default.weight"]
                b = torch.randn(hf_state[f"{prefix}.lora_B.default.weight"].shape, generator=g) * 0.1
                hf.get_parameter(f"{prefix}.lora_B.default.weight").copy_(b)
                layer = getattr(ours.layers[i].attn, our_name)
                layer.lora_A.copy_(a)
                layer.lora_B.copy_(b)
        x = batch()
        ref = hf(**x).last_hidden_state
        got = ours(**x).last_hidden_state
    assert (got - ref).abs().max() < 1e-5
    assert trainable_parameters(ours)[0] == sum(p.numel() for p in hf.parameters() if p.requires_grad)


def test_sequence_classification_equals_peft_with_the_cls_only_last_layer(tmp_path):
    """BertForSequenceClassification + peft LoRA (classifier and pooler trained) vs lmlab's import
    with the same A, B and head, run as fine-tuning runs it (``first_token_only``, the last layer at
    [CLS] only): same logits and loss, same gradients for every trained parameter."""
    import peft
    import transformers as tf

    from lmlab.loading import load_model
    from lmlab.tasks import make_task

    hf = tf.BertForSequenceClassification(hf_bert_config(3, num_labels=2))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_model(tmp_path).train()
    hf = peft.get_peft_model(
        hf,
        peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier", "pooler"]
        ),
    ).train()
    apply_method(ours, "lora", {"rank": 4, "alpha": 8})
    g = torch.Generator().manual_seed(3)
    pairs = []
    with torch.no_grad():
        for i in range(3):
            for hf_name, our_name in (("query", "q_proj"), ("value", "v_proj")):
                prefix = f"base_model.model.bert.encoder.layer.{i}.attention.self.{hf_name}"
                layer = getattr(ours.layers[i].attn, our_name)
                a, b = hf.get_parameter(f"{prefix}.lora_A.default.weight"), hf.get_parameter(
                    f"{prefix}.lora_B.default.weight"
                )
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
                layer.lora_A.copy_(a)
                layer.lora_B.copy_(b)
                pairs += [(a, layer.lora_A), (b, layer.lora_B)]
    for w in ("weight", "bias"):
        pairs.append((hf.get_parameter(f"base_model.model.classifier.modules_to_save.default.{w}"),
                      ours.heads["seq_cls"].classifier.get_parameter(w)))
        pairs.append((hf.get_parameter(f"base_model.model.bert.pooler.modules_to_save.default.dense.{w}"),
                      ours.pooler.get_parameter(w)))
    x = {**batch(), "labels": torch.tensor([0, 1, 1])}
    x["token_type_ids"] = torch.zeros_like(x["input_ids"])
    inputs = make_task("sst2").model_inputs(ours, x)
    assert inputs["keep"] == slice(0, 1)
    labels = inputs.pop("labels")
    ref, got = hf(**x), ours(**inputs)
    got_loss = head_loss("seq_cls", got.logits, labels)
    assert (got.logits - ref.logits).abs().max() < 1e-5
    assert abs(float(got_loss.detach()) - float(ref.loss.detach())) < 1e-5
    ref.loss.backward()
    got_loss.backward()
    for theirs, mine in pairs:
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-5, rtol=1e-4)
    assert trainable_parameters(ours)[0] == sum(p.numel() for p in hf.parameters() if p.requires_grad)
