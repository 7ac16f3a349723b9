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
    with pytest.warns(DeprecationWarning, match=r"(doc_ids|labels)=\.\.\.\) is deprecated"):
        old = model(ids, labels=labels, doc_ids=docs)
        described = model(ids, labels=labels, mask=MaskSpec(doc_ids=docs))
    hidden = model.backbone(ids, mask=MaskSpec(doc_ids=docs))
    assert torch.allclose(described.loss, old.loss)
    logits, targets, count = masked_rows(model.heads["mlm"], hidden, labels)
    assert torch.allclose(logits, old.logits)
    assert torch.allclose(selected_mean_cross_entropy(logits, targets, count), old.loss)


def test_decoder_backbone_and_head_give_the_forward_loss():
    model = decoder()
    ids = torch.randint(5, 120, (2, 10))
    prefix = torch.arange(10)[None].expand(2, 10) < 4
    with pytest.warns(DeprecationWarning, match=r"(prefix_mask|doc_ids|labels)=\.\.\.\) is deprecated"):
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


# ------------------------------------------------------------------ losses live with objectives and tasks


def tiny(name, heads=None, **over):
    torch.manual_seed(0)
    return build_model(get_preset(name, vocab_size=120, **over), heads=heads).eval()


def scored_without_and_with_labels(model, labels, **inputs):
    """The model's output without labels (no loss, no warning) and with them (the deprecated
    convenience: a loss, with a DeprecationWarning)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        plain = model(**inputs)
    assert plain.loss is None
    with pytest.warns(DeprecationWarning, match=r"forward\(labels=\.\.\.\) is deprecated"):
        old = model(**inputs, labels=labels)
    assert old.loss is not None
    return plain, old


def test_models_compute_no_loss_unless_the_deprecated_labels_path_is_used():
    from lmlab.losses import token_loss

    ids = torch.randint(5, 120, (2, 8))
    for name in ("gpt2-tiny", "llama-tiny", "lstm-tiny"):
        plain, old = scored_without_and_with_labels(tiny(name), ids, input_ids=ids)
        assert torch.allclose(causal_lm_loss(plain.logits, ids), old.loss)
    for name in ("t5-tiny", "bart-tiny"):
        model = tiny(name)
        cfg = model.config
        from lmlab.models.seq2seq import shift_right

        dec = shift_right(ids, cfg.decoder_start_token_id, cfg.pad_token_id)
        plain, old = scored_without_and_with_labels(model, ids, input_ids=ids, decoder_input_ids=dec)
        assert torch.allclose(token_loss(plain.logits, ids), old.loss)
    plain, old = scored_without_and_with_labels(tiny("transfo-xl-tiny"), ids, input_ids=ids)
    assert torch.allclose(causal_lm_loss(plain.logits, ids), old.loss)
    from lmlab.models.rnn.model import ELMoBiLM

    torch.manual_seed(0)
    elmo = ELMoBiLM(get_preset("elmo-tiny", vocab_size=120), vocab=[f"w{i}" for i in range(120)]).eval()
    scored_without_and_with_labels(elmo, ids, input_ids=ids)
    xlnet = tiny("xlnet-tiny")
    targets = torch.tensor([[1, 5], [0, 7]])
    streams = MaskSpec(pattern=torch.ones(2, 8, 8, dtype=torch.bool),
                       query_stream=torch.ones(2, 2, 8, dtype=torch.bool))
    plain, old = scored_without_and_with_labels(xlnet, ids.gather(1, targets), input_ids=ids, mask=streams,
                                                targets=targets)
    assert torch.allclose(token_loss(plain.logits, ids.gather(1, targets)), old.loss)


@pytest.mark.parametrize("head", ["seq_cls", "token_cls", "span", "lm", "cls", "seq2seq"])
def test_tasks_get_the_loss_the_models_computed_before(head):
    """Task.loss is scored_loss(model, model_inputs): the same number as the deprecated
    ``model(**inputs).loss`` it replaces, for every head a task uses."""
    from lmlab.tasks.base import scored_loss

    ids = torch.randint(5, 120, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if head in ("seq_cls", "token_cls", "span"):
        model = tiny("bert-tiny", heads=(head,), num_labels=3)
        if head == "seq_cls":
            inputs.update(labels=torch.tensor([0, 2, 1]), keep=slice(0, 1))
        elif head == "token_cls":
            inputs["labels"] = torch.randint(0, 3, ids.shape).masked_fill(mask == 0, IGNORE)
        else:
            inputs.update(start_positions=torch.tensor([1, 2, 9]), end_positions=torch.tensor([3, 4, 9]))
    elif head in ("lm", "cls"):
        model = tiny("gpt2-tiny", heads=(head,), num_labels=3)
        inputs["labels"] = ids.masked_fill(mask == 0, IGNORE) if head == "lm" else torch.tensor([0, 2, 1])
    else:
        model = tiny("t5-tiny")
        inputs["labels"] = torch.randint(5, 120, (3, 4))
    with pytest.warns(DeprecationWarning):
        before = model(**inputs).loss
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        now = scored_loss(model, inputs)
    assert torch.equal(now, before)


def test_seq2seq_objectives_use_the_decoder_backbone_and_head():
    from lmlab.models.seq2seq import shift_right
    from lmlab.objectives.base import teacher_forced

    model = tiny("t5-tiny")
    cfg = model.config
    ids, labels = torch.randint(5, 120, (2, 7)), torch.randint(5, 120, (2, 4))
    hidden = model.decode(shift_right(labels, cfg.decoder_start_token_id, cfg.pad_token_id),
                          model.encode(ids).last_hidden_state)
    out, loss = teacher_forced(model, {"input_ids": ids, "labels": labels})
    assert hidden.shape == (2, 4, cfg.d_model)
    assert torch.equal(model.lm_scores(hidden), out.logits)
    with pytest.warns(DeprecationWarning):
        assert torch.equal(model(ids, labels=labels).loss, loss)


def test_xlnet_and_transformer_xl_describe_their_masks_with_one_mask_spec():
    from lmlab.models.transformer_xl.model import TransfoXLModel
    from lmlab.models.xlnet.model import XLNetModel

    legacy = {"attention_pattern", "query_pattern", "target_positions"}
    for method in (XLNetModel.forward, XLNetModel.backbone, TransfoXLModel.forward, TransfoXLModel.backbone):
        params = set(inspect.signature(method).parameters)
        assert "mask" in params and not legacy & params, method
    torch.manual_seed(1)
    ids = torch.randint(5, 120, (2, 6))
    content = torch.rand(2, 6, 6) < 0.6
    query = torch.rand(2, 2, 6) < 0.5
    query[1, 0] = False  # a target that sees nothing sees its own query vector
    targets = torch.tensor([[1, 4], [0, 5]])
    model = tiny("xlnet-tiny")
    with pytest.warns(DeprecationWarning, match="attention_pattern"):
        old = model(ids, attention_pattern=content, query_pattern=query, target_positions=targets)
    new = model(ids, mask=MaskSpec(pattern=content, query_stream=query), targets=targets)
    assert torch.equal(new.logits, old.logits)
    by_hand = torch.zeros(2, 8, 8, dtype=torch.bool)
    by_hand[:, :6, :6], by_hand[:, 6:, :6] = content, query
    by_hand[1, 6, 6] = True
    expected = kernel_mask(MaskSpec(pattern=by_hand), 8)[0]
    assert torch.equal(kernel_mask(MaskSpec(pattern=content, query_stream=query), 8)[0], expected)

    txl = tiny("transfo-xl-tiny")
    first = txl(ids[:, :3])
    docs = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])  # memory's 3 then the segment's 3
    causal = torch.arange(6)[None, :] <= torch.arange(3)[:, None] + 3
    pattern = causal[None] & (docs[:, 3:, None] == docs[:, None, :])
    with pytest.warns(DeprecationWarning, match="attention_pattern"):
        old = txl(ids[:, 3:], mems=first.extra["mems"], attention_pattern=pattern)
    new = txl(ids[:, 3:], mems=first.extra["mems"], mask=MaskSpec(causal=True, doc_ids=docs))
    assert torch.equal(new.logits, old.logits)
    hidden, mems = txl.backbone(ids[:, 3:], first.extra["mems"], MaskSpec(causal=True, doc_ids=docs))
    assert torch.equal(txl.heads["lm"](hidden), new.logits) and len(mems) == txl.config.n_layers


def test_only_attention_masks_builds_masks_in_models_objectives_and_multi_layers():
    """Beyond the kernel-mask builders: no causal triangle, boolean mask tensor or two-stream
    pattern is written out in models/, XLNet's and Transformer-XL's objectives or the
    multi-variant prefix layers. (UniLM's four patterns are its own objective's pattern field.)"""
    builders = re.compile(r"finfo\(|causal_mask\(|\.tril\(|\.triu\(|dtype=torch\.bool|<= torch\.arange"
                          r"|\)\[None, :\]\s*<=|>= \(p - ")
    files = [*(SRC / "models").rglob("*.py"), SRC / "adapt" / "multi_layers.py"]
    files += [SRC / "objectives" / f"{name}.py" for name in ("xlnet", "transformer_xl", "base", "clm")]
    found = [f"{f.relative_to(SRC)}:{i}" for f in files if f.name != "attention_masks.py"
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
             if builders.search(line) and not line.lstrip().startswith("#")]
    assert found == []
