"""What a run's config says about memory, checked before any data is read (:mod:`lmlab.budget`)."""

from __future__ import annotations

import dataclasses

from lmlab.errors import LmlabError

#: the model settings that size its weights, largest effect first
_SIZING = ("n_layers", "d_model", "d_ff", "vocab_size", "max_positions")


def _sizing_settings(cfg, origin) -> str:
    """The settings the user gave that size the model's weights, each named where it was written
    (``--set model.n_layers``, ``recipe.toml:4: data.tokenizer.vocab_size``); else the usual ones."""
    keys = [f"model.{k}" for k in _SIZING if k in cfg.model.overrides]
    tok = cfg.data.tokenizer
    if "vocab_size" not in cfg.model.overrides and isinstance(tok, dict) and "vocab_size" in tok:
        keys.append("data.tokenizer.vocab_size")
    # those --set changed, when some did (the likely cause), else all those written
    keys = [k for k in keys if origin.from_command_line(k)] or keys
    if not keys:
        return "model.n_layers, model.d_model or the vocabulary"
    return " or ".join(origin.of(k) for k in keys)


def check_batch_fits(cfg, origin=None) -> None:
    """Refuse, before any data is read, a model or micro-batch that cannot fit in this machine's
    memory (:mod:`lmlab.budget`): the weights, the tokens the objective adds to the vocabulary
    (T5's sentinels), and the activations of one micro-batch (a coarse estimate: logits and their
    gradient, plus ~20 floats per token per layer and width unit), each with its way out."""
    from lmlab import budget
    from lmlab.models import CONFIG_ARCHITECTURE, check_fits_in_memory, get_preset, weight_count

    try:
        base = get_preset(cfg.model.preset)
    except LmlabError:
        return  # an unknown preset is reported later, with its own message
    known = {f.name for f in dataclasses.fields(base)}
    sized = {k: v for k, v in cfg.model.overrides.items() if k in known}
    planned = planned_vocab_size(cfg)
    if planned is not None:
        sized["vocab_size"] = planned
    try:
        model_cfg = dataclasses.replace(base, **sized)
    except (TypeError, ValueError, LmlabError):
        return  # a bad model setting is reported later, with its own message
    width, layers = getattr(model_cfg, "d_model", 0), getattr(model_cfg, "n_layers", 0)
    check_added_tokens(cfg, width if isinstance(width, int) else 0)
    try:  # the weights first; the way out names the settings given that size them
        check_fits_in_memory(model_cfg, CONFIG_ARCHITECTURE.get(type(model_cfg), ""))
    except LmlabError as e:
        from lmlab.config.overrides import NOWHERE

        raise LmlabError(e.problem, f"lower {_sizing_settings(cfg, origin or NOWHERE)}") from None
    check_objective_fits(cfg, model_cfg)
    vocab = getattr(model_cfg, "vocab_size", 0)
    if not all(isinstance(x, int) for x in (width, layers, vocab)):
        return
    tokens = cfg.train.batch_size * cfg.train.seq_len
    what = f"the activations of a micro-batch of {cfg.train.batch_size:,} x {cfg.train.seq_len} tokens"
    # the way out: a smaller micro-batch while one sequence fits beside the weights, else the model
    one_row = budget.activation_bytes(cfg.train.seq_len, vocab, width, layers)
    weights = budget.tensor_bytes(weight_count(model_cfg) or 0)
    total = budget.available_bytes()
    if total is not None and weights + one_row > total:
        fix = (f"the model ({describe_size(model_cfg)}) is too large to train here even one sequence "
               "at a time: choose a smaller model (model.n_layers, model.d_model, the vocabulary) or a "
               "shorter train.seq_len")
    else:
        fix = "lower train.batch_size and raise train.grad_accum (same global batch)"
    budget.require_fits(budget.activation_bytes(tokens, vocab, width, layers), what, fix)


def check_objective_fits(cfg, model_cfg) -> None:
    """The model's weights plus the objective's own network (ELECTRA's generator, SpanBERT's
    span-boundary head: :meth:`~lmlab.objectives.base.Objective.own_parameters`), which the
    trainer builds beside the model: refused before any data is read when together they exceed the
    memory, naming the objective's settings that size its network."""
    from lmlab import budget
    from lmlab.models import weight_count
    from lmlab.objectives import get_objective

    try:
        cls = get_objective(cfg.objective.name)
        own, settings = cls.own_parameters(cls.with_defaults(cfg.objective.params), model_cfg)
    except (LmlabError, TypeError, ValueError, KeyError):
        return  # a bad objective setting is reported when the objective is built
    if own <= 0:
        return
    total = own + (weight_count(model_cfg) or 0)
    budget.require_fits(budget.tensor_bytes(total),
                        f"the model plus the {cfg.objective.name} objective's own network (about {own:.3g} "
                        f"of its {total:.3g} parameters, in float32)", f"lower {settings}")


