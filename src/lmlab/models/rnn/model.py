"""Recurrent language models: the ELMo bidirectional LM and a plain LSTM LM.

**ELMo** (Peters et al. 2018, "Deep contextualized word representations"; the biLM follows
Jozefowicz et al. 2016, "Exploring the limits of language modeling"):

1. *Token representation* ``x_k`` from the token's characters only, so any word has a vector:
   character embeddings -> 1-D convolutions of several widths, each max-pooled over the
   characters and passed through ReLU -> highway layers
   ``y = g * x + (1 - g) * relu(W_h x)``, ``g = sigmoid(W_g x)`` -> linear projection to ``d_model``.
2. Two separate stacks of LSTMs read the token representations, one left-to-right (predicts
   ``t_{k+1}`` from ``t_1..t_k``) and one right-to-left (predicts ``t_{k-1}`` from ``t_k..t_N``).
   Each layer is an LSTM with ``d_hidden`` cells whose output is projected to ``d_model``
   (LSTMP), with a residual connection around every layer above the first.
3. Both directions share the token representation and the softmax layer. The loss is the sum of
   the two directions' mean negative log-likelihoods.
4. Layer ``j`` of the biLM represents token ``k`` as ``h_{k,j} = [fwd_{k,j}; bwd_{k,j}]``, layer 0
   being ``[x_k; x_k]``. A downstream task collapses them with :class:`ScalarMix`,
   ``ELMo_k = gamma * sum_j softmax(s)_j h_{k,j}``.

**LSTM LM** (the language model Dai & Le 2015, "Semi-supervised sequence learning", pretrain
before fine-tuning): embeddings -> stacked LSTM -> softmax, with the option of tying the output
matrix to the input embeddings (Press & Wolf 2017). It is a left-to-right decoder, so
:func:`lmlab.generate.generate` drives it; its "cache" is the LSTM state.

Character input format (ELMo)
-----------------------------
A token string becomes ``max_chars`` character ids: ``BOW``, the token's UTF-8 bytes (cut to
``max_chars - 2``), ``EOW``, then ``PAD`` up to ``max_chars``. Ids: ``PAD = 0``, ``BOW = 1``,
``EOW = 2``, byte ``b`` -> ``3 + b``, so the character vocabulary has :data:`CHAR_VOCAB_SIZE`
(259) entries and no character is ever unknown. The model keeps a ``char_table`` buffer
``[vocab_size, max_chars]`` (saved with the weights) built from the token strings of the
tokenizer, so ``model(input_ids)`` works with ordinary token ids; ``model(char_ids=...)`` with
``[B, T, max_chars]`` ids from :func:`encode_token_chars` works too.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lmlab import values
from lmlab.arguments import flag_argument, number_argument, text_list_argument
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, warn_labels_in_forward
from lmlab.models.checkpoint import LmlabModel
from lmlab.models.output import ModelOutput
from lmlab.models.rnn.config import RNNConfig

CHAR_PAD, CHAR_BOW, CHAR_EOW = 0, 1, 2
CHAR_BYTE_OFFSET = 3
CHAR_VOCAB_SIZE = CHAR_BYTE_OFFSET + 256

# nn.LSTM with proj_size falls back from oneDNN to PyTorch's own kernel on CPU and says so on every
# process start; the fallback is correct, so keep the message out of users' logs.
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")


# --------------------------------------------------------------------------- character ids
def encode_token_chars(tokens: Sequence[str], max_chars: int) -> torch.Tensor:
    """Token strings -> ``[len(tokens), max_chars]`` character ids (see the module docstring)."""
    if max_chars < 3:
        raise LmlabError(f"max_chars={max_chars} leaves no room for a character", "use max_chars >= 3")
    out = torch.full((len(tokens), max_chars), CHAR_PAD, dtype=torch.long)
    for i, tok in enumerate(tokens):
        body = [CHAR_BYTE_OFFSET + b for b in tok.encode("utf-8")[: max_chars - 2]]
        row = [CHAR_BOW, *body, CHAR_EOW]
        out[i, : len(row)] = torch.tensor(row)
    return out


# --------------------------------------------------------------------------- building blocks
class Highway(nn.Module):
    """Highway layers (Srivastava et al. 2015): ``y = g * x + (1 - g) * relu(W_h x)``.

    The gate bias starts at +1 (as in Jozefowicz et al.) so the layers begin close to identity.
    """

    def __init__(self, dim: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(n_layers))
        for layer in self.layers:
            nn.init.constant_(layer.bias[dim:], 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h, g = layer(x).chunk(2, dim=-1)
            g = torch.sigmoid(g)
            x = g * x + (1 - g) * F.relu(h)
        return x


class CharCNN(nn.Module):
    """ELMo's token encoder: character CNN + highway + projection, ``[..., C] -> [..., d_model]``."""

    def __init__(self, config: RNNConfig):
        super().__init__()
        self.char_embed = nn.Embedding(CHAR_VOCAB_SIZE, config.char_dim, padding_idx=CHAR_PAD)
        self.convs = nn.ModuleList(nn.Conv1d(config.char_dim, n, w) for w, n in config.char_filters)
        n_filters = sum(n for _, n in config.char_filters)
        self.highway = Highway(n_filters, config.n_highway)
        self.proj = nn.Linear(n_filters, config.d_model)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        lead = char_ids.shape[:-1]
        e = self.char_embed(char_ids.reshape(-1, char_ids.shape[-1])).transpose(1, 2)  # [N, char_dim, C]
        # each filter width: convolve over characters, max-pool over time, then ReLU
        feats = [F.relu(conv(e).max(dim=-1).values) for conv in self.convs]
        x = self.proj(self.highway(torch.cat(feats, dim=-1)))
        return x.reshape(*lead, -1)


