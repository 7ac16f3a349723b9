"""Many tuned variants of one base model in one batch: each row names its variant.

Prefix tuning's promise (Li & Liang 2021) is that "each element of a batch at inference could run
a different tuned model": the frozen base is shared and only a few numbers per variant differ.
:class:`MultiAdapterModel` serves LoRA, prefix- and prompt-tuned variants (and the plain base)
side by side, kinds mixed freely, with every row's outputs equal to its variant run alone
(up to float rounding; greedy generation gives the same tokens):

* LoRA: ``W x + s_v · B_v (A_v x)`` per row, batched (:class:`~lmlab.adapt.multi_layers.MultiLoRALinear`);
* prefix tuning: each row's key/value prefix in every self-attention, shorter ones padded and
  masked (:class:`~lmlab.adapt.multi_layers.MultiPrefixAttention`); ``positions=after_prefix``
  shifts that row's positions by its own prefix length;
* prompt tuning: ``P_max`` slots in the input (after ``[CLS]`` for an encoder, in front for a
  decoder) hold each row's soft prompt right-aligned; the unused slots are masked out and skipped
  by the position numbering, so every real token has the position it has alone. Token-level
  outputs come back without the slots; with a KV cache the slots stay in the cache.
* task heads (``seq_cls``, ``cls``, ...) trained with a variant: each variant's rows go through
  its own copy (:class:`~lmlab.adapt.multi_layers.RowwiseModule`); heads must have one shape.

Every adapter records a fingerprint of the base it was trained on
(:func:`lmlab.adapt.peft_io.base_fingerprint`); an adapter from another base is refused
(:func:`lmlab.adapt.peft_io.check_same_base`, the check of ``lmlab export --format peft`` too).

>>> model = MultiAdapterModel(base, {"pos": "ft/lora", "neg": "ft/prefix", "plain": None})  # doctest: +SKIP
>>> out = model(ids, attention_mask=mask, variant_ids=["pos", "neg", "plain"])          # doctest: +SKIP
>>> tokens = generate_variants(model, ids, mask, ["pos", "neg", "plain"], max_new_tokens=20)  # doctest: +SKIP

The cache returned with ``use_cache=True`` ends with one extra entry, ``(variant_ids, slots)``
(``slots``: the prompt slots the cache holds, per row), so the rows' variants follow the rows when
generation reorders or repeats them (beam search).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmlab.adapt.multi_layers import MultiLoRALinear, MultiPrefixAttention, RowState, RowwiseModule
from lmlab.adapt.peft_io import (
    adapter_files,
    base_for_adapter,
    check_base,
    check_same_base,
    model_for_adapter,
    read_peft_config,
)
from lmlab.adapt.prefix import PrefixEncoder
from lmlab.adapt.prompt import input_embedding, strip_prompt
from lmlab.arguments import describe, model_argument
from lmlab.errors import LmlabError

#: methods whose variants can share a batch
BATCHABLE = ("lora", "prefix", "prompt")

__all__ = ["BATCHABLE", "MultiAdapterModel", "adapter_dir", "generate_variants", "parse_variants"]


def parse_variants(specs: list[str]) -> dict[str, Path | None]:
    """``NAME=DIR`` strings (``--variant``) as ``{name: adapter directory}``; ``NAME`` alone is the
    base model itself (None). Names must be unique and the directories hold adapters (checked)."""
    out: dict[str, Path | None] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not name or (sep and not path.strip()):
            raise LmlabError(f"--variant {spec!r} is not NAME=DIR", "e.g. --variant sst2=ft/sst2-lora "
                             "(or --variant NAME alone for the base model)")
        if name in out:
            raise LmlabError(f"variant {name!r} is named twice", "give every --variant its own name")
        if sep:
            adapter_dir(path.strip())  # holds an adapter (checked now, before any model is loaded)
        out[name] = Path(path.strip()) if sep else None
    return out


def adapter_dir(path: str | os.PathLike) -> Path:
    """The adapter folder of ``path``: ``path`` itself, or ``path/adapter`` (an ``lmlab finetune
    --method lora|prefix|prompt`` output)."""
    p = Path(path)
    for d in (p, p / "adapter"):
        if d.is_dir() and adapter_files(d) is not None:
            return d
    raise LmlabError(f"{p} holds no lmlab adapter (lmlab_adapter.json, or adapter/ inside)",
                     "pass a directory written by `lmlab finetune --method lora|prefix|prompt` or save_peft")


class _Variant:
    """One variant's saved weights and settings."""

    def __init__(self, name: str, where: Path | None, cfg: dict[str, Any] | None, state: dict[str, Tensor]):
        self.name, self.where, self.cfg, self.state = name, where, cfg, state
        self.method = cfg["method"] if cfg else "base"
        self.options = cfg["options"] if cfg else {}
        self.head_state = {k: v for k, v in state.items() if k.startswith(("heads.", "pooler."))}


