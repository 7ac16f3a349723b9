"""Task heads: small modules that turn hidden states into scores and, given labels, a loss.

Every head has the same call: ``head(hidden [B,T,D], pooled [B,D] | None, labels) -> (logits, loss)``
(``loss`` is None without labels), so a model is "a Transformer plus a dict of heads" and
fine-tuning swaps the head, not the model.

Encoder heads (Devlin et al. 2019 BERT; Clark et al. 2020 ELECTRA; lecture 3):

* ``mlm`` :class:`MLMHead` - ``dense -> act -> LayerNorm -> decoder`` with the decoder tied to the
  input embeddings. Given labels it projects only the positions with ``labels != -100`` (about
  15% of tokens), which is most of the head's cost saved.
* ``nsp`` :class:`NSPHead` - IsNext/NotNext from the pooled ``[CLS]`` vector.
* ``discriminator`` :class:`DiscriminatorHead` - ELECTRA's per-token "was this token replaced?".
* ``seq_cls`` :class:`SequenceClassificationHead` - classes (or one regression value) from ``[CLS]``.
* ``token_cls`` :class:`TokenClassificationHead` - a label per token (NER).
* ``span`` :class:`SpanHead` - start/end scores for extractive QA (SQuAD).

Decoder heads (Radford et al. 2018/2019): ``lm`` (:class:`LMHead`, the next-token softmax,
optionally tied) and ``cls`` (:class:`LastTokenClassificationHead`, classification from the last
real token's hidden state).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.models.blocks import LayerNorm, get_activation

IGNORE = -100


def classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy over classes, or mean squared error when there is one output (regression)."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).view(-1))
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1).long(), ignore_index=IGNORE)


class MLMHead(nn.Module):
    """Masked-LM head: ``decoder(LayerNorm(act(dense(h))))``, output size ``vocab_size``.

    ``embed_dim`` is the width of the token embeddings (ALBERT/ELECTRA factorize them: the head
    maps back to E before the tied E->V decoder). Tie by assigning ``head.decoder.weight``.
    """

    def __init__(
        self, d_model: int, embed_dim: int, vocab_size: int, activation: str = "gelu", eps: float = 1e-12
    ):
        super().__init__()
        self.dense = nn.Linear(d_model, embed_dim)
        self.act = get_activation(activation)[0]
        self.norm = LayerNorm(embed_dim, eps)
        self.decoder = nn.Linear(embed_dim, vocab_size)

    def forward(
        self, hidden: Tensor, pooled: Tensor | None = None, labels: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``positions``: the flat indices ``b * T + t`` of ``labels != -100`` in row-major order,
        when the caller made them with the labels (on the host): the rows are then gathered, not
        found, and nothing waits for the device. Same logits and loss either way."""
        if labels is None:
            return self.decoder(self.norm(self.act(self.dense(hidden)))), None
        if positions is None:
            selected = labels != IGNORE
            h, targets = hidden[selected], labels[selected]  # [N, D]: only where a loss is taken
            count = selected.sum().clamp(min=1)
        else:
            h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
            targets = labels.reshape(-1).index_select(0, positions)
            count = max(positions.numel(), 1)
        logits = self.decoder(self.norm(self.act(self.dense(h))))
        # the mean over the N selected positions, written so that N = 0 gives a zero loss with a
        # graph and a compiled step needs no branch on N
        total = F.cross_entropy(logits, targets, reduction="sum")
        return logits, total / count