class StackedLSTM(nn.Module):
    """Stacked LSTM layers that expose every layer's output.

    Each layer is ``nn.LSTM`` with ``d_hidden`` cells; when ``d_hidden > d_model`` its output is
    projected to ``d_model`` inside the cell (LSTMP, ``proj_size``). With ``residual`` every layer
    above the first adds its input to its output. Dropout is applied between layers.
    The recurrent state is a tuple of per-layer ``(h, c)`` with shapes ``[B, d_model]`` and
    ``[B, d_hidden]`` (batch first, so beam search can reorder it like a KV cache).
    """

    def __init__(self, config: RNNConfig, residual: bool):
        super().__init__()
        proj = config.d_model if config.d_hidden > config.d_model else 0
        self.layers = nn.ModuleList(
            nn.LSTM(config.d_model, config.d_hidden, batch_first=True, proj_size=proj)
            for _ in range(config.n_layers)
        )
        self.residual = residual
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, state: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None):
        """``x [B, T, d_model]`` -> (list of per-layer outputs ``[B, T, d_model]``, new state)."""
        outputs, new_state = [], []
        for i, lstm in enumerate(self.layers):
            hc = None
            if state is not None:
                h, c = state[i]
                hc = (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous())
            y, (h, c) = lstm(self.dropout(x) if i else x, hc)
            if self.residual and i:
                y = y + x
            outputs.append(y)
            new_state.append((h.squeeze(0), c.squeeze(0)))
            x = y
        return outputs, tuple(new_state)


class ScalarMix(nn.Module):
    """ELMo's task-specific layer combination ``gamma * sum_j softmax(s)_j h_j`` (Peters et al. eq. 1).

    ``s`` (one scalar per layer, start 0 = plain average) and ``gamma`` (start 1) are learned
    with the downstream task. With ``layer_norm`` each layer is first normalised per token
    (no learned affine), as the paper suggests for some tasks.
    """

    def __init__(self, num_layers: int, layer_norm: bool = False):
        super().__init__()
        number_argument(values.Count, num_layers, "ScalarMix's num_layers")
        flag_argument(layer_norm, "ScalarMix's layer_norm")
        self.scalars = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))
        self.layer_norm = layer_norm

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """``layers``: a sequence of L tensors of equal shape, or one ``[L, ...]`` tensor."""
        if len(layers) != self.scalars.numel():
            raise LmlabError(f"ScalarMix was built for {self.scalars.numel()} layers but got {len(layers)}",
                             "build it with num_layers = number of biLM layers + 1")
        h = torch.stack(list(layers)) if not isinstance(layers, torch.Tensor) else layers
        if self.layer_norm:
            h = F.layer_norm(h, h.shape[-1:])
        w = torch.softmax(self.scalars, dim=0).to(h.dtype)
        return self.gamma * torch.einsum("l,l...->...", w, h)


