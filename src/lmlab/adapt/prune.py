"""Magnitude pruning: zero the smallest weights, and keep them zero while fine-tuning further.

Han et al. 2015 ("Learning both Weights and Connections for Efficient Neural Networks"): the
weights of smallest magnitude matter least, so set the fraction ``sparsity`` of them to zero,
then fine-tune the rest to recover. Gordon et al. 2020 ("Compressing BERT") show BERT keeps its
accuracy to ~30-40% sparsity this way.

What is pruned: by default the weight matrices of every linear layer inside the Transformer
blocks (attention projections and FFN); embeddings, norms and the task head are left alone
(``include``/``exclude`` fnmatch patterns over parameter names change that).

* ``structure="unstructured"``: single weights. ``scope="global"`` ranks ``|w|`` over all
  targeted matrices together (layers that matter less lose more); ``scope="layer"`` prunes the
  same fraction of each matrix. Exactly ``round(sparsity · n)`` weights are removed (ties broken
  by position), so the measured sparsity equals the target up to one weight.
* Whatever the structure, at least one weight/row/head is kept in every pruned matrix or
  attention layer (``scope="layer"``) and in the model (``scope="global"``): a sparsity near 1
  that would remove them all stops one short (``PruneMasks.floored``, :func:`sparsity_note`).
* ``structure="rows"``: whole output neurons (a row of ``W`` and its bias), ranked by the row's
  L2 norm divided by ``sqrt(d_in)`` (so rows of different widths compare under ``global``).
  A pruned FFN neuron outputs exactly zero, so it could be cut from the matrices.
* ``structure="heads"``: whole attention heads (Michel et al. 2019, "Are Sixteen Heads Really
  Better than One?"), ranked by the norm of the head's query/key/value rows and output-projection
  columns; pruning zeroes the head's query rows and its output columns (its key/value rows too
  without grouped-query attention), so the head contributes nothing.

:func:`prune_model` returns :class:`PruneMasks` (``True`` = kept). ``masks.attach(model)`` keeps
the pruned weights at zero during further training: a gradient hook zeroes their gradients, so
SGD/Adam/AdamW (fresh optimizer state, decoupled weight decay) never move them; ``masks.apply``
re-zeroes explicitly. A pruned model is saved as an ordinary dense checkpoint (the zeros are
stored); :meth:`PruneMasks.from_zeros` recovers the masks from it. Unstructured sparsity saves
no time with dense kernels; it is the count of nonzero parameters that shrinks.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lmlab import values
from lmlab.arguments import describe, model_argument, number_argument, tensor_argument, text_list_argument
from lmlab.errors import LmlabError

STRUCTURES = ("unstructured", "rows", "heads")
SCOPES = ("global", "layer")
DEFAULT_INCLUDE = ("*layers.*.weight",)


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def prunable_weights(model: nn.Module, include=DEFAULT_INCLUDE, exclude=()) -> dict[str, nn.Linear]:
    """``{parameter name: its linear layer}`` for the weight matrices that pruning targets."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            pname = f"{name}.weight" if name else "weight"
            if _matches(pname, include) and not _matches(pname, exclude):
                out[pname] = m
    return out


