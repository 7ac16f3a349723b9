"""Models are objective-neutral: a backbone call with one mask description, plain heads, losses
outside ``lmlab.models``, one mask builder and one home for the ignore label."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

import lmlab
from lmlab.losses import IGNORE, causal_lm_loss, selected_mean_cross_entropy
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import MaskSpec, is_block_mask, kernel_mask, layer_mask
from lmlab.models.encoder.model import masked_rows

SRC = Path(lmlab.__file__).parent


def encoder():
    torch.manual_seed(0)
    return build_model(get_preset("bert-tiny", vocab_size=120, d_model=32, n_heads=2, d_ff=64),
                       heads=("mlm",)).eval()


def decoder():
    torch.manual_seed(0)
    return build_model(get_preset("gpt2-tiny", vocab_size=120, d_model=32, n_heads=2, d_ff=64)).eval()


def test_the_ignore_label_has_one_home():
    defined = [str(f.relative_to(SRC)) for f in SRC.rglob("*.py")
               if re.search(r"^\s*\w+\s*=\s*-100\b", f.read_text(encoding="utf-8"), re.M)]
    assert defined == ["losses.py"]
    assert IGNORE == -100


def test_only_attention_masks_turns_descriptions_into_kernel_masks():
    """No model or objective builds a kernel mask of its own (causal triangles, padding biases,
    the dtype's most negative number): they describe one and call kernel_mask/layer_mask."""
    builders = re.compile(r"finfo\(|causal_mask\(|attention_bias\(|self_attention_mask\(")
    found = [f"{f.relative_to(SRC)}:{i}" for root in ("models", "objectives")
             for f in (SRC / root).rglob("*.py") if f.name != "attention_masks.py"
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
             if builders.search(line) and not line.lstrip().startswith("#")]
    assert found == []


def test_heads_take_hidden_states_and_return_scores_only():
    from lmlab.models import heads

    for name, cls in vars(heads).items():
        if inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and cls.__module__ == heads.__name__:
            assert list(inspect.signature(cls.forward).parameters) == ["self", "hidden", "pooled"], name


def test_model_signatures_carry_no_objective_arguments():
    from lmlab.models.decoder.model import DecoderModel
    from lmlab.models.encoder.model import EncoderModel

    objective_args = {"label_positions", "first_token_only", "attention_pattern", "doc_ids", "heads",
                      "prefix_mask", "cls_labels"}
    for cls in (EncoderModel, DecoderModel):
        for method in (cls.forward, cls.backbone):
            assert not objective_args & set(inspect.signature(method).parameters), (cls, method)
    assert list(inspect.signature(EncoderModel.backbone).parameters) == [
        "self", "input_ids", "positions", "mask", "token_type_ids", "keep"]
    assert list(inspect.signature(DecoderModel.backbone).parameters) == [
        "self", "input_ids", "positions", "mask"]


def test_encoder_backbone_and_head_give_the_forward_loss():
    model = encoder()
    ids = torch.randint(5, 120, (2, 12))
    labels = torch.full_like(ids, IGNORE)
    labels[:, 3:6] = ids[:, 3:6]
    docs = torch.tensor([[0] * 6 + [1] * 6, [0] * 12])
    with pytest.warns(DeprecationWarning, match="doc_ids"):
        old = model(ids, labels=labels, doc_ids=docs)
    hidden = model.backbone(ids, mask=MaskSpec(doc_ids=docs))
    assert torch.allclose(model(ids, labels=labels, mask=MaskSpec(doc_ids=docs)).loss, old.loss)
    logits, targets, count = masked_rows(model.heads["mlm"], hidden, labels)
    assert torch.allclose(logits, old.logits)
    assert torch.allclose(selected_mean_cross_entropy(logits, targets, count), old.loss)


def test_decoder_backbone_and_head_give_the_forward_loss():
    model = decoder()
    ids = torch.randint(5, 120, (2, 10))
    prefix = torch.arange(10)[None].expand(2, 10) < 4
    with pytest.warns(DeprecationWarning, match="prefix_mask"):
        old = model(ids, labels=ids, prefix_mask=prefix, doc_ids=torch.zeros_like(ids))
    logits = model.heads["lm"](model.backbone(ids, mask=MaskSpec(causal=True, prefix=prefix,
                                                                 doc_ids=torch.zeros_like(ids))))
    assert torch.allclose(logits, old.logits)
    assert torch.allclose(causal_lm_loss(logits, ids), old.loss)
    described = model(ids, mask=MaskSpec(causal=True, prefix=prefix, doc_ids=torch.zeros_like(ids)))
    assert torch.allclose(described.logits, logits)  # the new keyword: one description, no warning
    plain = model.heads["lm"](model.backbone(ids))  # no description: causal
    assert torch.allclose(plain, model(ids).logits)


def test_kernel_mask_keeps_the_fast_paths_and_builds_block_masks():
    assert kernel_mask(MaskSpec(causal=True), 8) == (None, True)
    assert kernel_mask(None, 8) == (None, False)
    assert kernel_mask(MaskSpec(padding=torch.ones(2, 8)), 8) == (None, False)  # no padding at all
    bias, causal = kernel_mask(MaskSpec(causal=True, padding=torch.tensor([[1, 1, 0]])), 3)
    assert not causal and bias.shape == (1, 1, 3, 3) and bool((bias[0, 0, :, 2] < -1e30).all())
    docs = torch.tensor([[0, 0, 1, 1]])
    block, _ = kernel_mask(MaskSpec(causal=True, doc_ids=docs), 4, backend="flex")
    assert is_block_mask(block)


def test_layer_mask_adapts_a_causal_mask_to_a_cache_queries_and_a_position_bias():
    assert layer_mask(None, True, 1, 5, dtype=torch.float32) == (None, False)  # one new token sees all
    mask, causal = layer_mask(None, True, 2, 5, dtype=torch.float32)
    assert not causal and mask.tolist() == [[True] * 4 + [False], [True] * 5]
    rows, _ = layer_mask(None, True, 4, 4, queries=slice(0, 1), dtype=torch.float32)
    assert rows.tolist() == [[True, False, False, False]]
    bias, causal = layer_mask(None, True, 3, 3, position_bias=torch.zeros(1, 1, 3, 3), dtype=torch.float32)
    future = torch.ones(3, 3, dtype=torch.bool).triu(1)
    assert not causal and bool((bias[0, 0][future] < -1e30).all()) and bool((bias[0, 0][~future] == 0).all())


def test_blocks_are_split_by_job_and_small():
    models = SRC / "models"
    mine = [models / f"{n}.py" for n in ("blocks", "attention", "feedforward", "norms", "positions",
                                         "attention_masks", "heads", "output")]
    mine += [*sorted(models.glob("*/model.py")), *sorted((SRC / "objectives").glob("*.py"))]
    mine.append(SRC / "losses.py")
    texts = {f: f.read_text(encoding="utf-8") for f in mine}
    assert [f.name for f, text in texts.items() if len(text.splitlines()) > 500] == []
    long = [f"{f.name}:{node.name}" for f, text in texts.items() for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 80]
    assert long == []
