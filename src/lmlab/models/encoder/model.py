"""Bidirectional Transformer encoders: BERT, RoBERTa, ALBERT, ELECTRA (one class, four configs).

Input representation (Devlin et al. 2019, fig. 2): token + segment + position embeddings,
summed, LayerNorm, dropout. ALBERT and ELECTRA (Lan et al. 2020; Clark et al. 2020) embed tokens
in a smaller width E and project to the model width H (factorized embeddings: V·E + E·H
parameters instead of V·H). RoBERTa (Liu et al. 2019) numbers positions after the padding id.

Then ``n_layers`` post-norm :class:`~lmlab.models.blocks.TransformerBlock` s with a bidirectional
mask (padding keys masked out). ALBERT shares parameters across layers: ``layer_groups=1`` keeps
one block and applies it ``n_layers`` times.

Objectives call ``model.backbone(input_ids, positions, mask=MaskSpec(...))`` for the hidden
states and the heads they choose (``model.heads``, plain modules of ``models/heads.py``), and
compute their own loss. ``forward`` is the objective-neutral call for users, tasks and Hugging
Face-style code: ``EncoderModel(config, heads=("mlm", "nsp"))(ids, attention_mask)`` returns
scores; tasks compute their loss from them (:func:`lmlab.losses.head_loss`). Given labels it still
adds their losses for one release, with a DeprecationWarning.

``keep=slice(0, 1)`` (what sentence-classification fine-tuning and evaluation pass): the
``seq_cls`` and ``nsp`` heads read only ``[CLS]``, so the last layer computes its keys and values
at every position but its query, attention output, residuals, norms and FFN at position 0 only:
about one layer's forward and backward saved, same numbers (``last_hidden_state`` is then
``[B, 1, D]``). Since no padded position is returned then, a padded batch is also *packed*
(:class:`~lmlab.models.blocks.Packing`): every layer's projections, FFN, norms and dropout run on
the real tokens only, and only attention sees the padded layout. (``first_token_only=True`` is
the same, deprecated.)
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from lmlab.arguments import eager_checks
from lmlab.deprecation import pop_deprecated
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, head_loss, selected_mean_cross_entropy, warn_labels_in_forward
from lmlab.models.attention_masks import MaskSpec, kernel_mask
from lmlab.models.blocks import (
    LayerNorm,
    Packing,
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerBlock,
    init_weights,
)
from lmlab.models.checkpoint import LmlabModel
from lmlab.models.encoder.config import EncoderConfig
from lmlab.models.heads import (
    ENCODER_HEADS,
    DiscriminatorHead,
    MLMHead,
    NSPHead,
    SequenceClassificationHead,
    SpanHead,
    TokenClassificationHead,
    check_heads,
)
from lmlab.models.output import ModelOutput

#: the heads a family gets when none are named (its pretraining objective)
DEFAULT_HEADS = {"bert": ("mlm",), "roberta": ("mlm",), "albert": ("mlm",), "electra": ("discriminator",)}
#: heads that read the first token ([CLS]) only: ``keep=slice(0, 1)`` may skip the rest of the last layer
FIRST_TOKEN_HEADS = ("seq_cls", "nsp")


class EncoderEmbeddings(nn.Module):
    """Token + segment + position embeddings -> LayerNorm -> dropout (-> E->H projection)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        e = cfg.embed_dim
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, e, padding_idx=cfg.pad_token_id)
        self.position = None
        if cfg.positions == "learned":
            self.position = nn.Embedding(cfg.max_positions, e)
        elif cfg.positions == "sinusoidal":
            self.position = SinusoidalPositions(cfg.max_positions, e)
        self.token_type = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.norm = LayerNorm(e, cfg.norm_eps) if cfg.embedding_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        # ALBERT always maps E -> H (even when equal); ELECTRA only when the widths differ
        self.project = nn.Linear(e, cfg.d_model) if e != cfg.d_model or cfg.family == "albert" else None

    def position_ids(self, input_ids: Tensor) -> Tensor:
        t = input_ids.shape[1]
        if self.cfg.positions_from_padding:
            pad = self.cfg.pad_token_id
            real = (input_ids != pad).long()
            return torch.cumsum(real, dim=1) * real + pad
        return torch.arange(t, device=input_ids.device)[None]

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        x = self.word(input_ids)
        if self.position is not None:
            if position_ids is None:
                position_ids = self.position_ids(input_ids)
            if eager_checks() and int(position_ids.max()) >= self.cfg.max_positions:
                limit = self.cfg.max_positions - (
                    self.cfg.pad_token_id + 1 if self.cfg.positions_from_padding else 0
                )
                raise LmlabError(
                    f"sequence of {input_ids.shape[1]} tokens is longer than the model's {limit} positions",
                    f"truncate inputs to {limit} tokens (max_length={limit})",
                )
            x = x + self.position(position_ids)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            elif eager_checks() and (int(token_type_ids.max()) >= self.cfg.type_vocab_size
                                     or int(token_type_ids.min()) < 0):
                raise LmlabError(
                    f"token_type_ids must be below type_vocab_size {self.cfg.type_vocab_size}",
                    "use segment ids 0/1 or build with a larger type_vocab_size",
                )
            x = x + self.token_type(token_type_ids)
        elif token_type_ids is not None and eager_checks() and bool(token_type_ids.any()):
            raise LmlabError(
                "this encoder has no segment embeddings", "drop token_type_ids or set type_vocab_size"
            )
        if self.norm is not None:
            x = self.norm(x)
        x = self.drop(x)
        return self.project(x) if self.project is not None else x