class NSPHead(nn.Module):
    """Next-sentence prediction: ``Linear(pooled) -> 2`` (0 = IsNext, 1 = NotNext, as BERT)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.classifier = nn.Linear(d_model, 2)

    def forward(self, hidden, pooled=None, labels=None):
        if pooled is None:
            raise LmlabError("the nsp head needs the pooler", "build the encoder with pooler=True")
        logits = self.classifier(pooled)
        return logits, None if labels is None else F.cross_entropy(logits, labels.view(-1).long())


class DiscriminatorHead(nn.Module):
    """ELECTRA replaced-token detection: ``dense -> act -> Linear(1)`` per token; logits ``[B, T]``.

    Labels are 1 where the token was replaced (corrupted != original); binary cross-entropy over
    all labelled positions (``-100`` and padding excluded by the model).
    """

    def __init__(self, d_model: int, activation: str = "gelu"):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = get_activation(activation)[0]
        self.prediction = nn.Linear(d_model, 1)

    def forward(self, hidden, pooled=None, labels=None):
        logits = self.prediction(self.act(self.dense(hidden))).squeeze(-1)
        if labels is None:
            return logits, None
        keep = labels != IGNORE
        # the mean over the labelled positions as a masked sum: no shape depends on the data
        targets = labels.clamp(min=0).to(logits.dtype)
        each = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        return logits, (each * keep).sum() / keep.sum().clamp(min=1)


class SequenceClassificationHead(nn.Module):
    """Sentence (pair) classification or regression (``num_labels=1``, MSE) from the first token.

    With the encoder's pooler (BERT) it reads ``pooled``; without one (RoBERTa, ELECTRA) it has its
    own ``act(dense(h_[CLS]))`` layer first (``activation`` tanh; ELECTRA uses gelu).
    """

    def __init__(
        self,
        d_model: int,
        num_labels: int,
        dropout: float = 0.1,
        own_pooler: bool = False,
        activation: str = "tanh",
    ):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model) if own_pooler else None
        self.act = get_activation(activation)[0]
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(self, hidden, pooled=None, labels=None):
        if self.dense is not None:
            pooled = self.act(self.dense(self.drop(hidden[:, 0])))
        elif pooled is None:
            raise LmlabError("the seq_cls head needs the pooler", "build the encoder with pooler=True")
        logits = self.classifier(self.drop(pooled))
        return logits, None if labels is None else classification_loss(logits, labels)


class TokenClassificationHead(nn.Module):
    """A label per token (NER, POS): ``Linear(dropout(h))``; labels ``-100`` are ignored."""

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(self, hidden, pooled=None, labels=None):
        logits = self.classifier(self.drop(hidden))
        return logits, None if labels is None else classification_loss(logits, labels)


class SpanHead(nn.Module):
    """Extractive QA (BERT on SQuAD): ``Linear(h) -> (start, end)`` scores per token.

    logits ``[B, T, 2]``; labels ``[B, 2]`` (start, end token indices). The loss is the mean of
    the start and end cross-entropies; positions outside the sequence are ignored.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.qa = nn.Linear(d_model, 2)

    def forward(self, hidden, pooled=None, labels=None):
        logits = self.qa(hidden)
        if labels is None:
            return logits, None
        t = logits.shape[1]
        start, end = labels[:, 0].clamp(0, t), labels[:, 1].clamp(0, t)
        loss_s = F.cross_entropy(logits[..., 0], start, ignore_index=t)
        loss_e = F.cross_entropy(logits[..., 1], end, ignore_index=t)
        return logits, (loss_s + loss_e) / 2


class LMHead(nn.Module):
    """Next-token softmax ``Linear(h) -> vocab`` (no bias); tie by assigning ``head.proj.weight``.

    Loss: ``-1/N Σ log p(x_{i+1} | x_<=i)`` with labels aligned to the inputs (shifted inside, as in
    transformers) and ``-100`` ignored.
    """

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, hidden, pooled=None, labels=None):
        logits = self.proj(hidden)
        if labels is None:
            return logits, None
        return logits, causal_lm_loss(logits, labels)


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross-entropy: position i predicts ``labels[i + 1]``.

    The labels are shifted (the last position gets ``IGNORE``) instead of slicing the logits, so
    the ``[B, T, V]`` logits are never copied: about 30% less time in the loss on CPU.
    """
    v = logits.shape[-1]
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), ignore_index=IGNORE)


class LastTokenClassificationHead(nn.Module):
    """Classify a sequence from a decoder's last real token (GPT-style; Radford et al. 2018).

    The model passes ``pooled`` = hidden state at the last position whose attention mask is 1.
    """

    def __init__(self, d_model: int, num_labels: int):
        super().__init__()
        self.score = nn.Linear(d_model, num_labels, bias=False)

    def forward(self, hidden, pooled=None, labels=None):
        logits = self.score(hidden[:, -1] if pooled is None else pooled)
        return logits, None if labels is None else classification_loss(logits, labels)


ENCODER_HEADS = ("mlm", "nsp", "discriminator", "seq_cls", "token_cls", "span")
DECODER_HEADS = ("lm", "cls")


def check_heads(heads, allowed: tuple[str, ...], kind: str) -> tuple[str, ...]:
    heads = tuple(heads)
    bad = [h for h in heads if h not in allowed]
    if bad:
        raise LmlabError(f"unknown {kind} heads {bad}", f"choose among: {', '.join(allowed)}")
    if len(set(heads)) != len(heads):
        raise LmlabError(f"heads {list(heads)} name one head twice", "list each head once")
    return heads
