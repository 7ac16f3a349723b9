"""Prompt tuning (Lester et al. 2021, "The Power of Scale for Parameter-Efficient Prompt Tuning").

``P`` trainable embedding vectors - a soft prompt - join the token embeddings of every input;
the frozen model then runs on ``P + T`` positions and only the prompt (``P × embed_dim``
numbers) is trained. It is the input-layer-only cousin of prefix tuning (:mod:`lmlab.adapt.prefix`).

Where the prompt goes, so that positions, masks and heads stay right:

* encoders (BERT, RoBERTa, ALBERT, ELECTRA): right after the first token, ``[CLS] p_1..p_P x_1..``,
  so the ``[CLS]`` vector the classification head and pooler read is still position 0;
  ``before_cls=True`` puts it in front, ``p_1..p_P [CLS] x_1..``, as the ``peft`` library does
  (its head then reads ``p_1``; :mod:`lmlab.adapt.peft_export` needs this for encoders);
* decoders (GPT-2, Llama): in front, ``p_1..p_P x_1..``; the last-token head finds the last real
  token through the (extended) attention mask; with a KV cache only the first call inserts the
  prompt, later calls just extend the mask and shift explicit ``position_ids`` by ``P``;
* encoder-decoders (T5, BART): in front of the encoder input (the paper's T5 setting); the
  decoder cross-attends to the prompt positions too. :meth:`encode` is covered as well, so
  generation (which encodes once) sees the prompt.

The attention mask gets ``P`` ones, segment ids ``P`` zeros, token-level labels ``P`` ignored
(-100) entries and span positions a shift of ``P``; token-level outputs (LM/MLM/token logits,
span logits, hidden states) come back with the prompt positions removed, so they line up with
the caller's tokens. Position embeddings number the prompt like real tokens (positions 1..P for
an encoder), as when a text prompt is prepended.

No model code is edited: the model gets forward hooks (a pre-hook rewrites the arguments, a
post-hook strips the outputs) and its token-embedding module a hook that writes the prompt
vectors into the ``P`` slots, which hold a placeholder id (never the padding id, which RoBERTa's
position numbering skips).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from lmlab.adapt import freeze_base, unfreeze_task_heads
from lmlab.adapt.options import typed_options
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE

#: heads whose outputs have one entry per input token
TOKEN_HEADS = ("mlm", "discriminator", "token_cls", "span", "lm")


def strip_prompt(out, b: int, ext: int, at: int, p: int, heads) -> None:
    """Remove the ``p`` prompt positions at ``at`` from the token-level outputs in ``out`` (a
    ModelOutput of a ``b × ext`` input), so that they line up with the caller's tokens."""
    keep = torch.cat((torch.arange(at), torch.arange(at + p, ext)))

    def strip(t):
        if isinstance(t, Tensor) and t.dim() >= 2 and t.shape[0] == b and t.shape[1] == ext:
            return t[:, keep.to(t.device)]
        return t

    if heads and heads[0] in TOKEN_HEADS:
        out.logits = strip(out.logits)
    out.last_hidden_state = strip(out.last_hidden_state)
    if out.hidden_states is not None:
        out.hidden_states = tuple(strip(h) for h in out.hidden_states)
    token_outputs = {"start_logits", "end_logits", "mlm_mask"} | {f"{h}_logits" for h in TOKEN_HEADS}
    for key in list(out.extra):
        if key in token_outputs:
            out.extra[key] = strip(out.extra[key])


class SoftPrompt(nn.Module):
    """The ``P × embed_dim`` trainable prompt."""

    def __init__(self, embedding: Tensor):
        super().__init__()
        self.embedding = nn.Parameter(embedding)

    @property
    def length(self) -> int:
        return self.embedding.shape[0]


def input_embedding(model: nn.Module) -> nn.Embedding:
    """The token-embedding table of an lmlab Transformer."""
    for path in ("embeddings.word", "tok_embed", "embed_tokens"):
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, nn.Embedding):
            return module
    raise LmlabError(
        f"{type(model).__name__} has no token embedding to prompt",
        "use an lmlab encoder, decoder or encoder-decoder",
    )


