"""Many tuned variants in one batch (lmlab.adapt.multi): every row of a mixed batch equals its
variant run alone - logits (fp32, 1e-5) and greedy tokens with the KV cache."""

from __future__ import annotations

import pytest
import torch

from lmlab.adapt import apply_method
from lmlab.adapt.multi import MultiAdapterModel, generate_variants
from lmlab.adapt.peft_io import load_peft_model, save_peft
from lmlab.errors import LmlabError
from lmlab.generate import generate
from lmlab.models import build_model, get_preset

#: name -> (method, options): ranks, prefix and prompt lengths differ on purpose
DECODER_VARIANTS = {
    "lora4": ("lora", {"rank": 4, "alpha": 8.0}),
    "lora2": ("lora", {"rank": 2, "alpha": 4.0, "target_modules": "all-linear"}),
    "prefix3": ("prefix", {"num_virtual_tokens": 3, "init": "random"}),
    "prefix5": ("prefix", {"num_virtual_tokens": 5, "init": "random", "positions": "after_prefix"}),
    "prompt2": ("prompt", {"num_virtual_tokens": 2, "init": "random"}),
    "prompt4": ("prompt", {"num_virtual_tokens": 4, "init": "random"}),
}


def make_base(preset: str, heads, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(get_preset(preset, vocab_size=97, **overrides), heads=heads).eval()


def tuned(model, method, options, seed, std=0.3):
    """``model`` with ``method`` applied and random (non-zero) trained weights."""
    apply_method(model, method, options)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def with_head(heads, **overrides):
    """The pretrained bert-tiny body (``make_base(..., ("mlm",))``) under a new task head, as
    fine-tuning makes it."""
    model = make_base("bert-tiny", heads, seed=5, **overrides)
    pretrained = make_base("bert-tiny", ("mlm",)).state_dict()
    body = {k: v for k, v in pretrained.items() if not k.startswith("heads.")}
    model.load_state_dict(body, strict=False)
    return model


def save_variant(base_factory, method, options, directory, seed):
    """A variant with random trained weights, saved as an adapter."""
    save_peft(tuned(base_factory(), method, options, seed), directory)
    return directory


@pytest.fixture(scope="module", params=["gpt2-tiny", "llama-tiny"])
def decoder_setup(request, tmp_path_factory):
    preset = request.param
    tmp = tmp_path_factory.mktemp(preset)
    factory = lambda: make_base(preset, ("lm",))  # noqa: E731
    dirs = {name: save_variant(factory, m, o, tmp / name, seed=i)
            for i, (name, (m, o)) in enumerate(DECODER_VARIANTS.items())}
    dirs["base"] = None
    multi = MultiAdapterModel(factory(), dirs)
    alone = {name: (factory() if d is None else load_peft_model(factory(), d)).eval()
             for name, d in dirs.items()}
    return multi, alone


def left_padded(rows: list[list[int]], pad: int = 0):
    n = max(map(len, rows))
    ids = torch.tensor([[pad] * (n - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def test_mixed_decoder_batch_logits_equal_each_variant_alone(decoder_setup):
    multi, alone = decoder_setup
    names = list(alone) * 2
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, 97, (int(n),), generator=g).tolist()
            for n in torch.randint(2, 9, (len(names),), generator=g)]
    ids, mask = left_padded(rows)
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # real tokens numbered from 0, as generation does
    with torch.no_grad():
        batched = multi(ids, attention_mask=mask, position_ids=positions, variant_ids=names).logits
        for i, (name, row) in enumerate(zip(names, rows)):
            ref = alone[name](torch.tensor([row])).logits[0]
            torch.testing.assert_close(batched[i, -len(row):], ref, atol=1e-5, rtol=1e-5, msg=name)


def test_mixed_decoder_greedy_generation_equals_each_variant_alone(decoder_setup):
    multi, alone = decoder_setup
    names = list(alone)
    rows = [[5 + i, 17, 30 + 2 * i][: 2 + i % 2] for i in range(len(names))]
    ids, mask = left_padded(rows)
    out = generate_variants(multi, ids, mask, names, max_new_tokens=6, eos_token_id=[])
    for i, (name, row) in enumerate(zip(names, rows)):
        ref = generate(alone[name], torch.tensor([row]), max_new_tokens=6, eos_token_id=[])[0]
        assert out[i, -6:].tolist() == ref[-6:].tolist(), name
    # the variants really differ (otherwise the identity above would prove little)
    assert len({tuple(r[-6:].tolist()) for r in out}) > 3


def test_unpadded_batch_without_prompt_variants_generates_as_alone(decoder_setup):
    """No attention mask at all (equal lengths, no prompt slots): the prefix rows build their own."""
    multi, alone = decoder_setup
    names = ["prefix5", "lora4", "prefix3", "base"]
    ids = torch.tensor([[4, 9, 16, 25]] * 4)
    out = generate_variants(multi, ids, None, names, max_new_tokens=5, eos_token_id=[])
    for i, name in enumerate(names):
        ref = generate(alone[name], ids[:1], max_new_tokens=5, eos_token_id=[])[0]
        assert out[i].tolist() == ref.tolist()


def test_beam_search_keeps_each_rows_variant(decoder_setup):
    multi, alone = decoder_setup
    names = ["prompt4", "prefix3", "lora2"]
    ids = torch.tensor([[7, 8, 9]] * 3)
    out = generate_variants(multi, ids, None, names, max_new_tokens=4, num_beams=3, eos_token_id=[])
    for i, name in enumerate(names):
        ref = generate(alone[name], ids[:1], max_new_tokens=4, num_beams=3, eos_token_id=[])[0]
        assert out[i].tolist() == ref.tolist(), name


@pytest.fixture(scope="module")
def encoder_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bert")
    pretrained = lambda: make_base("bert-tiny", ("mlm",), num_labels=3)  # noqa: E731  (no task head)
    factory = lambda: with_head(("seq_cls",), num_labels=3)  # noqa: E731

    variants = {
        "lora": ("lora", {"rank": 4}),
        "prefix": ("prefix", {"num_virtual_tokens": 3, "init": "random", "positions": "after_prefix"}),
        "prompt2": ("prompt", {"num_virtual_tokens": 2, "init": "random"}),
        "prompt5": ("prompt", {"num_virtual_tokens": 5, "init": "random"}),
    }
    dirs = {n: save_variant(factory, m, o, tmp / n, seed=10 + i)
            for i, (n, (m, o)) in enumerate(variants.items())}
    multi = MultiAdapterModel(pretrained(), dirs)
    alone = {n: load_peft_model(pretrained(), d).eval() for n, d in dirs.items()}
    return multi, alone


def test_mixed_encoder_classification_equals_each_variant_alone(encoder_setup):
    multi, alone = encoder_setup
    names = ["prompt5", "lora", "prefix", "prompt2", "lora", "prompt5"]
    g = torch.Generator().manual_seed(2)
    rows = [[2] + torch.randint(5, 97, (int(n),), generator=g).tolist() + [3]
            for n in torch.randint(1, 7, (len(names),), generator=g)]
    n = max(map(len, rows))
    ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])  # right padding, as tasks collate
    mask = (ids != 0).long()
    with torch.no_grad():
        types = torch.zeros_like(ids)
        batched = multi(ids, attention_mask=mask, token_type_ids=types, variant_ids=names).logits
        for i, (name, row) in enumerate(zip(names, rows)):
            ref = alone[name](torch.tensor([row])).logits[0]
            torch.testing.assert_close(batched[i], ref, atol=1e-5, rtol=1e-5)
    assert batched.shape == (len(names), 3)