class EncoderLayers(nn.Module):
    """An encoder's Transformer stack without embedding tables: ``[B, T, E]`` embeddings (of
    another model, e.g. shared) -> optional ``E -> d_model`` projection -> ``cfg.n_layers``
    blocks -> hidden states ``[B, T, d_model]``. What ELECTRA's generator asks the family for: a
    smaller backbone on the discriminator's embeddings. Its weights are left as constructed;
    initialise them with :func:`~lmlab.models.blocks.init_weights` (the owner does, once).
    """

    def __init__(self, cfg: EncoderConfig, embed_dim: int):
        super().__init__()
        self.project = nn.Linear(embed_dim, cfg.d_model) if embed_dim != cfg.d_model else None
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        # a rotary model has no position embedding to share: the stack rotates by itself
        self.rotary = RotaryEmbedding(cfg.dim_head, cfg.rope_theta) if cfg.positions == "rotary" else None

    def forward(self, embedded: Tensor, mask: MaskSpec | None = None,
                positions: Tensor | None = None) -> Tensor:
        x = self.project(embedded) if self.project is not None else embedded
        t = x.shape[1]
        kernel, _ = kernel_mask(mask, t, dtype=x.dtype, device=x.device)
        rope = None
        if self.rotary is not None:
            rope = self.rotary(torch.arange(t, device=x.device)[None] if positions is None else positions)
        for layer in self.layers:
            x, _ = layer(x, mask=kernel, rope=rope)
        return x


