"""A training forward (loss included) traces as one graph under torch.compile: no host reads of
tensor values and no data-dependent branches in the models' hot path."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from lmlab.errors import LmlabError
from lmlab.losses import selected_mean_cross_entropy
from lmlab.models import build_model, get_preset
from lmlab.models.encoder.model import masked_rows


def _inputs(preset: str):
    ids = torch.randint(5, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    if preset.startswith(("t5", "bart")):
        return {"input_ids": ids, "labels": ids[:, :8]}
    if preset.startswith("electra"):
        return {"input_ids": ids}
    labels = ids.clone()
    if preset.startswith(("bert", "roberta", "albert")):
        labels[:, 1::2] = -100
    return {"input_ids": ids, "labels": labels}


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny", "bert-tiny", "roberta-tiny", "albert-tiny",
                                    "electra-tiny", "t5-tiny", "bart-tiny"])
def test_training_forward_has_no_graph_break(preset):
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=300)).train()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):  # what train.compile sets
        explained = torch._dynamo.explain(model)(**_inputs(preset))
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1


def test_eager_models_still_check_their_inputs():
    model = build_model(get_preset("gpt2-tiny", vocab_size=300))
    with pytest.raises(LmlabError, match="out of range"):
        model(input_ids=torch.tensor([[1, 2, 300]]))
    with pytest.raises(LmlabError, match="longer than"):
        model(input_ids=torch.ones(1, 10, dtype=torch.long), position_ids=torch.arange(5000, 5010)[None])


def test_a_masked_lm_with_nothing_masked_has_a_zero_loss_with_a_graph():
    model = build_model(get_preset("bert-tiny", vocab_size=300)).train()
    ids = torch.randint(5, 300, (2, 8))
    hidden = model(input_ids=ids).last_hidden_state
    loss = selected_mean_cross_entropy(*masked_rows(model.heads["mlm"], hidden, torch.full_like(ids, -100)))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
