"""AdaMix: random routes in training, the weight-averaged adapter at inference (identities against a
computation by hand), experts=1 is a plain adapter, the consistency loss, save/load, learning."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from lmlab.adapt import apply_method, trainable_parameters
from lmlab.adapt.adamix import (
    MixtureAdapter,
    consistency_loss,
    merge_experts,
    mixture_modules,
    symmetric_kl,
    two_pass_loss,
)
from lmlab.adapt.adapters import BottleneckAdapter, adapter_modules
from lmlab.errors import LmlabError
from lmlab.finetune import finetune, load_finetuned
from lmlab.loading import load_model
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset

V = 300
QUIET = {"progress": False, "log": lambda m: None}


def tiny(kind: str = "houlsby", experts: int = 4, heads=("seq_cls",), **options):
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=V, dropout=0.0), heads=heads)
    apply_method(model, "adamix", {"experts": experts, "kind": kind, **options})
    return model


def scramble(model, seed: int = 3) -> None:
    """Give every expert distinct non-zero weights (project-up starts at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if "adapter." in n):
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def ids(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, V, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, 6:] = 0
    return {"input_ids": x, "attention_mask": mask}


def test_averaged_adapter_equals_the_mean_of_weights_by_hand():
    mix = MixtureAdapter(16, 4, experts=3)
    scramble(torch.nn.ModuleDict({"adapter": mix}))
    h = torch.randn(2, 5, 16)
    wd = sum(mix.down_weight[i] for i in range(3)) / 3
    bd = sum(mix.down_bias[i] for i in range(3)) / 3
    wu = sum(mix.up_weight[i] for i in range(3)) / 3
    bu = sum(mix.up_bias[i] for i in range(3)) / 3
    by_hand = h + torch.relu(h @ wd.T + bd) @ wu.T + bu
    mean_of_outputs = h + sum(torch.relu(h @ mix.down_weight[i].T + mix.down_bias[i]) @ mix.up_weight[i].T
                              + mix.up_bias[i] for i in range(3)) / 3
    mix.eval()
    assert torch.allclose(mix(h), by_hand, atol=1e-6)
    assert torch.allclose(mix.merged()(h), by_hand, atol=1e-6)
    assert not torch.allclose(mix(h), mean_of_outputs, atol=1e-4)   # weights are averaged, not outputs
    merged = mix.merged()
    assert isinstance(merged, BottleneckAdapter) and torch.equal(merged.down.weight, mix.down_weight.mean(0))


def test_experts_start_as_copies_of_one_adapter_unless_asked_otherwise():
    torch.manual_seed(0)
    same = MixtureAdapter(16, 4, experts=3)
    torch.manual_seed(0)
    own = MixtureAdapter(16, 4, experts=3, same_init=False)
    assert all(torch.equal(same.down_weight[i], same.down_weight[0]) for i in range(3))
    assert torch.equal(same.down_weight[0], own.down_weight[0])      # the same first draw
    assert not torch.equal(own.down_weight[1], own.down_weight[0])
    assert not same.up_weight.any() and not own.up_weight.any()       # identity at the start
    same.down_weight.data[1] += 1                                     # separate storage per expert
    assert not torch.equal(same.down_weight[1], same.down_weight[0])


def test_training_routes_are_random_and_reproducible_eval_is_deterministic():
    mix = MixtureAdapter(8, 2, experts=4).train()
    torch.manual_seed(5)
    routes = [mix.route() for _ in range(200)]
    torch.manual_seed(5)
    assert routes == [mix.route() for _ in range(200)]                # seeded by torch's generator
    assert set(routes) == {(i, j) for i in range(4) for j in range(4)}  # down and up drawn independently
    model = tiny()
    scramble(model)
    model.train()
    torch.manual_seed(1)
    a, b = model(**ids()).logits, model(**ids()).logits
    assert not torch.allclose(a, b)                                   # two routes, two answers
    model.eval()
    torch.manual_seed(2)
    c = model(**ids()).logits
    torch.manual_seed(3)
    assert torch.equal(c, model(**ids()).logits)