def test_variant_errors_are_one_line(decoder_setup, tmp_path):
    multi, _ = decoder_setup
    with pytest.raises(LmlabError, match="unknown variant 'nope'"):
        multi(torch.tensor([[5, 6]]), variant_ids=["nope"])
    with pytest.raises(LmlabError, match="variant of every row"):
        multi(torch.tensor([[5, 6]]))
    other_base = lambda: make_base("gpt2-tiny", ("lm",), seed=7)  # noqa: E731
    other = save_variant(other_base, "lora", {"rank": 2}, tmp_path / "o", 0)
    with pytest.raises(LmlabError, match="trained on another base"):
        MultiAdapterModel(make_base("gpt2-tiny", ("lm",)), {"o": other})
    ad = save_variant(lambda: make_base("gpt2-tiny", ("lm",)), "adapter", {}, tmp_path / "a", 0)
    with pytest.raises(LmlabError, match="adapter variant, which cannot share a batch"):
        MultiAdapterModel(make_base("gpt2-tiny", ("lm",)), {"a": ad})
    with pytest.raises(LmlabError, match="no lmlab adapter"):
        MultiAdapterModel(make_base("gpt2-tiny", ("lm",)), {"x": tmp_path})


def test_roberta_token_labels_per_row_with_padding_numbered_positions(tmp_path):
    """RoBERTa numbers positions past the padding id: the unused prompt slots must not count."""
    factory = lambda: make_base("roberta-tiny", ("token_cls",), num_labels=5)  # noqa: E731
    assert factory().config.positions_from_padding
    variants = {"prompt1": ("prompt", {"num_virtual_tokens": 1, "init": "random"}),
                "prompt3": ("prompt", {"num_virtual_tokens": 3, "init": "random"}),
                "prefix": ("prefix", {"num_virtual_tokens": 2, "init": "random",
                                      "positions": "after_prefix"}),
                "lora": ("lora", {"rank": 2})}
    dirs = {n: save_variant(factory, m, o, tmp_path / n, seed=20 + i)
            for i, (n, (m, o)) in enumerate(variants.items())}
    multi = MultiAdapterModel(factory(), dirs)
    pad = multi.config.pad_token_id
    names = ["prompt3", "prefix", "prompt1", "lora", "prompt1"]
    rows = [[0, 11, 12, 13, 2], [0, 14, 2], [0, 15, 16, 2], [0, 17, 18, 19, 20, 2], [0, 21, 2]]
    n = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (n - len(r)) for r in rows])
    with torch.no_grad():
        batched = multi(ids, attention_mask=(ids != pad).long(), variant_ids=names).logits
        assert batched.shape[:2] == ids.shape  # the prompt slots are gone from token outputs
        for i, (name, row) in enumerate(zip(names, rows)):
            ref = load_peft_model(factory(), dirs[name]).eval()(torch.tensor([row])).logits[0]
            torch.testing.assert_close(batched[i, : len(row)], ref, atol=1e-5, rtol=1e-5, msg=name)