# --------------------------------------------------------------------------- shared model base
class _RNNBase(LmlabModel):
    architecture = "rnn"
    config_class = RNNConfig
    example_preset = "lstm-tiny"

    def __init__(self, config: RNNConfig):
        super().__init__(config)  # checked to be an RNNConfig and validated there

    def _reject(self, unused: dict) -> None:
        """Arguments of the Transformer forward signature that a recurrent model cannot honour."""
        given = sorted(k for k, v in unused.items() if v is not None)
        if given:
            raise LmlabError(f"{type(self).__name__} does not take {', '.join(given)}",
                             "drop them (recurrent models read tokens in order; no positions or segments)")


def _ordering(mask: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Per-row permutation putting real tokens first (in reading order, or reversed), pads last.

    Gathering with it lets one LSTM call handle right-, left- or any padding: the LSTM only ever
    sees a row's real tokens, in its own direction, before any padding.
    """
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    key = torch.where(mask.bool(), (T - 1 - pos) if reverse else pos, T + pos)
    return key.argsort(dim=1, stable=True)


def _gather_time(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    idx = order if x.dim() == 2 else order.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    return x.gather(1, idx)


def _scatter_time(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_gather_time` for the same ``order``."""
    return _gather_time(x, order.argsort(dim=1))


def _next_token_nll(logits: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean NLL of predicting ``labels[:, i+1]`` from ``logits[:, i]`` for ``i + 1 < length``."""
    T = labels.shape[1]
    targets = labels[:, 1:].clone()
    beyond = torch.arange(1, T, device=labels.device)[None, :] >= lengths[:, None]
    targets[beyond] = IGNORE
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


# --------------------------------------------------------------------------- ELMo
class ELMoBiLM(_RNNBase):
    """ELMo bidirectional LM: character CNN tokens, separate forward/backward LSTMs, shared softmax.

    The output's ``logits`` are the forward LM's (position t predicts token t+1);
    ``extra["backward_logits"]`` are the backward LM's (position t predicts token t-1). With labels,
    ``loss = extra["forward_loss"] + extra["backward_loss"]``. ``hidden_states`` (always filled)
    are the L+1 biLM layers ``[B, T, 2 * d_model]``; ``last_hidden_state`` is the top one.
    """

    example_preset = "elmo-tiny"

    def __init__(self, config: RNNConfig, vocab: Sequence[str] | None = None):
        super().__init__(config)
        self.token_encoder = CharCNN(config)
        self.forward_lstm = StackedLSTM(config, residual=config.residual)
        self.backward_lstm = StackedLSTM(config, residual=config.residual)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(config.d_model, config.vocab_size)
        self.register_buffer("char_table", torch.zeros(config.vocab_size, config.max_chars, dtype=torch.long))
        if vocab is not None:
            self.set_vocab(text_list_argument(vocab, "ELMoBiLM's vocab"))

    def set_vocab(self, vocab: Sequence[str]) -> None:
        """Build the token-id -> characters table from the tokenizer's token strings (id order)."""
        if len(vocab) != self.config.vocab_size:
            raise LmlabError(f"vocabulary has {len(vocab)} tokens but the model was built for "
                             f"{self.config.vocab_size}",
                             "build the config with vocab_size=len(tokenizer.vocab)")
        self.char_table.copy_(encode_token_chars(vocab, self.config.max_chars).to(self.char_table.device))

    # ----- the two halves of the forward pass (exposed for analysis and tests)
    def token_representation(self, input_ids: torch.Tensor | None = None,
                             char_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Layer 0: the character-CNN representation ``x_k`` of each token, ``[B, T, d_model]``."""
        if char_ids is None:
            if input_ids is None:
                raise LmlabError("ELMo needs input_ids or char_ids", "pass one of them")
            self.check_input_ids(input_ids)
            if not bool(self.char_table.any()):
                raise LmlabError("this ELMo model has no character table",
                                 "call model.set_vocab(tokenizer.vocab) once after building it")
            char_ids = self.char_table[input_ids]
        elif char_ids.dim() != 3 or char_ids.shape[-1] != self.config.max_chars:
            raise LmlabError(f"char_ids must be [batch, time, {self.config.max_chars}], "
                             f"got {tuple(char_ids.shape)}", "build them with encode_token_chars()")
        return self.token_encoder(char_ids)

    def contextualize(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """Run both LSTM stacks over token representations ``x``.

        Returns ``(forward_layers, backward_layers)``: lists of ``n_layers`` tensors
        ``[B, T, d_model]`` in the original token order. The forward stack at position t has
        read tokens ``<= t`` only, the backward stack tokens ``>= t`` only (padding excluded).
        """
        mask = attention_mask
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        x = self.dropout(x)
        results = []
        for stack, reverse in ((self.forward_lstm, False), (self.backward_lstm, True)):
            order = _ordering(mask, reverse)
            layers, _ = stack(_gather_time(x, order))
            results.append([_scatter_time(h, order) for h in layers])
        return results[0], results[1]

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, char_ids: torch.Tensor | None = None,
                output_hidden_states: bool = True, **unused) -> ModelOutput:
        """Both LMs over a batch. ``labels`` (usually ``input_ids``; -100 = ignore) turn on the loss
        (deprecated, one more release with a DeprecationWarning: the elmo objective computes it)."""
        self._reject(unused)
        x = self.token_representation(input_ids, char_ids)
        fwd, bwd = self.contextualize(x, attention_mask)
        hidden = (torch.cat([x, x], dim=-1),) + tuple(torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd))
        logits = self.softmax(self.dropout(fwd[-1]))
        backward_logits = self.softmax(self.dropout(bwd[-1]))
        out = ModelOutput(logits=logits, hidden_states=hidden, last_hidden_state=hidden[-1],
                          extra={"backward_logits": backward_logits})
        if labels is not None:
            warn_labels_in_forward("ELMo")
            mask = torch.ones_like(labels) if attention_mask is None else attention_mask
            lengths = mask.sum(dim=1)
            losses = []
            for lg, reverse in ((logits, False), (backward_logits, True)):
                order = _ordering(mask, reverse)
                losses.append(_next_token_nll(_gather_time(lg, order), _gather_time(labels, order), lengths))
            out.extra["forward_loss"], out.extra["backward_loss"] = losses
            out.loss = losses[0] + losses[1]
        return out

    def layer_outputs(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                      char_ids: torch.Tensor | None = None) -> torch.Tensor:
        """All biLM layers stacked, ``[n_layers + 1, B, T, 2 * d_model]``: feed it to :class:`ScalarMix`."""
        x = self.token_representation(input_ids, char_ids)
        fwd, bwd = self.contextualize(x, attention_mask)
        return torch.stack([torch.cat([x, x], -1)] + [torch.cat([f, b], -1) for f, b in zip(fwd, bwd)])


# --------------------------------------------------------------------------- LSTM LM
class LSTMLanguageModel(_RNNBase):
    """Left-to-right LSTM LM (Dai & Le 2015), optionally with tied input/output embeddings."""

    def __init__(self, config: RNNConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.lstm = StackedLSTM(config, residual=config.residual)
        self.dropout = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, past_key_values=None, use_cache: bool = False,
                output_hidden_states: bool = False, **unused) -> ModelOutput:
        """Next-token logits ``[B, T, V]``; ``labels`` (shifted inside, -100 ignored) give the CLM loss
        (deprecated, one more release with a DeprecationWarning: objectives and tasks compute it).

        ``past_key_values`` is the recurrent state returned by a previous call with
        ``use_cache=True`` (per layer ``(h, c)``); the new tokens continue from it.
        ``attention_mask`` only masks the loss: padded prompts are not supported for generation.
        """
        self._reject(unused)
        self.check_input_ids(input_ids)
        x = self.embed(input_ids)
        layers, state = self.lstm(self.dropout(x), past_key_values)
        logits = self.lm_head(self.dropout(layers[-1]))
        out = ModelOutput(logits=logits, last_hidden_state=layers[-1])
        if output_hidden_states:
            out.hidden_states = (x, *layers)
        if use_cache:
            out.past_key_values = state
        if labels is not None:
            warn_labels_in_forward("LSTMLanguageModel")
            if attention_mask is not None:
                labels = labels.masked_fill(attention_mask == 0, IGNORE)
            targets = labels[:, 1:].flatten()
            out.loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets, ignore_index=IGNORE)
        return out


RNN_FAMILIES = {"elmo": ELMoBiLM, "lstm": LSTMLanguageModel}


def build_rnn(config: RNNConfig) -> _RNNBase:
    """The recurrent model for ``config.family`` ("elmo" or "lstm")."""
    if config.family not in RNN_FAMILIES:
        raise LmlabError(f"unknown recurrent family {config.family!r}",
                         f"use one of {', '.join(RNN_FAMILIES)}")
    return RNN_FAMILIES[config.family](config)