@dataclass
class PruneMasks:
    """Boolean masks by parameter name (True = kept); biases of pruned rows have masks too."""

    masks: dict[str, Tensor]
    _handles: list = field(default_factory=list, repr=False)
    #: True when :func:`prune_model` kept one head/row/weight that the sparsity asked removed
    #: (never all of a layer, or of the model)
    floored: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.masks, dict):
            raise LmlabError(f"PruneMasks' masks must be a dict of parameter name -> bool tensor, got "
                             f"{describe(self.masks)}", "make them with prune_model(model, sparsity)")
        for name, mask in self.masks.items():
            tensor_argument(mask, f"PruneMasks' mask of {name!r}")

    def _params(self, model: nn.Module) -> dict[str, nn.Parameter]:
        params = dict(model.named_parameters(remove_duplicate=False))
        missing = [n for n in self.masks if n not in params]
        if missing:
            raise LmlabError(f"the model has no parameters {missing[:3]}",
                             "apply masks to the model they came from")
        return {n: params[n] for n in self.masks}

    @torch.no_grad()
    def apply(self, model: nn.Module) -> None:
        """Set every pruned weight of ``model`` to zero."""
        for name, p in self._params(model).items():
            p.mul_(self.masks[name].to(p.device, p.dtype))

    def attach(self, model: nn.Module) -> PruneMasks:
        """Zero the pruned weights and keep them zero in training (gradient hooks); returns self."""
        self.detach()
        self.apply(model)
        for name, p in self._params(model).items():
            mask = self.masks[name].to(p.device)
            self._handles.append(p.register_hook(lambda g, m=mask: g * m.to(g.dtype)))
        return self

    def detach(self) -> None:
        """Remove the gradient hooks (the weights stay as they are)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def sparsity(self, model: nn.Module | None = None) -> float:
        """Share of zeros over the masked weight matrices: of the masks, or measured in ``model``."""
        names = [n for n in self.masks if n.endswith("weight")]
        if model is None:
            zeros = sum(int((~self.masks[n]).sum()) for n in names)
        else:
            params = self._params(model)
            zeros = sum(int((params[n] == 0).sum()) for n in names)
        total = sum(self.masks[n].numel() for n in names)
        return zeros / total if total else 0.0

    @classmethod
    def from_zeros(cls, model: nn.Module, include=DEFAULT_INCLUDE, exclude=()) -> PruneMasks:
        """Masks that keep the nonzero entries of the targeted weights (e.g. of a saved pruned model)."""
        return cls({n: m.weight.detach() != 0 for n, m in prunable_weights(model, include, exclude).items()})


def _check(sparsity: float, scope: str, structure: str) -> None:
    number_argument(values.Fraction, sparsity, "sparsity")  # the range of --sparsity
    if scope not in SCOPES:
        raise LmlabError(f"unknown pruning scope {scope!r}", f"choose one of: {', '.join(SCOPES)}")
    if structure not in STRUCTURES:
        raise LmlabError(f"unknown pruning structure {structure!r}",
                         f"choose one of: {', '.join(STRUCTURES)}")


def _lowest(scores: Tensor, k: int) -> Tensor:
    """Boolean mask of the same shape as ``scores``, False at the ``k`` smallest entries."""
    keep = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    if k > 0:
        keep[torch.topk(scores.flatten(), k, largest=False, sorted=False).indices] = False
    return keep.view(scores.shape)


def _select(scores: dict[str, Tensor], sparsity: float, scope: str,
            weight: dict[str, int]) -> tuple[dict[str, Tensor], bool]:
    """Keep-masks over each score tensor, and whether the floor below cut the removal short.
    ``weight[name]``: weights removed per pruned entry, so that global selection removes
    ``sparsity`` of the *weights*, not of the entries.

    The one place that chooses what is removed, so the floor lives here: at least one entry (head,
    row or weight) is kept in every pruned matrix/attention layer (``scope="layer"``) and in the
    model (``scope="global"``), however near 1 the sparsity: a layer with nothing left is a dead
    model, not a sparse one."""
    if scope == "layer":
        out, capped = {}, False
        for n, s in scores.items():
            k = round(sparsity * s.numel())
            if k >= s.numel() > 0:
                k, capped = s.numel() - 1, True
            out[n] = _lowest(s, k)
        return out, capped
    names = list(scores)
    flat = torch.cat([scores[n].flatten().float() for n in names])
    capped = False
    if all(weight[n] == 1 for n in names):
        k = round(sparsity * len(flat))
        if k >= len(flat) > 0:
            k, capped = len(flat) - 1, True
        keep = _lowest(flat, k)
    else:  # remove the lowest-scored entries until the removed weights come nearest the target
        cost = torch.cat([torch.full((scores[n].numel(),), float(weight[n]), dtype=torch.float64)
                          for n in names])
        target = sparsity * float(cost.sum())
        order = torch.argsort(flat, stable=True)
        removed = torch.cumsum(cost[order], 0)
        k = int((removed <= target + 1e-9).sum())
        below = float(removed[k - 1]) if k else 0.0
        if k < len(order) and abs(float(removed[k]) - target) < target - below:
            k += 1
        if k >= len(order) > 0:
            k, capped = len(order) - 1, True
        keep = torch.ones(len(flat), dtype=torch.bool)
        keep[order[:k]] = False
    out, start = {}, 0
    for n in names:
        size = scores[n].numel()
        out[n] = keep[start:start + size].view(scores[n].shape)
        start += size
    return out, capped


@torch.no_grad()
def prune_model(model: nn.Module, sparsity: float, scope: str = "global", structure: str = "unstructured",
                include=DEFAULT_INCLUDE, exclude=()) -> PruneMasks:
    """Magnitude-prune ``model`` in place to ``sparsity`` and return the masks (see module doc).

    >>> from lmlab.models import build_model, get_preset
    >>> model = build_model(get_preset("bert-tiny", vocab_size=500))
    >>> masks = prune_model(model, 0.5)
    >>> round(masks.sparsity(model), 3)
    0.5
    """
    model = model_argument(model, "prune_model's model")
    include = text_list_argument(include, "prune_model's include")  # a bare "heads.*" is not 7 patterns
    exclude = text_list_argument(exclude, "prune_model's exclude")
    _check(sparsity, scope, structure)
    from lmlab.models.checkpoint import refuse_int8

    refuse_int8(model, "pruning")  # its linear layers hold int8 buffers, no float weights
    if structure == "heads":
        masks, floored = _head_masks(model, sparsity, scope)
    else:
        targets = prunable_weights(model, include, exclude)
        if not targets:
            raise LmlabError("no weight matrix matched the include/exclude patterns",
                             "parameter names look like layers.0.ffn.fc_in.weight")
        if structure == "unstructured":
            scores = {n: m.weight.detach().abs() for n, m in targets.items()}
            masks, floored = _select(scores, sparsity, scope, dict.fromkeys(targets, 1))
        else:
            scores = {n: m.weight.detach().float().norm(dim=1) / math.sqrt(m.in_features)
                      for n, m in targets.items()}
            rows, floored = _select(scores, sparsity, scope, {n: m.in_features for n, m in targets.items()})
            masks = {}
            for n, m in targets.items():
                masks[n] = rows[n][:, None].expand_as(m.weight).clone()
                if m.bias is not None:
                    masks[n[: -len("weight")] + "bias"] = rows[n].clone()
    result = PruneMasks(masks, floored=floored)
    result.apply(model)
    return result


def sparsity_note(masks: PruneMasks, requested: float, structure: str, scope: str,
                  model: nn.Module | None = None) -> str:
    """``""`` when the achieved sparsity is the requested one (to 4 decimals), else why it is not,
    for the summary line: ``"; asked for 0.999: at least one row is kept in every layer, ..."``."""
    achieved = masks.sparsity(model)
    if f"{achieved:.4f}" == f"{requested:.4f}" and not masks.floored:
        return ""
    unit = {"heads": "head", "rows": "row", "unstructured": "weight"}[structure]
    if masks.floored:
        where = "every layer" if scope == "layer" else "the model"
        why = f"at least one {unit} is kept in {where}, or it would be dead"
    elif structure == "unstructured":
        why = "rounded to whole weights"
    else:
        why = f"whole {unit}s are removed, the nearest count to the target"
    return f"; asked for {requested:.10g}: {why}"


def _head_masks(model: nn.Module, sparsity: float, scope: str) -> tuple[dict[str, Tensor], bool]:
    """Masks removing whole attention heads (self-attention of every Transformer block)."""
    from lmlab.models.blocks import Attention

    attns = {name: m for name, m in model.named_modules() if isinstance(m, Attention) and not m.cross}
    if not attns:
        raise LmlabError(f"{type(model).__name__} has no attention heads to prune",
                         "use structure='rows' or 'unstructured'")
    scores, per_head = {}, {}
    for name, a in attns.items():
        h, d, g = a.n_heads, a.head_dim, a.n_heads // a.n_kv_heads
        q = a.q_proj.weight.view(h, d, -1).float().pow(2).sum((1, 2))
        o = a.o_proj.weight.view(-1, h, d).float().pow(2).sum((0, 2))
        kv = sum(p.weight.view(a.n_kv_heads, d, -1).float().pow(2).sum((1, 2)) for p in (a.k_proj, a.v_proj))
        scores[name] = (q + o + kv.repeat_interleave(g) / g).sqrt()
        per_head[name] = d * (a.q_proj.in_features + a.o_proj.out_features)
    keep, floored = _select(scores, sparsity, scope, per_head)
    masks = {}
    for name, a in attns.items():
        h, d = a.n_heads, a.head_dim
        rows = keep[name].repeat_interleave(d)                        # [h*d]
        masks[f"{name}.q_proj.weight"] = rows[:, None].expand_as(a.q_proj.weight).clone()
        masks[f"{name}.o_proj.weight"] = rows[None, :].expand_as(a.o_proj.weight).clone()
        if a.q_proj.bias is not None:
            masks[f"{name}.q_proj.bias"] = rows.clone()
        if a.n_kv_heads == h:  # without GQA a head owns its key/value rows as well
            for p in ("k_proj", "v_proj"):
                lin = getattr(a, p)
                masks[f"{name}.{p}.weight"] = rows[:, None].expand_as(lin.weight).clone()
                if lin.bias is not None:
                    masks[f"{name}.{p}.bias"] = rows.clone()
    return masks, floored


def nonzero_parameters(model: nn.Module) -> tuple[int, int]:
    """``(nonzero, total)`` over the distinct parameters (int8 weights of quantized layers included)."""
    model = model_argument(model, "nonzero_parameters' model")
    nonzero = total = 0
    tensors = list(model.parameters()) + [b for n, b in model.named_buffers() if n.endswith("qweight")]
    for t in tensors:
        total += t.numel()
        nonzero += int((t != 0).sum())
    return nonzero, total