def test_variants_that_cannot_share_a_batch_are_refused(tmp_path):
    t5 = lambda: make_base("t5-tiny", None)  # noqa: E731
    with pytest.raises(LmlabError, match="need an encoder or decoder base, not seq2seq"):
        MultiAdapterModel(t5(), {"a": save_variant(t5, "lora", {"rank": 2}, tmp_path / "t5", 0)})
    mlm = lambda: make_base("bert-tiny", ("mlm",))  # noqa: E731
    a = save_variant(lambda: with_head(("seq_cls",), num_labels=3), "lora", {"rank": 2}, tmp_path / "a", 0)
    b = save_variant(lambda: with_head(("seq_cls",), num_labels=2), "lora", {"rank": 2}, tmp_path / "b", 1)
    c = save_variant(lambda: with_head(("token_cls",), num_labels=3), "lora", {"rank": 2}, tmp_path / "c", 2)
    with pytest.raises(LmlabError, match="heads have the same number of labels"):
        MultiAdapterModel(mlm(), {"a": a, "b": b})
    with pytest.raises(LmlabError, match="trained with different heads"):
        MultiAdapterModel(mlm(), {"a": a, "c": c})
    with pytest.raises(LmlabError, match="no trained seq_cls head"):
        MultiAdapterModel(mlm(), {"a": a, "plain": None})
    with pytest.raises(LmlabError, match="computes no losses"):
        MultiAdapterModel(mlm(), {"a": a})(torch.tensor([[2, 5, 3]]), labels=torch.tensor([1]),
                                           variant_ids=["a"])