@pytest.mark.parametrize("kind", ["houlsby", "pfeiffer"])
def test_merged_model_is_a_plain_adapter_model_with_the_same_outputs(kind):
    model = tiny(kind)
    scramble(model)
    model.eval()
    merged = merge_experts(model)
    assert merged.peft["method"] == "adapter" and not mixture_modules(merged)
    assert len(adapter_modules(merged)) == len(mixture_modules(model)) == (2 if kind == "houlsby" else 1) * 2
    assert torch.equal(merged(**ids()).logits, model(**ids()).logits)
    assert mixture_modules(model)                                     # the original is left alone
    n_mix, _, _ = trainable_parameters(model)
    n_one, _, _ = trainable_parameters(merged)
    slot = sum(p.numel() for p in adapter_modules(merged)[0].parameters())
    assert n_mix - n_one == 3 * slot * len(adapter_modules(merged))  # 4 experts train, 1 serves


@pytest.mark.parametrize("kind", ["houlsby", "pfeiffer"])
def test_one_expert_is_a_plain_adapter(kind):
    mix = tiny(kind, experts=1)
    torch.manual_seed(0)
    plain = build_model(get_preset("bert-tiny", vocab_size=V, dropout=0.0), heads=("seq_cls",))
    apply_method(plain, "adapter", {"kind": kind})
    for p_mix, p_plain in zip(mixture_modules(mix), adapter_modules(plain)):  # the same initial weights
        assert torch.equal(p_mix.down_weight[0], p_plain.down.weight)
        assert torch.equal(p_mix.up_weight[0], p_plain.up.weight)
    scramble(mix)
    with torch.no_grad():  # the same trained weights, copied expert 0 -> adapter
        for m, p in zip(mixture_modules(mix), adapter_modules(plain)):
            for src, dst in zip((m.down_weight, m.down_bias, m.up_weight, m.up_bias),
                                (p.down.weight, p.down.bias, p.up.weight, p.up.bias)):
                dst.copy_(src[0])
    for mode in (True, False):
        mix.train(mode), plain.train(mode)
        torch.manual_seed(4)  # the same attention-dropout masks in training mode
        a = mix(**ids()).logits
        torch.manual_seed(4)
        assert torch.allclose(a, plain(**ids()).logits, atol=1e-6)
    assert trainable_parameters(mix)[0] == trainable_parameters(plain)[0]


def test_symmetric_kl_and_the_two_pass_loss():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    pa, pb = a.softmax(-1), b.softmax(-1)
    kl = lambda p, q: F.kl_div(q.log(), p, reduction="batchmean")  # noqa: E731  KL(p||q)
    ref = 0.5 * (kl(pa, pb) + kl(pb, pa))
    assert torch.allclose(symmetric_kl(a, b), ref, atol=1e-6)
    assert torch.allclose(symmetric_kl(a, b), symmetric_kl(b, a)) and symmetric_kl(a, a) == 0

    class Seq:  # a task that only knows its head and its loss
        name, head = "sst2", "seq_cls"

        @staticmethod
        def loss(model, batch):
            scores = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            return head_loss("seq_cls", scores, batch["labels"])

    model = tiny()
    scramble(model)
    model.train()
    batch = {**ids(), "labels": torch.tensor([0, 1, 1])}
    torch.manual_seed(7)
    got = two_pass_loss(Seq, model, batch, 1.5)
    torch.manual_seed(7)
    first, second = model(**ids()), model(**ids())
    first_loss, second_loss = (head_loss("seq_cls", out.logits, batch["labels"]) for out in (first, second))
    expected = 0.5 * (first_loss + second_loss) + 1.5 * symmetric_kl(first.logits, second.logits)
    assert torch.allclose(got, expected) and consistency_loss(Seq, first, second, batch) > 0
    torch.manual_seed(7)
    assert torch.allclose(two_pass_loss(Seq, model, batch, 0.0), first_loss)  # one pass, no regulariser


