"""ELECTRA: replaced-token detection with a small generator (Clark et al. 2020, §2).

Two encoders are trained jointly:

* the **generator**, a small masked LM owned by this objective (a fraction ``generator_size`` of
  the discriminator's width and FFN, the same depth; the paper finds 1/4-1/2 best). 15% of the
  tokens are selected; 85% of those become ``[MASK]`` and the rest stay as they are
  (``mask_token_prob = 0.85``, as ``pretrain_helpers.mask`` in google-research/electra; no random
  tokens), and the generator predicts them all (loss ``L_MLM``);
* the **discriminator**, the model being pretrained (``discriminator`` head). Every masked
  position is filled with a token *sampled* from the generator's softmax; the discriminator sees
  this corrupted text and predicts, for **every** non-special token, whether it was replaced
  (loss ``L_Disc``, binary cross-entropy over all positions, not just 15%). The sample is drawn
  on the device without reading it on the host (:func:`sample_tokens`: inverse transform with
  one hashed uniform number per masked position, keyed by the batch's ``sample_seed``), so a
  step stays deterministic, resumable and free of host synchronisation.

``loss = L_MLM + λ · L_Disc`` with ``λ = disc_weight = 50``. Sampling is not differentiable, so no
gradient flows from the discriminator into the generator (the paper trains them jointly but
not adversarially). Generator and discriminator share their token, position and segment
embeddings (and the embedding LayerNorm): the generator reads the discriminator's embedding
modules at run time instead of owning copies, so the shared weights are counted, saved and
optimised once (with the model). Its MLM output layer is tied to the same token embeddings.

Labels, exactly: ``label_i = 1 if corrupted_i != original_i else 0``; a masked position whose
sampled token happens to equal the original counts as **original** (label 0), as in the paper.

Worked example::

    original    the chef cooked the meal
    masked      [MASK] chef [MASK] the meal
    sampled     the  chef  ate   the meal      (generator samples "the" at 0, "ate" at 2)
    disc labels 0    0     1     0   0
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import binary_token_loss
from lmlab.models.attention_masks import MaskSpec
from lmlab.models.blocks import LayerNorm, get_activation, init_weights
from lmlab.models.encoder.model import EncoderLayers
from lmlab.objectives.base import binary_auc, encoder_hidden
from lmlab.objectives.masking import (
    IGNORE,
    document_ids,
    label_positions,
    randint,
    seeded_uniforms,
    special_mask,
)
from lmlab.objectives.mlm import MaskedLM
from lmlab.values import Count, PositiveProbability, PositiveShare, PositiveWeight, Probability, Temperature


def replaced_token_labels(original: Tensor, corrupted: Tensor, special: Tensor) -> Tensor:
    """Discriminator targets: 1 where the token was replaced, 0 where it is original (including
    sampled tokens that equal the original), ``-100`` on special tokens (not scored)."""
    return (corrupted != original).long().masked_fill(special, IGNORE)


class ElectraGenerator(EncoderLayers):
    """The small generator: the encoder family's stack without embeddings (E->d projection,
    Transformer blocks, :class:`~lmlab.models.encoder.model.EncoderLayers`) plus the MLM transform.

    It has no embedding tables of its own: ``forward`` takes the discriminator's embedding output
    (width E) and the discriminator's token-embedding matrix for the tied output layer.
    """

    def __init__(self, cfg, embed_dim: int, vocab_size: int):
        super().__init__(cfg, embed_dim)
        self.dense = nn.Linear(cfg.d_model, embed_dim)
        self.act = get_activation(cfg.head_activation or cfg.activation)[0]
        self.norm = LayerNorm(embed_dim, cfg.norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.apply(lambda m: init_weights(m, cfg.init_std))

    def forward(self, embedded: Tensor, word_weight: Tensor, positions: Tensor,
                doc_ids: Tensor | None, position_ids: Tensor | None = None) -> Tensor:
        """Logits ``[N, V]`` at the masked ``positions`` only (flat indices ``b * T + t``, the speed
        path of the MLM head: gathered, so no shape depends on the device's data)."""
        x = super().forward(embedded, MaskSpec(doc_ids=doc_ids), position_ids)
        h = self.norm(self.act(self.dense(x.reshape(-1, x.shape[-1]).index_select(0, positions))))
        return F.linear(h, word_weight, self.bias)


def generator_config(cfg, generator_size: float, generator_layers: int | None = None):
    """The generator's config: the discriminator's ``cfg`` with width and FFN scaled by
    ``generator_size`` and heads of the discriminator's head size where possible."""
    d = max(8, int(round(cfg.d_model * generator_size)))
    n_heads = max(1, min(cfg.n_heads, d // cfg.dim_head))
    while d % n_heads:
        n_heads -= 1
    return cfg.replace(d_model=d, n_heads=n_heads, n_kv_heads=None, head_dim=None,
                       d_ff=max(8, int(round(cfg.d_ff * generator_size))),
                       n_layers=generator_layers or cfg.n_layers, layer_groups=0)


def shared_embeddings(model: nn.Module, input_ids: Tensor, position_ids: Tensor | None) -> Tensor:
    """The discriminator's token + position + segment embeddings (LayerNorm, dropout), before its
    own E->H projection: the input the generator shares."""
    emb = model.embeddings
    x = emb.word(input_ids)
    if emb.position is not None:
        x = x + emb.position(position_ids if position_ids is not None else emb.position_ids(input_ids))
    if emb.token_type is not None:
        x = x + emb.token_type(torch.zeros_like(input_ids))
    if emb.norm is not None:
        x = emb.norm(x)
    return emb.drop(x)


class Electra(MaskedLM):
    """ELECTRA pretraining for encoders with a ``discriminator`` head (see the module docstring)."""

    name = "electra"
    architectures = ("encoder",)
    heads = ("discriminator",)
    loss_kind = "other"  # generator NLL + 50 x discriminator BCE: no perplexity
    signals = (("disc_acc", "disc_acc_guess", "all original"), ("disc_auc", "disc_auc_guess", "chance"),
               ("gen_acc", "gen_acc_guess", "most frequent token"))

    def __init__(self, tokenizer, mask_prob: PositiveProbability = 0.15, generator_size: PositiveShare = 0.25,
                 generator_layers: Count | None = None, disc_weight: PositiveWeight = 50.0,
                 temperature: Temperature = 1.0, mask_token_prob: Probability = 0.85,
                 random_token_prob: Probability = 0.0):
        super().__init__(tokenizer, mask_prob=mask_prob, mask_token_prob=mask_token_prob,
                         random_token_prob=random_token_prob)
        p = Electra.checked({"generator_size": generator_size, "generator_layers": generator_layers,
                             "disc_weight": disc_weight, "temperature": temperature})
        self.generator_size, self.generator_layers = float(p["generator_size"]), p["generator_layers"]
        self.disc_weight, self.temperature = float(p["disc_weight"]), float(p["temperature"])
        self.generator: ElectraGenerator | None = None

    @classmethod
    def own_parameters(cls, params: dict[str, Any], model_config) -> tuple[int, str]:
        """The generator's blocks (the model's own count of one layer of the generator's config, times
        its layers) and its MLM transform and output bias; the embeddings are the model's (shared)."""
        from lmlab.models import weight_count

        try:
            gen = generator_config(model_config, float(params["generator_size"]), 1)
            one, two = weight_count(gen), weight_count(gen.replace(n_layers=2))
        except (LmlabError, TypeError, ValueError, AttributeError):
            return 0, ""  # a model the generator cannot copy: refused when it is built
        if one is None or two is None:
            return 0, ""
        layers = params.get("generator_layers") or model_config.n_layers
        transform = gen.d_model * model_config.embed_dim + model_config.vocab_size
        return (two - one) * layers + transform, "objective.generator_layers or objective.generator_size"

    @classmethod
    def step_flops(cls, model_config, seq_len: int, rows: int, params: dict[str, Any]) -> float:
        """The discriminator over every position plus the generator, whose MLM output layer runs
        only at the masked positions."""
        from lmlab.models.flops import training_flops

        masked = max(1, round(float(params.get("mask_prob", 0.15)) * seq_len))
        disc = training_flops(model_config, seq_len, rows, heads=("discriminator",))
        gen_cfg = generator_config(model_config, float(params.get("generator_size", 0.25)),
                                   params.get("generator_layers"))
        gen = training_flops(gen_cfg, seq_len, rows, logit_positions=masked, heads=("mlm",))
        return float(disc + gen)

    def setup(self, model: nn.Module) -> None:
        """Build the generator from the discriminator's config (width and FFN scaled by
        ``generator_size``, heads of the same size as the discriminator's where possible)."""
        if self.generator is not None:
            return
        cfg = model.config
        if not hasattr(model, "embeddings") or "discriminator" not in getattr(model, "heads", {}):
            raise LmlabError("the electra objective needs an encoder with a 'discriminator' head",
                             "use an encoder preset such as electra-tiny")
        gen_cfg = generator_config(cfg, self.generator_size, self.generator_layers)
        self.generator = ElectraGenerator(gen_cfg, cfg.embed_dim, cfg.vocab_size)
        self.generator.to(next(model.parameters()).device)

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        masked, labels = self.mask(batch.input_ids, batch.doc_ids, generator)
        inputs = {"input_ids": masked, "labels": labels, "label_positions": label_positions(labels),
                  "original_ids": batch.input_ids, "position_ids": batch.position_ids,
                  # key of the generator's sampling, so a batch stays a pure function of (tokens, generator)
                  "sample_seed": randint(2**62, (1,), generator, batch.input_ids.device)}
        docs = document_ids(batch)
        if docs is not None:
            inputs["doc_ids"] = docs
        return inputs

    def corrupt(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Run the generator: ``(generator MLM loss, generator logits, corrupted ids)``."""
        if self.generator is None:
            raise LmlabError("the ELECTRA generator was never built",
                             "call objective.setup(model) before training (the trainer does)")
        masked, labels = inputs["input_ids"], inputs["labels"]
        positions = inputs.get("label_positions")
        if positions is None:  # inputs made elsewhere: find the masked positions (reads the device)
            positions = label_positions(labels)
        targets = labels.reshape(-1).index_select(0, positions)
        embedded = shared_embeddings(model, masked, inputs.get("position_ids"))
        logits = self.generator(embedded, model.embeddings.word.weight, positions, inputs.get("doc_ids"),
                                inputs.get("position_ids"))
        gen_loss = F.cross_entropy(logits, targets) if logits.shape[0] else logits.sum()
        with torch.no_grad():  # sampling: no gradient from the discriminator to the generator
            sampled = sample_tokens(logits.float() / self.temperature, inputs["sample_seed"])
        corrupted = masked.reshape(-1).index_copy(0, positions, sampled).view_as(masked)
        return gen_loss, logits, corrupted

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        original = inputs["original_ids"]
        gen_loss, gen_logits, corrupted = self.corrupt(model, inputs)
        disc_labels = replaced_token_labels(original, corrupted, special_mask(original, self.special_ids))
        hidden = encoder_hidden(model, {**inputs, "input_ids": corrupted, "token_type_ids": None})
        disc_logits = model.heads["discriminator"](hidden)
        disc_loss = binary_token_loss(disc_logits, disc_labels)
        # every number a 0-d tensor over masks (no selection): the engine reads them once per step
        with torch.no_grad():
            scored = disc_labels != IGNORE
            truth = disc_labels.clamp(min=0)
            n = scored.sum().clamp(min=1)
            disc_acc = (((disc_logits > 0).long() == truth) & scored).sum() / n
            gen = self.hidden_token_signal(gen_logits.detach(), inputs, "gen")
            replaced = (truth * scored).sum() / n
        metrics = {"gen_loss": gen_loss.detach(), "disc_loss": disc_loss.detach(), **gen,
                   "disc_acc": disc_acc, "disc_acc_guess": 1.0 - replaced,
                   "disc_auc": binary_auc(disc_logits.detach(), truth, scored),
                   "disc_auc_guess": torch.full((), 0.5, device=replaced.device), "replaced": replaced,
                   "targets": scored.sum()}
        return gen_loss + self.disc_weight * disc_loss, metrics


def sample_tokens(logits: Tensor, seed: Tensor) -> Tensor:
    """One token per row of ``[N, V]`` ``logits`` drawn from their softmax, by inverse transform: a
    uniform number per row (:func:`lmlab.objectives.masking.seeded_uniforms`, keyed by the 0-d
    ``seed`` tensor and the row) located in the row's cumulative probabilities. Deterministic
    given ``(seed, logits)``, and nothing is read on the host (``torch.multinomial`` with a
    generator seeded from ``seed`` would need the seed as a Python int)."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    cdf = torch.softmax(logits, dim=-1).cumsum(-1)
    u = seeded_uniforms(seed, logits.shape[0]).to(cdf.dtype)
    # the first token whose cumulative probability exceeds u: never one of probability 0
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    return picked.clamp(max=logits.shape[-1] - 1)
