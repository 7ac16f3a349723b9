"""Heads: plain modules that turn hidden states into scores. No losses here: the objectives and
tasks that choose a head compute their loss from its scores (:mod:`lmlab.losses`).

Every head has the same call, ``head(hidden, pooled=None) -> scores``: ``hidden`` ``[..., D]``
(every position, or only the rows the caller selected) and ``pooled`` ``[B, D]`` (the encoder's
pooled ``[CLS]`` vector, or a decoder's last real token) for the heads that read one vector per
sequence. A model is "a Transformer plus a dict of heads", so fine-tuning swaps the head, not the
model.

Encoder heads (Devlin et al. 2019 BERT; Clark et al. 2020 ELECTRA; lecture 3):

* ``mlm`` :class:`MLMHead` - ``dense -> act -> LayerNorm -> decoder`` with the decoder tied to the
  input embeddings; callers pass only the rows they score (about 15% of tokens), which is most
  of the head's cost saved.
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

from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.losses import (  # noqa: F401  (re-exported from their old home for one release)
    IGNORE,
    causal_lm_loss,
    classification_loss,
)
from lmlab.models.blocks import LayerNorm, get_activation


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

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        return self.decoder(self.norm(self.act(self.dense(hidden))))


class NSPHead(nn.Module):
    """Next-sentence prediction: ``Linear(pooled) -> 2`` (0 = IsNext, 1 = NotNext, as BERT)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.classifier = nn.Linear(d_model, 2)

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        if pooled is None:
            raise LmlabError("the nsp head needs the pooler", "build the encoder with pooler=True")
        return self.classifier(pooled)


class DiscriminatorHead(nn.Module):
    """ELECTRA replaced-token detection: ``dense -> act -> Linear(1)`` per token; scores ``[B, T]``
    (positive: replaced)."""

    def __init__(self, d_model: int, activation: str = "gelu"):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = get_activation(activation)[0]
        self.prediction = nn.Linear(d_model, 1)

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        return self.prediction(self.act(self.dense(hidden))).squeeze(-1)


class SequenceClassificationHead(nn.Module):
    """Sentence (pair) classification or regression (``num_labels=1``) from the first token.

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

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        if self.dense is not None:
            pooled = self.act(self.dense(self.drop(hidden[:, 0])))
        elif pooled is None:
            raise LmlabError("the seq_cls head needs the pooler", "build the encoder with pooler=True")
        return self.classifier(self.drop(pooled))


class TokenClassificationHead(nn.Module):
    """A label per token (NER, POS): ``Linear(dropout(h))``."""

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        return self.classifier(self.drop(hidden))


class SpanHead(nn.Module):
    """Extractive QA (BERT on SQuAD): ``Linear(h) -> (start, end)`` scores per token, ``[B, T, 2]``."""

    def __init__(self, d_model: int):
        super().__init__()
        self.qa = nn.Linear(d_model, 2)

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        return self.qa(hidden)


class LMHead(nn.Module):
    """Next-token softmax ``Linear(h) -> vocab`` (no bias); tie by assigning ``head.proj.weight``."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        return self.proj(hidden)


class LastTokenClassificationHead(nn.Module):
    """Classify a sequence from a decoder's last real token (GPT-style; Radford et al. 2018).

    The model passes ``pooled`` = hidden state at the last position whose attention mask is 1.
    """

    def __init__(self, d_model: int, num_labels: int):
        super().__init__()
        self.score = nn.Linear(d_model, num_labels, bias=False)

    def forward(self, hidden: Tensor, pooled: Tensor | None = None) -> Tensor:
        return self.score(hidden[:, -1] if pooled is None else pooled)


ENCODER_HEADS = ("mlm", "nsp", "discriminator", "seq_cls", "token_cls", "span")
DECODER_HEADS = ("lm", "cls")


#: what each head is, in the one-line errors of :func:`require_head`
HEAD_ROLES = {
    "lm": "language-model head", "mlm": "MLM head", "nsp": "next-sentence head",
    "discriminator": "ELECTRA discriminator head", "seq_cls": "classification head",
    "cls": "classification head", "token_cls": "token-classification head", "span": "question-answering head",
}
#: the heads fine-tuning puts on for a task
TASK_HEADS = ("seq_cls", "cls", "token_cls", "span")


def require_head(model, head: str, doing: str, fix: str, *, first: bool = True) -> None:
    """The one check of "``doing`` needs a model with head ``head``": ``model`` (a model, or the
    :class:`~lmlab.models.facts.ModelFacts` read from a directory before its weights) must have
    ``head`` as its first head (``first``: the command reads the model's ``logits``, which are the
    first head's scores) or among its heads (``first=False``: the command calls that head by name).
    A model of a family without heads (the LSTM LM: its own output layer) passes. Otherwise one
    line naming the head the model has instead (a fine-tuned classifier's, typically) and ``fix``."""
    from lmlab.models.facts import facts_of
    from lmlab.models.registry import FAMILIES, family_spec

    facts = facts_of(model)
    heads = facts.heads
    if heads is None or heads[:1] == (head,) or (not first and head in heads):
        return  # (None: a model from outside lmlab that does not name its heads)
    role = HEAD_ROLES.get(head, f"{head!r} head")
    if not heads:
        if facts.architecture not in FAMILIES or not family_spec(facts.architecture).heads:
            return
        raise LmlabError(f"{doing} needs a model with the {role} ({head!r}), and this {facts.family} model "
                         f"has no {role} (no heads at all: the bare network)", fix)
    why = ("" if heads[0] not in TASK_HEADS else
           " (a fine-tuned question-answering model)" if heads[0] == "span" else " (a fine-tuned classifier)")
    if first:
        problem = (f"{doing} needs a model whose first head is the {role} ({head!r}), and this "
                   f"{facts.family} model's first head is {heads[0]!r}{why}")
    else:
        problem = (f"{doing} needs a model with the {role} ({head!r}), and this {facts.family} model has "
                   f"no {role} (its heads: {', '.join(heads)}){why}")
    raise LmlabError(problem, fix)


def check_heads(heads, allowed: tuple[str, ...], kind: str) -> tuple[str, ...]:
    heads = tuple(heads)
    bad = [h for h in heads if h not in allowed]
    if bad:
        raise LmlabError(f"unknown {kind} heads {bad}", f"choose among: {', '.join(allowed)}")
    if len(set(heads)) != len(heads):
        raise LmlabError(f"heads {list(heads)} name one head twice", "list each head once")
    return heads