def test_bad_options_are_one_line_errors():
    for options, match in (({"experts": 0}, "experts must be at least 1"),
                           ({"consistency": -1.0}, "consistency must be at least 0"),
                           ({"kind": "lora"}, "kind must be one of houlsby, pfeiffer"),
                           ({"keep_experts": 3}, "keep_experts must be True or False"),
                           ({"experts": "two"}, "experts must be a whole number")):
        torch.manual_seed(0)
        model = build_model(get_preset("bert-tiny", vocab_size=V), heads=("seq_cls",))
        with pytest.raises(LmlabError, match=match):
            apply_method(model, "adamix", options)
    with pytest.raises(LmlabError, match="needs a model with --method adamix"):
        merge_experts(build_model(get_preset("bert-tiny", vocab_size=V), heads=("seq_cls",)))


def test_adamix_learns_sst2_and_saves_the_merged_adapter(minilm_dir, data_dir, tmp_path):
    """The real all-MiniLM-L6-v2, frozen, with AdaMix (Houlsby slots, 4 experts, consistency 1) and
    its head trained for one epoch on 500 SST-2 sentences, beats the majority class on 200 dev
    sentences; the saved model serves the merged adapter with the same predictions, and the
    experts reload too. Measured: 0.690 (seed 0), 0.715 (seed 1) against a majority class of
    0.505 on these 200 sentences, hence the margin of 0.1."""
    g = data_dir / "glue" / "sst2"
    out = tmp_path / "ft"
    res = finetune(minilm_dir, "sst2", g / "train.tsv", g / "dev.tsv", out, method="adamix",
                   max_train_examples=500, max_eval_examples=200, epochs=1, batch_size=16, lr=2e-3,
                   max_length=32, seed=0, **QUIET)
    dev = res.task.read(g / "dev.tsv")[:200]
    majority = max(Counter(e.label for e in dev).values()) / len(dev)
    assert res.metrics["accuracy"] > majority + 0.1, (res.metrics, majority)
    assert not res.at_baseline
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["method"] == "adamix" and summary["trainable_parameters"] == res.trainable_parameters

    served, task = load_finetuned(out)                     # the merged single adapter
    assert served.peft["method"] == "adapter" and not mixture_modules(served)
    assert task.evaluate(served, dev) == res.metrics
    few = dev[:48]                                          # identities on a few sentences (fast)
    logits = task.logits(served, few)
    assert torch.equal(logits, task.logits(res.model.eval(), few))   # = the mixture in eval mode
    assert torch.equal(logits, task.logits(load_model(out), few))

    from lmlab.adapt.peft_io import load_peft
    from lmlab.interop import load_plain_model

    experts = load_peft(load_plain_model(out / "base"), out / "experts")
    assert experts.peft["method"] == "adamix" and len(mixture_modules(experts)) == 12  # 6 layers x 2
    assert torch.equal(task.logits(experts, few), logits)


def test_consistency_needs_comparable_outputs():
    from lmlab.adapt.peft_io import AdaMixFineTuning
    from lmlab.tasks import make_task

    span = make_task("squad", "encoder")
    with pytest.raises(LmlabError, match="consistency=0"):
        AdaMixFineTuning().apply(build_model(get_preset("bert-tiny", vocab_size=V), heads=("span",)), span)
    model = build_model(get_preset("bert-tiny", vocab_size=V), heads=("span",))
    assert AdaMixFineTuning(consistency=0.0).apply(model, span).peft["method"] == "adamix"


def test_bad_cli_options_fail_before_any_work(minilm_dir, tmp_path, capsys):
    from lmlab.cli import main

    missing = tmp_path / "no-such-train.tsv"               # never read: the option fails first
    args = ["finetune", "--checkpoint", str(minilm_dir), "--task", "sst2", "--train", str(missing),
            "--dev", str(missing), "--out", str(tmp_path / "o"), "--method", "adamix", "--no-progress"]
    for option, message in (("experts=0", "--method-option experts must be at least 1"),
                            ("consistency=-2", "--method-option consistency must be at least 0"),
                            ("experts=many", "--method-option experts must be a whole number")):
        assert main(args + ["--method-option", option]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