def describe_size(model_cfg) -> str:
    """``n_layers 100,000, d_model 64, vocabulary 300``: the sizes that set a model's memory."""
    parts = [f"{name} {getattr(model_cfg, key):,}" for key, name in
             (("n_layers", "n_layers"), ("d_model", "d_model"), ("vocab_size", "vocabulary"))
             if isinstance(getattr(model_cfg, key, None), int)]
    return ", ".join(parts)


def planned_vocab_size(cfg) -> int | None:
    """The vocabulary a run's model will have, as far as it is known before any data is read: the
    recipe's ``model.vocab_size``, else the tokenizer's to train (``data.tokenizer``'s ``vocab_size``)
    plus the tokens the objective adds (T5's sentinels); None when only the tokenizer will tell (a
    tokenizer folder, token shards). The one answer for every check made before the tokenizer exists
    (the special ids, the memory), so none cites the preset's own vocabulary (GPT-2's 50,257) for a
    run of 300."""
    given = cfg.model.overrides.get("vocab_size")
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    tok = cfg.data.tokenizer
    size = tok.get("vocab_size") if isinstance(tok, dict) else None  # a folder's: known once it is read
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    from lmlab.objectives import get_objective

    try:
        return size + get_objective(cfg.objective.name).added_tokens(cfg.objective.params)
    except (LmlabError, TypeError, ValueError):
        return size


def check_added_tokens(cfg, width: int) -> None:
    """Tokens the objective adds to the tokenizer (T5's ``num_sentinels``): each is a tokenizer entry
    and a row of the model's embedding and output tables."""
    from lmlab import budget
    from lmlab.objectives import get_objective

    try:
        added = get_objective(cfg.objective.name).added_tokens(cfg.objective.params)
    except (LmlabError, TypeError, ValueError):
        return  # a bad objective setting is reported when the objective is built
    if added > 0:
        what = f"objective {cfg.objective.name!r} adding {added:,} tokens to the vocabulary"
        budget.require_special_tokens_fit(added, what, "lower the objective's num_sentinels (T5 uses 100)",
                                          row_bytes=2 * budget.FLOAT32 * width)


def check_global_batch(batch_size: int, grad_accum: int, processes: int, items: int, what: str,
                       flags: tuple[str, str]) -> None:
    """Refuse a global batch (``batch_size`` x ``grad_accum`` micro-batches x ``processes``) larger
    than the training data (``items`` windows, pairs or prompts, ``what`` they are), once the data is
    read and before the first step: one optimizer step would see the same items more than once (and
    report a batch it never had). ``flags``: the names of batch_size and grad_accum in the command
    (``("train.batch_size", "train.grad_accum")``, ``("--batch-size", "--grad-accum")``). The one
    decision of pretraining and alignment (RLHF, DPO taking several micro-batches a step); a loop of
    one batch a step (fine-tuning, DPO at grad_accum 1, distillation) cuts it: :func:`batch_for_data`."""
    rows = batch_size * grad_accum * processes
    if rows <= items:
        return
    size, accum = flags
    parts = f"{size} {batch_size:,} x {accum} {grad_accum:,}"
    if processes > 1:
        parts += f" x {processes} processes"
    times = " x processes" if processes > 1 else ""
    raise LmlabError(f"a global batch of {rows:,} {what} ({parts}) is more than the {items:,} {what} of the "
                     "training data",
                     f"lower {size} or {accum} so that {size} x {accum}{times} is at most {items:,}, or add "
                     "training data")


def batch_for_data(batch_size: int, items: int, what: str, flag: str, say=None) -> int:
    """The batch a loop of one batch a step really takes from ``items`` training items (``what``
    they are: examples, pairs): ``batch_size``, or all the items when it is larger (one batch of
    everything each step, as Hugging Face's Trainer does). Every count, estimate and log line of the
    run uses this number, not the one asked for; a cut is said once, as a ``note:`` on ``say``
    (default stderr), naming the setting as the user wrote it (``flag``: ``--batch-size``,
    ``finetune.batch_size``, ``batch_size``). The one decision of fine-tuning, DPO (grad_accum 1)
    and distillation; a global batch of several micro-batches is refused instead
    (:func:`check_global_batch`)."""
    if items < 1 or batch_size <= items:
        return batch_size
    message = (f"note: {flag} {batch_size:,} is more than the {items:,} {what} of the training data; "
               f"each batch holds all {items:,} of them")
    if say is None:
        import sys

        print(message, file=sys.stderr, flush=True)
    else:
        say(message)
    return items