class EncoderModel(LmlabModel):
    """BERT-family encoder with optional heads; ``forward`` returns a :class:`ModelOutput`.

    ``heads=()`` gives the bare encoder (HF ``BertModel``); ``None`` the family's pretraining heads.
    """

    architecture = "encoder"
    config_class = EncoderConfig
    example_preset = "bert-tiny"

    def __init__(self, config: EncoderConfig, heads: tuple[str, ...] | list[str] | None = None):
        super().__init__(config)
        cfg = config
        heads = DEFAULT_HEADS.get(cfg.family, ("mlm",)) if heads is None else heads
        self.head_names = check_heads(heads, ENCODER_HEADS, "encoder")
        self.embeddings = EncoderEmbeddings(cfg)
        n_blocks = cfg.layer_groups or cfg.n_layers
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(n_blocks))
        # rotary positions (RoFormer, Su et al. 2021): no position embedding; queries and keys are
        # rotated by their position, so attention scores depend on relative offsets only
        self.rotary = RotaryEmbedding(cfg.dim_head, cfg.rope_theta) if cfg.positions == "rotary" else None
        pooler = cfg.pooler
        if pooler is None:
            pooler = "nsp" in self.head_names or (
                "seq_cls" in self.head_names and cfg.family in ("bert", "albert")
            )
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model) if pooler else None
        self.heads = nn.ModuleDict({name: self._make_head(name) for name in self.head_names})
        self.apply(lambda m: init_weights(m, cfg.init_std))
        self.tie_weights()

    def _make_head(self, name: str) -> nn.Module:
        cfg = self.config
        drop = cfg.dropout if cfg.classifier_dropout is None else cfg.classifier_dropout
        if name == "mlm":
            return MLMHead(
                cfg.d_model,
                cfg.embed_dim,
                cfg.vocab_size,
                cfg.head_activation or cfg.activation,
                cfg.norm_eps,
            )
        if name == "nsp":
            return NSPHead(cfg.d_model)
        if name == "discriminator":
            return DiscriminatorHead(cfg.d_model, cfg.head_activation or cfg.activation)
        if name == "seq_cls":
            act = (cfg.head_activation or cfg.activation) if cfg.family == "electra" else "tanh"
            return SequenceClassificationHead(
                cfg.d_model, cfg.num_labels, drop, own_pooler=self.pooler is None, activation=act
            )
        if name == "token_cls":
            return TokenClassificationHead(cfg.d_model, cfg.num_labels, drop)
        return SpanHead(cfg.d_model)

    def tie_weights(self) -> None:
        """MLM decoder shares the token embedding matrix (Press & Wolf 2017) when configured."""
        if "mlm" in self.heads and self.config.tie_embeddings:
            self.heads["mlm"].decoder.weight = self.embeddings.word.weight

    def layer(self, i: int) -> TransformerBlock:
        """The block applied at depth ``i`` (ALBERT: shared across consecutive layers)."""
        return self.layers[i * len(self.layers) // self.config.n_layers]

    def compile(self, *args, **kwargs) -> None:
        """``torch.compile`` the model's call and its stack, which objectives reach through
        :meth:`backbone` (same arguments as ``nn.Module.compile``)."""
        super().compile(*args, **kwargs)
        self._run = torch.compile(self._run, *args, **kwargs)

    def backbone(self, input_ids: Tensor, positions: Tensor | None = None, mask: MaskSpec | None = None,
                 token_type_ids: Tensor | None = None, *, keep: slice | None = None) -> Tensor:
        """Hidden states of the last layer ``[B, T, D]``: the objective-neutral call.

        ``positions``: position ids (default ``0..T-1``, RoBERTa: after the padding id); ``mask``:
        one :class:`~lmlab.models.attention_masks.MaskSpec` (padding, packed documents, a pattern;
        None: every token sees every token). ``keep``: a slice of the positions whose final states
        are needed (e.g. ``slice(0, 1)``, ``[CLS]``): the last layer computes its query, attention
        output, residuals, norms and FFN there only, and ``[B, len(keep), D]`` comes back; with
        padding and nothing but padding in the mask, the layers then run packed, on the real
        tokens only. Same numbers as the full pass at those positions.
        """
        return self._run(input_ids, positions, mask, token_type_ids, keep)[0]

    def _run(self, input_ids: Tensor, positions: Tensor | None, mask: MaskSpec | None,
             token_type_ids: Tensor | None, keep: slice | None,
             output_hidden_states: bool = False) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        self.check_input_ids(input_ids)
        mask = mask or MaskSpec()
        padding = mask.padding
        if padding is not None and padding.shape != input_ids.shape:
            raise LmlabError(
                f"attention_mask shape {tuple(padding.shape)} differs from input_ids "
                f"{tuple(input_ids.shape)}",
                "pass the mask the tokenizer returned with the ids",
            )
        x = self.embeddings(input_ids, token_type_ids, positions)
        kernel, _ = kernel_mask(mask, input_ids.shape[1], dtype=x.dtype, device=x.device,
                                backend=self.backend_now())
        hidden = [x] if output_hidden_states else None
        queries = keep if hidden is None else None
        packing = None
        only_padding = mask.pattern is None and mask.doc_ids is None and mask.prefix is None
        if queries is not None and only_padding and Packing.worth_it(padding):
            packing = Packing(padding)
            x = packing.unpad(x)  # [1, N, D]: the real tokens
        rope = None
        if self.rotary is not None:
            rope = self.rotary(self.embeddings.position_ids(input_ids) if positions is None else positions)
        last = self.config.n_layers - 1
        for i in range(self.config.n_layers):
            x, _ = self.layer(i)(x, mask=kernel, rope=rope, queries=queries if i == last else None,
                                 packing=packing)
            if hidden is not None:
                hidden.append(x)
        if packing is not None:
            x = x.view(packing.batch, -1, x.shape[-1])  # each sequence's kept positions
        elif keep is not None and queries is None:
            x = x[:, keep]
        return x, (tuple(hidden) if hidden is not None else None)

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None,
               token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
               output_hidden_states: bool = False, **deprecated) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """``(last hidden [B, T, D], every layer's states or None)``; :meth:`backbone` is the
        call with one mask description. The mask arguments of older releases (``doc_ids``,
        ``attention_pattern``, ``first_token_only``) still work, with a DeprecationWarning."""
        mask, keep = _legacy_mask(attention_mask, deprecated, "encode")
        return self._run(input_ids, position_ids, mask, token_type_ids, keep, output_hidden_states)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        keep: slice | None = None,
        mask: MaskSpec | None = None,
        **kwargs,
    ) -> ModelOutput:
        """Encode and run every head; ``logits`` are the first head's scores. ``keep``: see
        :meth:`backbone` (``slice(0, 1)`` under heads that read ``[CLS]`` only: sentence
        classification fine-tuning passes it; ``last_hidden_state`` is then ``[B, 1, D]``).
        ``mask``: the attention's description when it is more than ``attention_mask``'s padding
        (packed documents, a pattern).

        Labels (deprecated, kept for one release with a DeprecationWarning: call without labels and
        compute the loss from the scores, :func:`lmlab.losses.head_loss`): ``labels`` for the first
        head, ``<head>_labels`` for the others,
        ``start_positions``/``end_positions`` for ``span``. With ``labels`` the ``mlm`` head scores
        only the positions whose label is not ``IGNORE`` (``logits`` ``[N, V]``). Objectives call
        :meth:`backbone` and the heads they choose instead.
        """
        old_style, old_keep = _legacy_mask(attention_mask, kwargs, "forward")
        mask = old_style if mask is None else dataclasses.replace(mask, padding=attention_mask)
        keep = keep if old_keep is None else old_keep
        chosen = _legacy_heads(kwargs, self)
        label_positions = pop_deprecated(kwargs, "label_positions", "forward")
        head_labels = _pop_head_labels(kwargs, self.head_names)
        if keep is not None:
            whole = [h for h in chosen if h not in FIRST_TOKEN_HEADS]
            if whole:
                raise LmlabError(
                    f"keep={keep}: the {', '.join(whole)} head reads every position",
                    f"use it with the {' and '.join(FIRST_TOKEN_HEADS)} heads only (heads=...)",
                )
        if labels is not None or head_labels:
            warn_labels_in_forward("EncoderModel")
        x, hidden = self._run(input_ids, position_ids, mask, token_type_ids, keep, output_hidden_states)
        pooled = self.pool(x)
        out = ModelOutput(hidden_states=hidden, last_hidden_state=x)
        if pooled is not None:
            out.extra["pooled"] = pooled
        losses = []
        for i, name in enumerate(chosen):
            lab = labels if i == 0 and labels is not None else head_labels.get(name)
            logits, loss = self._score(name, x, pooled, lab, attention_mask, label_positions)
            if i == 0:
                out.logits = logits
            out.extra[f"{name}_logits"] = logits
            if name == "mlm" and lab is not None:
                out.extra["mlm_mask"] = lab != IGNORE
            if name == "span":
                out.extra["start_logits"], out.extra["end_logits"] = logits[..., 0], logits[..., 1]
            if loss is not None:
                out.extra[f"{name}_loss"] = loss
                losses.append(loss)
        if losses:
            out.loss = sum(losses[1:], losses[0])
        return out

    def pool(self, hidden: Tensor) -> Tensor | None:
        """BERT's pooler, ``tanh(W h_[CLS])`` ``[B, D]``, or None when the model has none."""
        return torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None

    def _score(self, name: str, x: Tensor, pooled: Tensor | None, labels: Tensor | None,
               attention_mask: Tensor | None, positions: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One head's scores and, given labels, its loss (:mod:`lmlab.losses`)."""
        head = self.heads[name]
        if labels is None:
            return head(x, pooled), None
        if name == "mlm":
            logits, targets, count = masked_rows(head, x, labels, positions)
            return logits, selected_mean_cross_entropy(logits, targets, count)
        logits = head(x, pooled)
        return logits, head_loss(name, logits, labels, attention_mask)


def masked_rows(head: nn.Module, hidden: Tensor, labels: Tensor,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | int]:
    """An MLM head at the labelled positions only (about 15% of the tokens: most of the head's
    cost saved): ``(logits [N, V], targets [N], count)``. ``positions``: the flat indices
    ``b * T + t`` of ``labels != IGNORE`` in row-major order, made with the labels on the host
    (:func:`lmlab.objectives.masking.label_positions`): the rows are then gathered, not found, and
    nothing waits for the device. Same logits either way."""
    if positions is None:
        selected = labels != IGNORE
        h, targets = hidden[selected], labels[selected]  # [N, D]: only where a loss is taken
        count = selected.sum().clamp(min=1)
    else:
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        targets = labels.reshape(-1).index_select(0, positions)
        count = max(positions.numel(), 1)
    return head(h), targets, count


def _legacy_mask(attention_mask: Tensor | None, kwargs: dict, where: str) -> tuple[MaskSpec, slice | None]:
    """The mask description of a call in the old style (``doc_ids``, ``attention_pattern``,
    ``first_token_only`` as keywords), and the positions to keep."""
    doc_ids = pop_deprecated(kwargs, "doc_ids", where, stacklevel=4)
    pattern = pop_deprecated(kwargs, "attention_pattern", where, stacklevel=4)
    keep = slice(0, 1) if pop_deprecated(kwargs, "first_token_only", where, stacklevel=4) else None
    return MaskSpec(padding=attention_mask, doc_ids=doc_ids, pattern=pattern), keep


def _legacy_heads(kwargs: dict, model: EncoderModel) -> tuple[str, ...]:
    return model.selected_heads(pop_deprecated(kwargs, "heads", "forward", stacklevel=4))


def _pop_head_labels(kwargs: dict, head_names: tuple[str, ...]) -> dict[str, Tensor]:
    """Pick ``<head>_labels`` / span positions out of ``kwargs``; reject anything else that is set."""
    labels = {}
    for name in head_names:
        v = kwargs.pop(f"{name}_labels", None)
        if v is not None:
            labels[name] = v
    start, end = kwargs.pop("start_positions", None), kwargs.pop("end_positions", None)
    if start is not None and end is not None:
        labels["span"] = torch.stack((start.view(-1), end.view(-1)), dim=1)
    for k in ("past_key_values", "encoder_outputs", "decoder_input_ids", "decoder_attention_mask"):
        if kwargs.get(k) is not None:
            raise LmlabError(f"{k} is for decoders / encoder-decoders, not an encoder", f"drop {k}")
        kwargs.pop(k, None)
    kwargs.pop("use_cache", None)
    if kwargs:
        raise LmlabError(
            f"unexpected arguments {sorted(kwargs)} for an encoder",
            "see EncoderModel.forward for the accepted ones",
        )
    return labels
