"""The loss of labels from a model's scores, for callers that bring their own labels (tasks, an
objective that only prepares its inputs): models compute no loss themselves."""

from __future__ import annotations

import torch

from lmlab.losses import head_loss, token_loss


def scored_loss(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss of one batch of a task, from the model's scores (models compute no loss): the
    first head's scores against ``labels`` (``start_positions``/``end_positions`` for ``span``) with
    :mod:`lmlab.losses`; an encoder-decoder is scored under teacher forcing (the decoder reads the
    labels shifted right, as transformers does)."""
    inputs = dict(inputs)
    labels = inputs.pop("labels", None)
    start, end = inputs.pop("start_positions", None), inputs.pop("end_positions", None)
    arch = getattr(model, "architecture", "")
    if arch == "seq2seq":
        if inputs.get("decoder_input_ids") is None:
            from lmlab.models.seq2seq.model import shift_right

            cfg = model.config
            inputs["decoder_input_ids"] = shift_right(labels, cfg.decoder_start_token_id, cfg.pad_token_id)
        return token_loss(model(**inputs).logits, labels)
    logits = model(**inputs).logits
    if start is not None and end is not None:
        labels = torch.stack((start.view(-1), end.view(-1)), dim=1)
    return head_loss(model.head_names[0], logits, labels, inputs.get("attention_mask"))
