"""Bidirectional Transformer encoders: BERT, RoBERTa, ALBERT, ELECTRA (one class, four configs).

Input representation (Devlin et al. 2019, fig. 2): token + segment + position embeddings,
summed, LayerNorm, dropout. ALBERT and ELECTRA (Lan et al. 2020; Clark et al. 2020) embed tokens
in a smaller width E and project to the model width H (factorized embeddings: V·E + E·H
parameters instead of V·H). RoBERTa (Liu et al. 2019) numbers positions after the padding id.

Then ``n_layers`` post-norm :class:`~lmlab.models.blocks.TransformerBlock` s with a bidirectional
mask (padding keys masked out). ALBERT shares parameters across layers: ``layer_groups=1`` keeps
one block and applies it ``n_layers`` times.

Heads (``models/heads.py``) sit on top: ``EncoderModel(config, heads=("mlm", "nsp"))``.
Labels: ``labels`` goes to the first head, ``<head>_labels`` (e.g. ``nsp_labels``) to the others;
the span head also takes ``start_positions``/``end_positions``.

``first_token_only=True`` (what sentence-classification fine-tuning and evaluation pass): the
``seq_cls`` and ``nsp`` heads read only ``[CLS]``, so the last layer computes its keys and values
at every position but its query, attention output, residuals, norms and FFN at position 0 only:
about one layer's forward and backward saved, same numbers (``last_hidden_state`` is then
``[B, 1, D]``). Since no padded position is returned then, a padded batch is also *packed*
(:class:`~lmlab.models.blocks.Packing`): every layer's projections, FFN, norms and dropout run on
the real tokens only, and only attention sees the padded layout.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.attention_masks import self_attention_mask
from lmlab.models.blocks import (
    LayerNorm,
    Packing,
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerBlock,
    init_weights,
)
from lmlab.models.checkpoint import LmlabModel, eager_checks
from lmlab.models.config import EncoderConfig
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
#: heads that read the first token ([CLS]) only: ``first_token_only`` may skip the rest of the last layer
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


class EncoderModel(LmlabModel):
    """BERT-family encoder with optional heads; ``forward`` returns a :class:`ModelOutput`.

    ``heads=()`` gives the bare encoder (HF ``BertModel``); ``None`` the family's pretraining heads.
    """

    architecture = "encoder"

    def __init__(self, config: EncoderConfig, heads: tuple[str, ...] | list[str] | None = None):
        if not isinstance(config, EncoderConfig):
            raise LmlabError(
                f"EncoderModel needs an EncoderConfig, got {type(config).__name__}",
                "use get_preset('bert-tiny') or EncoderConfig(...)",
            )
        super().__init__(config.validate())
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

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        attention_pattern: Tensor | None = None,
        output_hidden_states: bool = False,
        first_token_only: bool = False,
        doc_ids: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """Hidden states of the last layer ``[B, T, D]`` (and of all layers when asked).

        ``doc_ids`` ``[B, T]``: packed documents, each token attends inside its own;
        ``attention_pattern``: optional boolean ``[T, T]``/``[B, T, T]``/``[B, 1, T, T]`` mask
        (True = may attend), combined with the padding mask; used for UniLM-style masks. One mask
        is built from them (:mod:`lmlab.models.attention_masks`).
        ``first_token_only``: the last layer is computed at position 0 only (it still attends to
        every position) and ``[B, 1, D]`` is returned; with padding (and no ``attention_pattern``)
        the layers run packed, on the real tokens only. With ``output_hidden_states`` every layer
        is computed in full (the states are complete) and position 0 returned.
        """
        self.check_input_ids(input_ids)
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise LmlabError(
                f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids "
                f"{tuple(input_ids.shape)}",
                "pass the mask the tokenizer returned with the ids",
            )
        t = input_ids.shape[1]
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        mask, _ = self_attention_mask(
            causal=False, q_len=t, doc_ids=doc_ids, pattern=attention_pattern, attention_mask=attention_mask,
            dtype=x.dtype, device=x.device, backend=self.backend_now(),
        )
        hidden = [x] if output_hidden_states else None
        cls_only = slice(0, 1) if first_token_only and hidden is None else None
        last = self.config.n_layers - 1
        packing = None
        plain = attention_pattern is None and doc_ids is None
        if cls_only is not None and plain and Packing.worth_it(attention_mask):
            packing = Packing(attention_mask)
            x = packing.unpad(x)  # [1, N, D]: the real tokens
        rope = None
        if self.rotary is not None:
            rope = self.rotary(
                self.embeddings.position_ids(input_ids) if position_ids is None else position_ids
            )
        for i in range(self.config.n_layers):
            x, _ = self.layer(i)(
                x, mask=mask, rope=rope, queries=cls_only if i == last else None, packing=packing
            )
            if hidden is not None:
                hidden.append(x)
        if packing is not None:
            x = x.view(packing.batch, 1, -1)  # [1, B, D]: each sequence's first token
        elif first_token_only:
            x = x[:, :1]
        return x, (tuple(hidden) if hidden is not None else None)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        attention_pattern: Tensor | None = None,
        heads: tuple[str, ...] | None = None,
        first_token_only: bool = False,
        doc_ids: Tensor | None = None,
        label_positions: Tensor | None = None,
        **kwargs,
    ) -> ModelOutput:
        """Encode and run the heads (``heads`` picks a subset; default all).

        Extra keyword labels: ``<head>_labels`` for heads after the first, ``start_positions``
        and ``end_positions`` for ``span``. Seq2seq/decoder-only arguments are rejected.
        ``first_token_only``: every selected head reads only the first token (``seq_cls``,
        ``nsp``), so the last layer is computed there only (see :meth:`encode`); same logits and
        loss, ``last_hidden_state`` ``[B, 1, D]``. ``label_positions``: the flat indices of the
        ``mlm`` labels that are not -100 (:func:`lmlab.objectives.masking.label_positions`), made with
        the labels on the host, so the MLM head gathers its rows without reading the device.
        """
        head_labels = _pop_head_labels(kwargs, self.head_names)
        if first_token_only:
            whole = [h for h in self.selected_heads(heads) if h not in FIRST_TOKEN_HEADS]
            if whole:
                raise LmlabError(
                    f"first_token_only: the {', '.join(whole)} head reads every position",
                    f"use it with the {' and '.join(FIRST_TOKEN_HEADS)} heads only (heads=...)",
                )
        x, hidden = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            attention_pattern,
            output_hidden_states,
            first_token_only,
            doc_ids,
        )
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None
        out = ModelOutput(hidden_states=hidden, last_hidden_state=x)
        if pooled is not None:
            out.extra["pooled"] = pooled
        losses = []
        for i, name in enumerate(self.selected_heads(heads)):
            lab = labels if i == 0 and labels is not None else head_labels.get(name)
            if name == "discriminator" and lab is not None and attention_mask is not None:
                lab = lab.masked_fill(attention_mask == 0, -100)
            if name == "mlm" and label_positions is not None and lab is not None:
                logits, loss = self.heads[name](x, pooled, lab, positions=label_positions)
            else:
                logits, loss = self.heads[name](x, pooled, lab)
            if i == 0:
                out.logits = logits
            out.extra[f"{name}_logits"] = logits
            if name == "mlm" and lab is not None:
                out.extra["mlm_mask"] = lab != -100
            if name == "span":
                out.extra["start_logits"], out.extra["end_logits"] = logits[..., 0], logits[..., 1]
            if loss is not None:
                out.extra[f"{name}_loss"] = loss
                losses.append(loss)
        if losses:
            out.loss = sum(losses[1:], losses[0])
        return out


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
