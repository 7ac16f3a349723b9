"""AdaMix: a mixture of bottleneck adapters per adapter slot (Wang et al. 2022, "AdaMix:
Mixture-of-Adaptations for Parameter-efficient Model Tuning").

Every adapter of :mod:`lmlab.adapt.adapters` (Houlsby: two per layer, Pfeiffer: one) becomes
``experts`` adapters that share one slot: ``experts`` project-down matrices and ``experts``
project-up matrices.

* **Training** (stochastic routing, no router network): at every forward pass each slot draws one
  project-down and one project-up expert at random, independently and uniformly, from torch's
  global random generator (the one the fine-tuning loop seeds and saves for ``--resume``, so a
  resumed run draws the same routes). Only the drawn experts get a gradient in that step.
* **Consistency regularisation** (the paper's sec. 3.3): the fine-tuning loop asks the method for the
  step's loss (:meth:`AdaMixFineTuning.loss`), which runs the batch twice, with two independent
  routes, and returns the mean of the two task losses plus ``consistency`` times the symmetric
  KL divergence between the two passes' predicted label distributions
  (``(KL(p1‖p2) + KL(p2‖p1)) / 2``; regression heads: the squared difference of the two
  predictions). ``consistency=0`` runs one pass per step and no regulariser.
* **Inference** (the paper's "adaptation merging"): each slot's experts are averaged *weight by
  weight* into a single adapter, ``W_down = mean_i W_down_i`` (biases too) and ``W_up = mean_j
  W_up_j``; in eval mode a :class:`MixtureAdapter` computes with those averages, and
  :func:`merge_experts` turns the model into a plain adapter model (one adapter per slot, the cost
  of ``--method adapter``). Note it is the weights that are averaged, not the experts' outputs.

Each expert starts as a :class:`~lmlab.adapt.adapters.BottleneckAdapter` does (project-down
random, project-up zero), so the adapted model starts as the base model exactly, and with
``experts=1`` AdaMix *is* a plain adapter (same initial weights, same forward). By default
(``same_init=True``, as the authors' code does) the experts of a slot start as copies of one
adapter and drift apart only through the routes that train them: averaging weights that began at
the same point keeps the merged adapter close to each expert. ``same_init=False`` draws each
expert's project-down on its own (measured worse: docs/results/adamix-glue.md).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.adapt.adapters import BottleneckAdapter, check_adapter_options, insert_adapters
from lmlab.adapt.options import typed_options
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE


class MixtureAdapter(nn.Module):
    """``experts`` bottleneck adapters in one slot: a random (down, up) pair per training forward,
    the weight-averaged adapter in eval mode."""

    def __init__(self, d_model: int, bottleneck: int, experts: int = 4, activation: str = "relu",
                 same_init: bool = True):
        super().__init__()
        draws = 1 if same_init else experts  # copies of one adapter, or each expert its own draw
        made = [BottleneckAdapter(d_model, bottleneck, activation) for _ in range(draws)] * (experts // draws)
        self.act = made[0].act
        self.down_weight = nn.Parameter(torch.stack([a.down.weight.detach() for a in made]))  # [M, m, d]
        self.down_bias = nn.Parameter(torch.stack([a.down.bias.detach() for a in made]))      # [M, m]
        self.up_weight = nn.Parameter(torch.stack([a.up.weight.detach() for a in made]))      # [M, d, m]
        self.up_bias = nn.Parameter(torch.stack([a.up.bias.detach() for a in made]))          # [M, d]
        self.activation = activation

    @property
    def experts(self) -> int:
        return self.down_weight.shape[0]

    def route(self) -> tuple[int, int]:
        """The (project-down, project-up) experts of one training forward, drawn uniformly from
        torch's global generator (seeded by the loop; saved and restored with ``--resume``)."""
        if self.experts == 1:
            return 0, 0
        down, up = torch.randint(self.experts, (2,)).tolist()
        return down, up

    def averaged(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The merged adapter's ``(down_weight, down_bias, up_weight, up_bias)``: expert means."""
        return tuple(t.mean(0) for t in (self.down_weight, self.down_bias, self.up_weight, self.up_bias))

    def forward(self, h: Tensor) -> Tensor:
        if self.training:
            i, j = self.route()
            wd, bd, wu, bu = self.down_weight[i], self.down_bias[i], self.up_weight[j], self.up_bias[j]
        else:
            wd, bd, wu, bu = self.averaged()
        return h + F.linear(self.act(F.linear(h, wd, bd)), wu, bu)

    def merged(self) -> BottleneckAdapter:
        """A plain adapter holding the averaged weights (what inference runs)."""
        d, m = self.up_weight.shape[1], self.down_weight.shape[1]
        out = BottleneckAdapter(d, m, self.activation)
        out = out.to(device=self.up_weight.device, dtype=self.up_weight.dtype)
        with torch.no_grad():
            for t, avg in zip((out.down.weight, out.down.bias, out.up.weight, out.up.bias), self.averaged()):
                t.copy_(avg)
        return out

    def extra_repr(self) -> str:
        d, m = self.up_weight.shape[1], self.down_weight.shape[1]
        return f"experts={self.experts}, d_model={d}, bottleneck={m}"


@typed_options("adamix")
def apply_adamix(
    model: nn.Module,
    experts: int = 4,
    kind: str = "houlsby",
    bottleneck: int = 0,
    reduction_factor: int = 16,
    activation: str = "relu",
    train_norms: bool | None = None,
    train_head: bool = True,
    consistency: float = 1.0,
    keep_experts: bool = True,
    same_init: bool = True,
) -> None:
    """Freeze ``model`` and insert a :class:`MixtureAdapter` wherever ``--method adapter`` puts an
    adapter (``kind``, ``bottleneck``, ``reduction_factor``, ``activation``, ``train_norms`` as there).

    ``consistency``: weight of the symmetric-KL consistency loss between two routes (used by the
    fine-tuning loop; 0 = one pass, no regulariser). ``keep_experts``: ``lmlab finetune`` also saves
    every expert (``experts/``) beside the merged adapter it serves. ``same_init``: the experts of a
    slot start as copies of one adapter (False: independent draws).
    """
    d, bottleneck, train_norms = check_adapter_options(model, kind, bottleneck, reduction_factor, activation,
                                                       train_norms)
    insert_adapters(model, kind, lambda: MixtureAdapter(d, bottleneck, experts, activation, same_init),
                    train_norms,
                    train_head)


def mixture_modules(model: nn.Module) -> list[MixtureAdapter]:
    return [m for m in model.modules() if isinstance(m, MixtureAdapter)]


def merge_experts(model: nn.Module) -> nn.Module:
    """A copy of an AdaMix ``model`` with every mixture replaced by its averaged adapter: a plain
    ``adapter`` model (``model.peft["method"] == "adapter"``) whose outputs equal ``model``'s in
    eval mode. ``model`` itself is not changed."""
    peft = getattr(model, "peft", None) or {}
    if peft.get("method") != "adamix":
        raise LmlabError("merge_experts needs a model with --method adamix applied",
                         "apply it with lmlab.adapt.apply_method(model, 'adamix')")
    out = copy.deepcopy(model)
    for module in out.modules():
        if isinstance(getattr(module, "adapter", None), MixtureAdapter):
            module.adapter = module.adapter.merged()
    o = peft["options"]
    mixes = mixture_modules(model)
    out.peft = {"method": "adapter", "options": {
        **{k: o[k] for k in ("kind", "reduction_factor", "activation", "train_norms", "train_head")},
        "bottleneck": mixes[0].down_weight.shape[1]}}
    return out.train(model.training)


# --------------------------------------------------------------------------- consistency


def prediction_outputs(task, out) -> tuple[Tensor, str]:
    """The predicted scores a consistency loss compares, and how: ``("kl", logits)`` for class
    labels (last dimension), ``("mse", values)`` for a one-output regression head."""
    head = getattr(task, "head", None)
    if head in ("seq_cls", "token_cls") and isinstance(out.logits, torch.Tensor):
        return out.logits, ("mse" if out.logits.shape[-1] == 1 else "kl")
    if "cls_logits" in getattr(out, "extra", {}):
        return out.extra["cls_logits"], "kl"
    raise LmlabError(f"AdaMix's consistency loss has no prediction to compare for task {task.name!r}",
                     "use --method-option consistency=0 for this task")


def consistency_supported(task) -> bool:
    """Whether :func:`prediction_outputs` can read this task's model outputs."""
    return getattr(task, "head", None) in ("seq_cls", "token_cls") or "cls" in getattr(task, "heads", ())


def symmetric_kl(a: Tensor, b: Tensor, mask: Tensor | None = None) -> Tensor:
    """``(KL(p_a‖p_b) + KL(p_b‖p_a)) / 2`` of the softmax distributions over the last dimension,
    summed over classes and averaged over the rows (positions where ``mask`` is true)."""
    la, lb = F.log_softmax(a.float(), -1), F.log_softmax(b.float(), -1)
    per_row = 0.5 * ((la.exp() * (la - lb)).sum(-1) + (lb.exp() * (lb - la)).sum(-1))
    if mask is not None:
        per_row = per_row[mask]
    return per_row.mean() if per_row.numel() else per_row.sum()


def consistency_loss(task, first, second, batch: dict[str, Tensor]) -> Tensor:
    """The disagreement of two stochastic passes over ``batch`` (their model outputs)."""
    a, how = prediction_outputs(task, first)
    b, _ = prediction_outputs(task, second)
    if how == "mse":
        return F.mse_loss(a.float(), b.float())
    mask = None
    if a.dim() == 3:  # token classification: the real (labelled) positions only
        labels = batch.get("labels")
        mask = labels != IGNORE if labels is not None and labels.shape == a.shape[:2] else None
        if mask is None and "attention_mask" in batch:
            mask = batch["attention_mask"].bool()
    return symmetric_kl(a, b, mask)


def two_pass_loss(task, model: nn.Module, batch: dict[str, Tensor], weight: float) -> Tensor:
    """Mean task loss of two forward passes with independent routes + ``weight`` x their
    :func:`consistency_loss`; the passes' outputs are caught by a hook on ``model``."""
    if weight == 0:
        return task.loss(model, batch)
    outputs: list = []
    hook = model.register_forward_hook(lambda module, args, out: outputs.append(out))
    try:
        first = task.loss(model, batch)
        seen = len(outputs)
        second = task.loss(model, batch)
    finally:
        hook.remove()
    if seen != 1 or len(outputs) != 2:
        raise LmlabError(f"task {task.name!r} runs {seen} forward passes per loss, AdaMix's consistency loss "
                         "needs exactly one", "use --method-option consistency=0 for this task")
    return 0.5 * (first + second) + weight * consistency_loss(task, outputs[0], outputs[1], batch)