class _PromptHooks:
    """The argument rewriting around ``model.forward`` (and ``model.encode`` for seq2seq)."""

    def __init__(self, model: nn.Module, prompt: SoftPrompt, before_cls: bool = False):
        self.prompt = prompt
        self.arch = model.architecture
        cfg = model.config
        self.at = 1 if self.arch == "encoder" and not before_cls else 0
        self.placeholder = 0 if cfg.pad_token_id != 0 else 1
        self.limit = None
        if getattr(cfg, "positions", None) in ("learned", "sinusoidal"):
            self.limit = cfg.max_positions - (
                cfg.pad_token_id + 1 if getattr(cfg, "positions_from_padding", False) else 0
            )
        self.signature = inspect.signature(model.forward)
        self.slot: int | None = None  # where the embedding hook writes the prompt during a call
        self.pending: tuple[int, int] | None = None  # (batch, extended length) to strip outputs
        self.head_names = tuple(getattr(model, "head_names", ()))

    # ------------------------------------------------------------------ helpers
    @property
    def p(self) -> int:
        return self.prompt.length

    def _insert(self, t: Tensor, value, at: int | None = None) -> Tensor:
        """``t`` ``[B, T, ...]`` with ``P`` entries of ``value`` inserted at ``at`` along dim 1."""
        at = self.at if at is None else at
        fill = torch.full((t.shape[0], self.p, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
        return torch.cat((t[:, :at], fill, t[:, at:]), dim=1)

    def _insert_ids(self, ids: Tensor, at: int) -> Tensor:
        if self.limit is not None and ids.shape[1] + self.p > self.limit:
            raise LmlabError(
                f"{ids.shape[1]} tokens plus a soft prompt of {self.p} exceed the model's "
                f"{self.limit} positions",
                f"truncate inputs to {self.limit - self.p} tokens (or use fewer virtual tokens)",
            )
        return self._insert(ids, self.placeholder, at)

    def _positions(self, pos: Tensor, at: int) -> Tensor:
        """Explicit position ids: the prompt takes the positions after the first ``at`` tokens."""
        start = pos[:, at - 1 : at] + 1 if at > 0 else torch.zeros_like(pos[:, :1])
        prompt = start + torch.arange(self.p, device=pos.device)[None]
        return torch.cat((pos[:, :at], prompt, pos[:, at:] + self.p), dim=1)

    def embed_hook(self, module: nn.Module, inputs, out: Tensor) -> Tensor | None:
        if self.slot is None:
            return None
        at = self.slot
        prompt = self.prompt.embedding.to(out.dtype)[None].expand(out.shape[0], -1, -1)
        return torch.cat((out[:, :at], prompt, out[:, at + self.p :]), dim=1)

    # ------------------------------------------------------------------ encoder / decoder
    def pre_forward(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict[str, Any]]:
        self.slot = self.pending = None  # a previous call that raised must not leave these set
        bound = self.signature.bind(*args, **kwargs)
        kw = dict(bound.arguments)
        kw.update(kw.pop("kwargs", {}))
        if self.arch == "seq2seq":
            return (), self._seq2seq_arguments(kw)
        ids = kw.get("input_ids")
        if kw.get("attention_pattern") is not None:
            raise LmlabError(
                "prompt tuning does not support attention_pattern",
                "drop attention_pattern or use prefix tuning",
            )
        if kw.get("past_key_values") is not None:  # cached decoding: the prompt is in the cache already
            mask, past = kw.get("attention_mask"), kw["past_key_values"][0][0].shape[2]
            if mask is not None and mask.shape[1] + self.p == past + ids.shape[1]:
                kw["attention_mask"] = self._insert(mask, 1, 0)
            if kw.get("position_ids") is not None:
                kw["position_ids"] = kw["position_ids"] + self.p
            return (), kw
        at = min(self.at, ids.shape[1])
        b, t = ids.shape
        kw["input_ids"] = self._insert_ids(ids, at)
        for name, value in (("attention_mask", 1), ("token_type_ids", 0)):
            if kw.get(name) is not None:
                kw[name] = self._insert(kw[name], value, at)
        if kw.get("position_ids") is not None:
            kw["position_ids"] = self._positions(kw["position_ids"].expand(b, -1), at)
        heads = kw.get("heads") or self.head_names
        label_keys = [("labels", heads[0] if heads else None)]
        label_keys += [(f"{h}_labels", h) for h in heads]
        for key, head in label_keys:
            lab = kw.get(key)
            if lab is not None and head in TOKEN_HEADS and lab.shape[:2] == (b, t):
                kw[key] = self._insert(lab, IGNORE, at)
        for key in ("start_positions", "end_positions"):
            if kw.get(key) is not None:
                pos = kw[key]
                kw[key] = torch.where(pos >= at, pos + self.p, pos)
        self.slot, self.pending = at, (b, t + self.p)
        return (), kw

    def post_forward(self, model: nn.Module, args, kwargs, out):
        self.slot = None
        if self.pending is None or out is None:
            return out
        (b, ext), self.pending = self.pending, None
        heads = kwargs.get("heads") or self.head_names
        strip_prompt(out, b, ext, min(self.at, ext - self.p), self.p, heads)
        return out

    # ------------------------------------------------------------------ encoder-decoder
    def _seq2seq_arguments(self, kw: dict[str, Any]) -> dict[str, Any]:
        """Extend the source mask by ``P`` when the encoder output (to be computed, given, or held
        in the cache) includes the prompt; :meth:`encode` inserts the prompt itself."""
        mask = kw.get("attention_mask")
        if mask is None:
            return kw
        enc = kw.get("encoder_outputs")
        if enc is not None:
            for attr in ("encoder_last_hidden_state", "last_hidden_state"):
                if getattr(enc, attr, None) is not None:
                    enc = getattr(enc, attr)
                    break
            enc = enc[0] if isinstance(enc, (tuple, list)) else enc
            length = enc.shape[1]
        elif kw.get("past_key_values") is not None:
            length = kw["past_key_values"][0][2].shape[2]
        elif kw.get("input_ids") is not None:
            length = kw["input_ids"].shape[1] + self.p
        else:
            return kw
        if mask.shape[1] + self.p == length:
            kw["attention_mask"] = self._insert(mask, 1, 0)
        return kw

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
    ):
        """Stands in for ``model.encode`` (seq2seq): the encoder input gets the prompt."""
        t = input_ids.shape[1]
        if attention_mask is not None and attention_mask.shape[1] == t:
            attention_mask = self._insert(attention_mask, 1, 0)
        if position_ids is not None:
            position_ids = self._positions(position_ids.expand(input_ids.shape[0], -1), 0)
        ids = self._insert_ids(input_ids, 0)
        self.slot = 0
        try:
            return self.original_encode(ids, attention_mask, position_ids, output_hidden_states)
        finally:
            self.slot = None


@typed_options("prompt")
def apply_prompt(
    model: nn.Module,
    num_virtual_tokens: int = 20,
    init: str = "vocab",
    seed: int = 0,
    train_head: bool = True,
    before_cls: bool = False,
) -> None:
    """Freeze ``model`` and give it a trainable soft prompt of ``num_virtual_tokens`` embeddings
    (``model.soft_prompt``), in place.

    ``init="vocab"``: copies of the embeddings of random vocabulary tokens (Lester et al.'s
    "sampled vocabulary", ids above the first 1000 where specials live, when there are enough);
    ``"random"``: N(0, σ²) with σ the embedding table's own standard deviation.
    ``before_cls``: encoders put the prompt in front of ``[CLS]`` (as peft) instead of after it.
    """
    # the arguments' kinds and ranges: @typed_options (lmlab.adapt.options), as apply_method's
    arch = getattr(model, "architecture", "")
    if arch not in ("encoder", "decoder", "seq2seq"):
        raise LmlabError(
            f"prompt tuning needs an encoder, decoder or encoder-decoder, not {arch or 'this model'}",
            "use an lmlab Transformer",
        )
    table = input_embedding(model)
    weight = table.weight.detach()
    g = torch.Generator().manual_seed(seed)
    if init == "vocab":
        vocab = weight.shape[0]
        low = 1000 if vocab > 2000 else min(10, vocab - 1)
        ids = torch.randint(low, vocab, (num_virtual_tokens,), generator=g)
        start = weight[ids.to(weight.device)].clone()
    else:
        start = torch.randn(num_virtual_tokens, weight.shape[1], generator=g) * float(weight.float().std())
        start = start.to(weight.device, weight.dtype)
    freeze_base(model)
    model.soft_prompt = SoftPrompt(start)
    hooks = _PromptHooks(model, model.soft_prompt, before_cls)
    model._prompt_hooks = hooks
    table.register_forward_hook(hooks.embed_hook)
    model.register_forward_pre_hook(hooks.pre_forward, with_kwargs=True)
    model.register_forward_hook(hooks.post_forward, with_kwargs=True)
    if arch == "seq2seq":  # bound methods, not closures: copy.deepcopy(model) stays consistent
        hooks.original_encode = model.encode
        model.encode = hooks.encode
    unfreeze_task_heads(model, train_head)