class MultiAdapterModel(nn.Module):
    """A frozen ``base`` model and the small weights of every variant in ``variants``
    (``name -> adapter directory``, or None for the base model itself); see the module docstring.

    ``forward(input_ids, attention_mask=None, ..., variant_ids=...)`` takes one variant per row
    (names or indices into :attr:`names`); inside :meth:`serving` they may be left out.
    """

    def __init__(self, base: nn.Module, variants: dict[str, str | os.PathLike | None]):
        super().__init__()
        from lmlab.models.checkpoint import read_safetensors

        base = model_argument(base, "MultiAdapterModel's base")
        if not isinstance(variants, dict):
            raise LmlabError(f"MultiAdapterModel's variants must be a dict of name -> adapter directory, got "
                             f"{describe(variants)}", "pass e.g. {'sst2': 'ft/sst2', 'base': None}")
        if not variants:
            raise LmlabError("no variants given", "name at least one: {'name': 'adapter/dir'}")
        arch = getattr(base, "architecture", "")
        if arch not in ("encoder", "decoder"):
            what = arch or type(base).__name__
            raise LmlabError(f"batched variants need an encoder or decoder base, not {what}",
                             "serve encoder-decoder variants one at a time")
        for path in variants.values():  # a fine-tune that grew the vocabulary brings its grown base
            if path is not None:
                d = adapter_dir(path)
                base = base_for_adapter(base, read_peft_config(d), d)
        loaded: list[_Variant] = []
        for name, path in variants.items():
            if path is None:
                loaded.append(_Variant(name, None, None, {}))
                continue
            d = adapter_dir(path)
            cfg = read_peft_config(d)
            if cfg["method"] not in BATCHABLE:
                raise LmlabError(f"variant {name!r} ({d}) is a {cfg['method']} variant, which cannot share a "
                                 "batch",
                                 f"batch {', '.join(BATCHABLE)} variants; serve the others one at a time")
            check_base(base, cfg, str(d))
            check_same_base(base, cfg, d, f"variant {name!r} ({d})")  # the base every variant is served on
            loaded.append(_Variant(name, d, cfg, read_safetensors(adapter_files(d)[1])))
        tuned = [v for v in loaded if v.cfg]
        heads = {tuple(v.cfg["heads"]) for v in tuned}
        if len(heads) > 1:
            raise LmlabError(f"the variants were trained with different heads {sorted(heads)}",
                             "batch variants of one task (same heads) together")
        model = base
        if tuned and tuple(base.head_names) != tuned[0].cfg["heads"]:
            model = model_for_adapter(base, tuned[0].cfg, tuned[0].where)
        for p in model.parameters():
            p.requires_grad_(False)
        self.base = model.eval()
        self.config, self.architecture = model.config, model.architecture
        self.head_names = tuple(model.head_names)
        self.tokenizer = getattr(base, "tokenizer", None)
        self.names = [v.name for v in loaded]
        self.methods = {v.name: v.method for v in loaded}
        self._state = RowState()
        self._serving: Tensor | None = None
        self._base_has_heads = tuple(base.head_names) == self.head_names
        self._add_lora(loaded)
        self._add_prefixes(loaded)
        self._add_prompts(loaded)
        self._add_heads(loaded)

    # ------------------------------------------------------------------ building
    def _add_lora(self, variants: list[_Variant]) -> None:
        n = len(variants)
        paths: dict[str, None] = {}
        for v in variants:
            if v.method == "lora":
                for k in v.state:
                    if k.endswith(".lora_A"):
                        paths.setdefault(k[: -len(".lora_A")], None)
        self._has_lora = torch.tensor([v.method == "lora" for v in variants])
        for path in paths:
            try:
                linear = self.base.get_submodule(path)
            except AttributeError:
                linear = None
            if not isinstance(linear, nn.Linear):
                raise LmlabError(f"LoRA weights for {path} match no linear layer of the base",
                                 "load the variants on the base they were trained from")
            rank = max(v.state[f"{path}.lora_A"].shape[0] for v in variants if f"{path}.lora_A" in v.state)
            w = linear.weight
            a = torch.zeros(n, rank, linear.in_features, dtype=w.dtype, device=w.device)
            b = torch.zeros(n, linear.out_features, rank, dtype=w.dtype, device=w.device)
            scaling = torch.zeros(n, dtype=w.dtype, device=w.device)
            for i, v in enumerate(variants):
                if f"{path}.lora_A" in v.state:
                    va, vb = v.state[f"{path}.lora_A"], v.state[f"{path}.lora_B"]
                    a[i, : va.shape[0]], b[i, :, : vb.shape[1]] = va, vb
                    scaling[i] = float(v.options["alpha"]) / v.options["rank"]
            parent_name, _, attr = path.rpartition(".")
            parent = self.base.get_submodule(parent_name) if parent_name else self.base
            setattr(parent, attr, MultiLoRALinear(linear, a, b, scaling, self._state))

    def _add_prefixes(self, variants: list[_Variant]) -> None:
        from lmlab.adapt import transformer_blocks

        blocks = [blk for _, blk in transformer_blocks(self.base)]
        attn = blocks[0].attn
        lengths, shifts, kvs = [], [], {}
        for i, v in enumerate(variants):
            p = v.options.get("num_virtual_tokens", 0) if v.method == "prefix" else 0
            lengths.append(p)
            shifts.append(p if v.method == "prefix" and v.options.get("positions") == "after_prefix" else 0)
            if p:
                o = v.options
                with torch.random.fork_rng(devices=[]):  # its init is overwritten: spare the caller's RNG
                    enc = PrefixEncoder(len(blocks), attn.n_kv_heads, attn.head_dim, p,
                                        attn.q_proj.in_features, o.get("reparameterize", False),
                                        o.get("hidden", 512))
                own = "prefix_encoder."
                state = {k[len(own):]: t for k, t in v.state.items() if k.startswith(own)}
                enc.load_state_dict(state)
                with torch.no_grad():
                    kvs[i] = torch.stack([torch.stack(enc.layer_kv(j)) for j in range(len(blocks))])
        self.register_buffer("prefix_len", torch.tensor(lengths, dtype=torch.long), persistent=False)
        self.register_buffer("position_shift", torch.tensor(shifts, dtype=torch.long), persistent=False)
        if not kvs:
            return
        p_max, w = max(lengths), attn.k_proj.weight
        for j, block in enumerate(blocks):
            kv = torch.zeros(len(variants), 2, attn.n_kv_heads, p_max, attn.head_dim, dtype=w.dtype,
                             device=w.device)
            for i, t in kvs.items():
                kv[i, :, :, p_max - t.shape[3]:] = t[j]  # right-aligned: padding first
            block.attn = MultiPrefixAttention(block.attn, kv, self._state)

    def _add_prompts(self, variants: list[_Variant]) -> None:
        table = input_embedding(self.base)
        lengths, places, prompts = [], set(), {}
        for i, v in enumerate(variants):
            if v.method != "prompt":
                lengths.append(0)
                continue
            prompts[i] = v.state["soft_prompt.embedding"]
            lengths.append(prompts[i].shape[0])
            places.add(1 if self.architecture == "encoder" and not v.options.get("before_cls") else 0)
        if len(places) > 1:
            raise LmlabError("some prompt-tuned variants put the prompt before [CLS], others after it",
                             "batch variants with the same before_cls setting together")
        self.register_buffer("prompt_len", torch.tensor(lengths, dtype=torch.long), persistent=False)
        self._prompt_at = places.pop() if places else 0
        p_max = max(lengths)
        w = table.weight
        emb = torch.zeros(len(variants), p_max, w.shape[1], dtype=w.dtype, device=w.device)
        for i, t in prompts.items():
            emb[i, p_max - t.shape[0]:] = t
        self.register_buffer("prompts", emb, persistent=False)
        self._placeholder = 0 if self.config.pad_token_id != 0 else 1
        self._fill: tuple[int, Tensor, Tensor] | None = None  # (slot, embeddings, valid) for the hook
        if prompts:
            table.register_forward_hook(self._embed_hook)

    def _add_heads(self, variants: list[_Variant]) -> None:
        import copy

        own = [i for i, v in enumerate(variants) if v.head_state]
        if not own:
            return
        plain = [v.name for v in variants if not v.head_state]
        if plain and not self._base_has_heads:
            raise LmlabError(f"variants {plain} have no trained {'/'.join(self.head_names)} head and the "
                             "base has none either",
                             "batch them with variants of their own task, or drop them")
        groups: dict[str, dict[int, dict[str, Tensor]]] = {}
        for i in own:
            for k, t in variants[i].head_state.items():
                top, _, rest = k.partition(".")
                module = f"heads.{rest.partition('.')[0]}" if top == "heads" else "pooler"
                groups.setdefault(module, {}).setdefault(i, {})[k[len(module) + 1:]] = t
        for module_name, per_variant in groups.items():
            shared = self.base.get_submodule(module_name)
            copies, slot = [shared], [0] * len(variants)
            for i, state in per_variant.items():
                c = copy.deepcopy(shared)
                shapes = {k: tuple(t.shape) for k, t in c.state_dict().items()}
                bad = {k: tuple(t.shape) for k, t in state.items() if shapes.get(k) != tuple(t.shape)}
                if bad:
                    raise LmlabError(f"variant {variants[i].name!r} has a {module_name} of another shape "
                                     f"({bad})", "batch variants whose heads have the same number of labels")
                c.load_state_dict(state, strict=False)
                slot[i] = len(copies)
                copies.append(c)
            parent_name, _, attr = module_name.rpartition(".")
            parent = self.base.get_submodule(parent_name) if parent_name else self.base
            row_wise = RowwiseModule(copies, slot, self._state)
            if isinstance(parent, nn.ModuleDict):
                parent[attr] = row_wise
            else:
                setattr(parent, attr, row_wise)

    # ------------------------------------------------------------------ rows
    def variant_index(self, variants) -> Tensor:
        """``[B]`` indices into :attr:`names` of ``variants`` (names, indices or a tensor)."""
        if isinstance(variants, Tensor):
            ids = variants.long()
        else:
            out = []
            for v in variants:
                if isinstance(v, str):
                    if v not in self.names:
                        raise LmlabError(f"unknown variant {v!r}", f"choose one of: {', '.join(self.names)}")
                    out.append(self.names.index(v))
                else:
                    out.append(int(v))
            ids = torch.tensor(out, dtype=torch.long)
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < len(self.names):
            raise LmlabError(f"variant ids must be in [0, {len(self.names)})", "index into model.names")
        return ids.to(self.prefix_len.device)

    @contextlib.contextmanager
    def serving(self, variants):
        """Within the block, calls without ``variant_ids`` use ``variants`` (one per row; a batch
        ``k`` times larger repeats each row's variant ``k`` times, as generation does for beams)."""
        previous, self._serving = self._serving, self.variant_index(variants)
        try:
            yield self
        finally:
            self._serving = previous

    def _rows(self, variant_ids, batch: int) -> Tensor:
        ids = self._serving if variant_ids is None else self.variant_index(variant_ids)
        if ids is None:
            raise LmlabError("MultiAdapterModel needs the variant of every row",
                             "pass variant_ids=[...] or call it inside model.serving([...])")
        if ids.shape[0] != batch:
            if ids.shape[0] == 0 or batch % ids.shape[0]:
                raise LmlabError(f"{ids.shape[0]} variant ids for a batch of {batch} rows",
                                 "give one per row")
            ids = ids.repeat_interleave(batch // ids.shape[0])
        return ids

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None,
                past_key_values=None, use_cache: bool = False, variant_ids=None,
                token_type_ids: Tensor | None = None, heads: tuple[str, ...] | None = None,
                output_hidden_states: bool = False, keep: slice | None = None, **labels):
        """The base model's forward with every row running its own variant (no losses: labels
        are refused; ``keep`` is accepted and ignored, the outputs at those positions are the same)."""
        given = sorted(k for k, v in labels.items() if v is not None)
        if given:
            raise LmlabError(f"MultiAdapterModel computes no losses (got {given})",
                             "train each variant on its own; score with the logits")
        b, t = input_ids.shape
        past = None
        if past_key_values is not None:
            past, (ids, slots) = tuple(past_key_values[:-1]), past_key_values[-1]
            p_max = int(slots[0]) if slots.numel() else 0  # as many as the first call made
        else:
            ids = self._rows(variant_ids, b)
            p_max = int(self.prompt_len[ids].max()) if self.prompts.shape[1] else 0
        pp = self.prompt_len[ids]
        st = self._state
        st.ids, st.lora = ids, bool(self._has_lora.to(ids.device)[ids].any())
        st.prefix_len = self.prefix_len[ids]
        st.prefix_max = int(st.prefix_len.max())
        shift = self.position_shift[ids]
        kw = dict(use_cache=use_cache, output_hidden_states=output_hidden_states, heads=heads)
        try:
            if self.architecture == "decoder":
                if token_type_ids is not None:
                    raise LmlabError("token_type_ids is not used by a decoder-only model",
                                     "drop token_type_ids")
                kw.update(self._decoder_inputs(input_ids, attention_mask, position_ids, past, ids, pp, p_max,
                                               shift))
            else:
                if past is not None or use_cache:
                    raise LmlabError("an encoder has no KV cache", "drop past_key_values/use_cache")
                kw.update(self._encoder_inputs(input_ids, attention_mask, position_ids, token_type_ids, ids,
                                               pp, p_max, shift))
                kw.pop("use_cache")
            out = self.base(**kw)
        finally:
            st.ids = st.prefix_len = None
            st.lora, st.prefix_max, self._fill = False, 0, None
        if past is None and p_max:
            strip_prompt(out, b, t + p_max, min(self._prompt_at, t), p_max, heads or self.head_names)
        if use_cache and out.past_key_values is not None:
            out.past_key_values = (*out.past_key_values, (ids, torch.full_like(ids, p_max)))
        return out

    def _decoder_inputs(self, input_ids, attention_mask, position_ids, past, ids, pp, p_max, shift):
        b, t = input_ids.shape
        dev = input_ids.device
        cached = 0 if past is None else past[0][0].shape[2]
        past_user = cached - (p_max if past is not None else 0)  # the cache holds the prompt slots
        kw: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                              "past_key_values": past, "position_ids": position_ids}
        if not p_max and not bool(shift.any()):
            return kw
        if position_ids is None:
            position_ids = torch.arange(past_user, past_user + t, device=dev)[None]
        position_ids = position_ids.expand(b, -1) + (pp + shift)[:, None]
        kw["position_ids"] = position_ids
        if not p_max:
            return kw
        valid = self._slot_valid(pp, p_max)
        user_mask = attention_mask
        if user_mask is None:
            user_mask = torch.ones(b, past_user + t, dtype=torch.long, device=dev)
        kw["attention_mask"] = torch.cat((valid.to(user_mask.dtype), user_mask), dim=1)
        if past is None:
            slots = (torch.arange(p_max, device=dev)[None] - (p_max - pp)[:, None]).clamp(min=0)
            kw["position_ids"] = torch.cat((slots, position_ids), dim=1)
            kw["input_ids"] = self._with_slots(input_ids, 0, valid, self._placeholder)
            self._fill = (0, self.prompts[ids, self.prompts.shape[1] - p_max:], valid)
        return kw

    def _encoder_inputs(self, input_ids, attention_mask, position_ids, token_type_ids, ids, pp, p_max, shift):
        b, t = input_ids.shape
        dev = input_ids.device
        cfg = self.config
        kw: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                              "token_type_ids": token_type_ids, "position_ids": position_ids}
        if not p_max and not bool(shift.any()):
            return kw
        if position_ids is not None:
            raise LmlabError("explicit position_ids are not supported with prompt- or after_prefix-tuned "
                             "encoder variants", "drop position_ids")
        at = min(self._prompt_at, t)
        valid = self._slot_valid(pp, p_max)
        from_padding = getattr(cfg, "positions_from_padding", False)
        if p_max:
            pad_slot = cfg.pad_token_id if from_padding else self._placeholder
            input_ids = self._with_slots(input_ids, at, valid, pad_slot)
            mask = attention_mask
            if mask is None:
                mask = torch.ones(b, t, dtype=torch.long, device=dev)
            kw["attention_mask"] = _insert(mask, at, valid.to(mask.dtype))
            if token_type_ids is not None:
                zeros = torch.zeros_like(valid, dtype=token_type_ids.dtype)
                kw["token_type_ids"] = _insert(token_type_ids, at, zeros)
            kw["input_ids"] = input_ids
            self._fill = (at, self.prompts[ids, self.prompts.shape[1] - p_max:], valid)
        if from_padding:
            pos = self.base.embeddings.position_ids(input_ids)
            kw["position_ids"] = pos + shift[:, None] * (input_ids != cfg.pad_token_id).long()
        else:
            real = _insert(torch.ones(b, t, dtype=torch.long, device=dev), at, valid.long()) if p_max else \
                torch.ones(b, t, dtype=torch.long, device=dev)
            kw["position_ids"] = (real.cumsum(1) - 1).clamp(min=0) + shift[:, None]
        return kw

    @staticmethod
    def _slot_valid(pp: Tensor, p_max: int) -> Tensor:
        """``[B, p_max]``: True at the slots that hold a row's prompt (the last ``P_v``)."""
        return torch.arange(p_max, device=pp.device)[None] >= (p_max - pp)[:, None]

    def _with_slots(self, ids: Tensor, at: int, valid: Tensor, unused_id: int) -> Tensor:
        """``ids`` with the slots of ``valid`` ``[B, P]`` inserted at ``at``: the placeholder id
        (never the padding id) where a row's prompt goes, ``unused_id`` in the slots it leaves empty."""
        slots = torch.full_like(valid, unused_id, dtype=ids.dtype).masked_fill(valid, self._placeholder)
        return _insert(ids, at, slots)

    def _embed_hook(self, module, inputs, out: Tensor):
        if self._fill is None:
            return None
        at, prompts, valid = self._fill
        p = prompts.shape[1]
        slots = torch.where(valid[..., None], prompts.to(out.dtype), out[:, at:at + p])
        return torch.cat((out[:, :at], slots, out[:, at + p:]), dim=1)

def _insert(t: Tensor, at: int, part: Tensor) -> Tensor:
    """``part`` ``[B, P]`` inserted into ``t`` ``[B, T]`` before column ``at``."""
    return torch.cat((t[:, :at], part, t[:, at:]), dim=1)


def generate_variants(model: MultiAdapterModel, input_ids: Tensor, attention_mask: Tensor | None, variants,
                      **options) -> Tensor:
    """:func:`lmlab.generate.generate` with row ``i`` continued by variant ``variants[i]``."""
    from lmlab.generate import generate

    if not isinstance(model, MultiAdapterModel):
        raise LmlabError(f"generate_variants' model must be a MultiAdapterModel, got {describe(model)}",
                         "wrap the base first: MultiAdapterModel(base, {'name': 'adapter/dir'})")
    with model.serving(variants):
        return generate(model, input_ids, attention_mask, **options)
