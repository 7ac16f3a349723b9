"""What every lmlab model returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass
class ModelOutput:
    """The result of a forward pass (field names follow Hugging Face, so code reads the same).

    * ``logits``: the main head's scores. MLM with ``labels``: only the selected positions,
      ``[N, V]`` in row-major order of ``labels != -100`` (the speed path); otherwise ``[B, T, V]``
      (LM), ``[B, T]`` (ELECTRA discriminator), ``[B, C]`` (sequence classification), ...
    * ``loss``: the summed loss of every head that was given labels (None without labels).
    * ``hidden_states``: with ``output_hidden_states=True``, a tuple of ``[B, T, D]``: the
      embeddings first, then one per layer; the last is the final hidden state after any final
      norm, as in transformers.
    * ``last_hidden_state``: the final hidden state ``[B, T, D]`` (always set).
    * ``past_key_values``: with ``use_cache=True``, per layer ``(k, v)`` ``[B, n_kv_heads, T, D]``
      (seq2seq decoders: ``(k, v, cross_k, cross_v)``).
    * ``encoder_last_hidden_state``: seq2seq only, the encoder output.
    * ``extra``: other heads' outputs by name, e.g. ``nsp_logits``, ``start_logits``,
      ``end_logits``, ``pooled``, ``mlm_mask`` and per-head losses ``<head>_loss``.
    """

    logits: Tensor | None = None
    loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    last_hidden_state: Tensor | None = None
    past_key_values: tuple[tuple[Tensor, ...], ...] | None = None
    encoder_last_hidden_state: Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str):
        """``out["logits"]`` works too; unknown keys look in ``extra``."""
        if key in self.__dataclass_fields__ and key != "extra":
            return getattr(self, key)
        return self.extra[key]
