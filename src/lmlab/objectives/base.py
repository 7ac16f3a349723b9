"""The contract between the trainer and a pretraining objective.

The trainer reads packed windows of real text from token shards and hands them to an objective
as a :class:`TokenBatch`. The objective turns them into model inputs and labels
(:meth:`Objective.prepare`, a pure function of the batch and a random generator, so masking is
reproducible and resumable) and computes its own loss (:meth:`Objective.loss`): it calls the
model's ``backbone`` with one mask description, the heads it chooses (``model.heads``), and a
loss from :mod:`lmlab.losses` (the helpers below do the common cases). A new objective is one
file and one registry line (docs/extending.md). Objectives are independent of architectures:
each one declares which architectures it can train and which model heads it needs; the registry in
``lmlab.objectives`` pairs them. An objective is an ``nn.Module`` so it may own parameters of its
own (ELECTRA's generator, SpanBERT's span-boundary head); the trainer optimises them together with
the model's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lmlab.arguments import tokenizer_argument
from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, selected_mean_cross_entropy, token_loss
from lmlab.models.attention_masks import MaskSpec
from lmlab.models.encoder.model import masked_rows
from lmlab.models.output import ModelOutput
from lmlab.models.scoring import scored_loss
from lmlab.models.seq2seq.model import shift_right


def most_frequent_share(targets: Tensor, keep: Tensor | None = None, vocab: int = 0) -> Tensor:
    """Share of ``targets`` equal to their most frequent value: the accuracy of always guessing
    that token (the unigram guess, measured on the batch itself, so never below the real one).

    With ``keep`` (a boolean mask shaped like ``targets``) only those positions count, and the
    counts go into a fixed ``[vocab]`` vector: no shape depends on the data, so nothing waits for
    the device. A 0-d tensor; 0 when nothing counts."""
    if keep is None:
        flat = targets.reshape(-1)
        if flat.numel() == 0:
            return torch.zeros((), device=targets.device)
        return torch.bincount(flat).max().float() / flat.numel()
    keep = keep.reshape(-1)
    counts = torch.zeros(vocab, device=targets.device).scatter_add_(
        0, targets.reshape(-1).masked_fill(~keep, 0), keep.float())
    return counts.max() / keep.sum().clamp(min=1)


def binary_auc(scores: Tensor, labels: Tensor, keep: Tensor | None = None) -> Tensor:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (rank statistic; ties averaged
    only approximately, by stable order), over the positions ``keep`` marks (all without it). 0.5
    when one class is missing (no ranking to judge). A 0-d tensor: the kept positions are ranked
    first rather than selected, so no shape depends on the data and nothing waits for the device."""
    scores, labels = scores.reshape(-1).float(), labels.reshape(-1).bool()
    keep = torch.ones_like(labels) if keep is None else keep.reshape(-1).bool()
    order = torch.argsort(scores, stable=True)
    order = order[torch.argsort((~keep[order]).to(torch.uint8), stable=True)]  # kept ones first, by score
    ranks = torch.zeros(order.numel(), dtype=torch.float64, device=order.device).scatter_(
        0, order, torch.arange(1, order.numel() + 1, dtype=torch.float64, device=order.device))
    positive = labels & keep
    n_pos = positive.sum().double()
    n_neg = keep.sum().double() - n_pos
    u = (ranks * positive).sum() - n_pos * (n_pos + 1) / 2
    auc = u / (n_pos * n_neg).clamp(min=1)
    return torch.where((n_pos > 0) & (n_neg > 0), auc, torch.full_like(auc, 0.5)).float()


def token_signal(logits: Tensor, labels: Tensor, prefix: str, ignore: int = IGNORE,
                 shown: Tensor | None = None) -> dict[str, Tensor]:
    """``{prefix}_acc`` (top-1 accuracy on the labelled positions) and ``{prefix}_acc_guess`` (the
    most-frequent-token guess); ``logits`` ``[N, V]`` for the labelled positions or ``[..., V]``.

    ``shown`` (boolean, shaped like ``labels``) marks positions whose input already is the answer
    (BERT's 10% of selected tokens left unchanged): they are not scored, since a model that copies
    its input would be right there without having learned anything from the context.

    The values are 0-d tensors, left on the device: with ``[..., V]`` logits for every position
    nothing here waits for it (the training engine reads all of a step's numbers at once).
    """
    keep = labels != ignore
    # max(-1).indices is argmax (the first maximum on ties, NaN wins) at half the cost on the CPU:
    # over [8, 256, 8192] logits 10 ms against 20 ms on 2 threads, 2.5% of a small CLM step
    pred = logits.max(-1).indices
    if pred.shape == labels.shape:  # every position: masks instead of selections (no data-dependent shape)
        if shown is not None:
            keep = keep & ~shown
        n = keep.sum().clamp(min=1)
        acc = ((pred == labels) & keep).sum().float() / n
        return {f"{prefix}_acc": acc,
                f"{prefix}_acc_guess": most_frequent_share(labels, keep, logits.shape[-1])}
    targets = labels[keep]  # logits for the labelled positions only: select the labels to match
    if shown is not None:
        hidden = ~shown[keep]
        pred, targets = pred[hidden], targets[hidden]
    acc = (pred == targets).float().mean() if targets.numel() else torch.zeros(())
    return {f"{prefix}_acc": acc, f"{prefix}_acc_guess": most_frequent_share(targets)}


def mask_of(inputs: dict[str, Tensor], causal: bool = False) -> MaskSpec:
    """The one mask description of prepared ``inputs``: padding (``attention_mask``), packed
    documents (``doc_ids``), a prefix (``prefix_mask``) or an explicit ``attention_pattern``."""
    return MaskSpec(causal=causal, padding=inputs.get("attention_mask"), doc_ids=inputs.get("doc_ids"),
                    prefix=inputs.get("prefix_mask"), pattern=inputs.get("attention_pattern"))


def encoder_hidden(model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
    """An encoder's final hidden states ``[B, T, D]`` for prepared ``inputs``."""
    return model.backbone(inputs["input_ids"], inputs.get("position_ids"), mask_of(inputs),
                          inputs.get("token_type_ids"))


def masked_lm(model: nn.Module, hidden: Tensor, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The ``mlm`` head at the labelled positions only: ``(logits [N, V], mean cross-entropy)``;
    the rows are gathered at the host-made ``label_positions`` when the inputs have them."""
    logits, targets, count = masked_rows(model.heads["mlm"], hidden, inputs["labels"],
                                         inputs.get("label_positions"))
    return logits, selected_mean_cross_entropy(logits, targets, count)


def teacher_forced(model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Any, Tensor]:
    """An encoder-decoder's scores on prepared ``inputs`` under teacher forcing (the decoder reads
    the labels shifted right, as transformers does), from its backbone calls (:meth:`encode`,
    :meth:`decode`) and LM head, and the mean cross-entropy against the labels: ``(output with
    logits, loss)``."""
    labels, cfg, padding = inputs["labels"], model.config, inputs.get("attention_mask")
    encoded = model.encode(inputs["input_ids"], padding, inputs.get("position_ids")).last_hidden_state
    decoder_input_ids = shift_right(labels, cfg.decoder_start_token_id, cfg.pad_token_id)
    logits = model.lm_scores(model.decode(decoder_input_ids, encoded, padding))
    return ModelOutput(logits=logits, encoder_last_hidden_state=encoded), token_loss(logits, labels)


def first_given(names: tuple[str, ...], given: Iterable[str] | None) -> str:
    """Of the parameters ``names`` that a rule ties together, the first the user gave (``given``;
    the first of ``names`` when none or unknown): the one its error is named by."""
    chosen = set(given or ())
    return next((n for n in names if n in chosen), names[0])


class Objective(nn.Module):
    """Base class of pretraining objectives (see the module docstring)."""

    #: registry name, e.g. "mlm"
    name: ClassVar[str] = ""
    #: model architectures it can train: "encoder", "decoder", "seq2seq", "rnn"
    architectures: ClassVar[tuple[str, ...]] = ()
    #: model heads it needs, first one first (e.g. ("mlm", "nsp"))
    heads: ClassVar[tuple[str, ...]] = ()
    #: what the loss is, which decides what the trainer derives from it: "nll" (mean negative
    #: log-likelihood of every token: perplexity and bits per byte), "masked_nll" (of the predicted
    #: tokens only: perplexity of those, no bits per byte) or "other" (a sum of parts: neither)
    loss_kind: ClassVar[str] = "other"
    #: :meth:`prepare` does data-dependent work best done on the host (span sampling, variable-length
    #: rows, positions to predict): the trainer runs it on the CPU batch in its data path, a step
    #: ahead on the prefetch thread, and moves the prepared inputs to the device like a data
    #: collator. False: ``prepare`` runs on the device batch (elementwise work, or big tensors
    #: such as ``[B, T, T]`` attention patterns that are cheaper to build than to copy).
    prepare_on_host: ClassVar[bool] = False
    #: the objective's own learning signals, each with its trivial baseline: (metric, baseline
    #: metric, what the baseline is); both are metrics that ``loss`` returns
    signals: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    #: parameters that do something only when another one has a given value: parameter -> (that
    #: other parameter, the value it needs); one set away from its default while the other is not
    #: so would be silently ignored, so :meth:`check_params` refuses it (NSP's MLM options with
    #: ``mlm = false``)
    only_when: ClassVar[dict[str, tuple[str, Any]]] = {}
    #: the richer rules of the same kind, by parameter name: :class:`lmlab.setting_rules.Needs` rows
    #: whose ``values`` is a tuple or a test of the partner's value (``noise`` holds
    #: ``"text_infilling"``), ``shown`` wording that condition (``objective.noise holding
    #: "text_infilling"``). A class's rows add to its parents' (MLM's ``seed`` only with static
    #: masking holds for NSP too); :meth:`check_params` runs them with :attr:`only_when`'s
    param_rules: ClassVar[tuple[Any, ...]] = ()

    @classmethod
    def declared_params(cls) -> dict[str, tuple[Any, Any]]:
        """Name -> ``(type hint, default)`` of every parameter the objective takes, including those its
        ``__init__`` passes on through ``**kwargs`` to a parent objective (NSP and UniLM take MLM's
        options). The hint is a value type of :mod:`lmlab.values`: it holds the parameter's range."""
        import inspect
        import typing

        found: dict[str, tuple[Any, Any]] = {}
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            hints = typing.get_type_hints(init, include_extras=True)
            params = inspect.signature(init).parameters
            for n, p in params.items():
                if n not in ("self", "tokenizer") and p.kind in (
                    inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
                ):
                    found.setdefault(n, (hints.get(n, Any), p.default))
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                break
        return found

    @classmethod
    def check_params(cls, params: dict[str, Any], given: Iterable[str] | None = None) -> None:
        """The rules between the objective's parameters that need no tokenizer (MLM's
        ``mask_token_prob + random_token_prob <= 1``): the one copy of each, run when a recipe is
        read (:func:`lmlab.config.load_config`, before any tokenizer is trained or text tokenised)
        and when the objective is made (:meth:`checked`). ``params``: every parameter, the defaults
        filled in; ``given``: the names the user gave (a recipe's keys), which an :attr:`only_when`
        rule refuses even at their default value (None, as ``__init__`` has them: those whose value
        is not the default). A single value's range is its type's (:meth:`declared_params`). Here:
        the :attr:`only_when` rules; an objective with rules of its own calls this first. Each error
        names its parameter (``LmlabError.setting``), for the caller to say where it was written."""
        from lmlab.setting_rules import SettingNames, check_rules

        if given is None:
            defaults = cls.with_defaults({})
            chosen = {k for k in params if params[k] != defaults.get(k)}
        else:
            chosen = set(given)
        check_rules(cls.rules(), chosen, params.get, SettingNames("key", prefix="objective."))

    @classmethod
    def rules(cls) -> list[Any]:
        """Every rule between the objective's parameters (:attr:`only_when` as
        :class:`~lmlab.setting_rules.Needs` rows, then :attr:`param_rules`, a parent's first), for
        :meth:`check_params`: the one list, which the docs describe."""
        from lmlab.setting_rules import Needs

        rows = [Needs(name, other, (needed,)) for name, (other, needed) in cls.only_when.items()]
        for klass in reversed(cls.__mro__):
            rows += [r for r in klass.__dict__.get("param_rules", ()) if r not in rows]
        return rows

    @classmethod
    def needed_roles(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """The special-token roles (``mask``, ``cls``, ``pad``...: :data:`lmlab.tokenizers.ROLES`)
        the objective needs of its tokenizer under ``params`` (the defaults filled in): the one
        statement of them, checked against a recipe's ``[data] tokenizer`` table when the recipe is
        read (:func:`lmlab.config.run.check_objective_tokens`) and against the tokenizer when the
        objective is made (:meth:`require_roles`). Default: none."""
        return ()

    def require_roles(self, tokenizer, params: dict[str, Any]) -> dict[str, int]:
        """Role -> id of each of :meth:`needed_roles`, or the one-line error of the first missing."""
        from lmlab.objectives.masking import require_role

        return {role: require_role(tokenizer, role, self.name) for role in self.needed_roles(params)}

    @classmethod
    def check_train(cls, params: dict[str, Any], train: Any) -> None:
        """What the objective needs of a run's ``[train]`` settings (``train``: a
        :class:`~lmlab.config.TrainConfig`), e.g. NSP's two rows per batch; checked when a recipe is
        read, before anything is tokenised. Default: nothing."""

    @classmethod
    def checked(cls, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` (some of the objective's parameters, as passed to ``__init__``) each checked
        against its type, then :meth:`check_params` on all of them (defaults filled in): what every
        ``__init__`` runs, so Python code gets the refusals a recipe gets. The checked values.

        Strict, as every argument of the Python API (:func:`lmlab.arguments.number_argument`): a
        string is not a number, a bool not a number and 0 or 1 not a bool. A recipe's values reach
        here already read as their kinds (``lmlab.config.fields.coerce``), so it loses nothing."""
        from lmlab import values

        hints = cls.declared_params()
        out = {k: values.check(hints[k][0], v, f"objective.{k}", strict=True) if k in hints else v
               for k, v in params.items()}
        cls.check_params(cls.with_defaults(out))
        return out

    @classmethod
    def with_defaults(cls, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with every parameter it leaves out at its default."""
        import inspect

        defaults = {k: d for k, (_, d) in cls.declared_params().items() if d is not inspect.Parameter.empty}
        return {**defaults, **params}

    @classmethod
    def added_tokens(cls, params: dict[str, Any]) -> int:
        """How many tokens the objective adds to the tokenizer for ``params`` (T5's sentinels)."""
        return 0

    @classmethod
    def own_parameters(cls, params: dict[str, Any], model_config) -> tuple[int, str]:
        """``(count, settings)``: about how many parameters the objective's own network holds
        (ELECTRA's generator, SpanBERT's span-boundary head) for ``params`` (defaults filled in)
        beside a model of ``model_config``, and the settings that size it, for the memory check
        made before any data is read (:func:`lmlab.config.fits.check_batch_fits`). Default: none."""
        return 0, ""

    @classmethod
    def step_flops(cls, model_config, seq_len: int, rows: int, params: dict[str, Any]) -> float:
        """Training FLOPs (forward + backward, :mod:`lmlab.models.flops` conventions) of ``rows``
        rows of ``seq_len`` tokens under ``params``: the lab's FLOPs budgets and the trainer's MFU
        both come from here. Default: a decoder predicting every position; an encoder with its
        output head at every position; an encoder-decoder reading and writing the whole row.
        Objectives that predict fewer positions or add a network of their own say so."""
        from lmlab.models.config import DecoderConfig, EncoderConfig, Seq2SeqConfig
        from lmlab.models.flops import training_flops

        if isinstance(model_config, (DecoderConfig, EncoderConfig)):
            return float(training_flops(model_config, seq_len, rows))
        if isinstance(model_config, Seq2SeqConfig):
            return float(training_flops(model_config, seq_len, rows, decoder_len=seq_len))
        raise LmlabError(
            "FLOPs are counted for encoder, decoder and encoder-decoder Transformers, "
            f"not a {type(model_config).__name__}",
            "use budget = {tokens = N} for this model",
        )

    def __new__(cls, *args: Any, **params: Any):
        """Making an objective (``MaskedLM(tok, mask_prob=0.2)``, ``get_objective("mlm")(tok, ...)``,
        a subclass of yours) first checks every parameter given, all at once, before ``__init__``
        runs: an unknown name is refused as the recipe refuses an unknown key (the closest named),
        each value against its type, and the rules between them (:meth:`check_params`, on the
        whole call: NSP's ``mlm=False`` with MLM's ``mask_prob``). One line, the recipe's words."""
        if args or params:
            cls.check_call(args[1:], {k: v for k, v in params.items() if k != "tokenizer"})
        return super().__new__(cls)

    @classmethod
    def check_call(cls, args: tuple[Any, ...], params: dict[str, Any]) -> dict[str, Any]:
        """The parameters of a call ``cls(tokenizer, *args, **params)`` by name, checked as
        :meth:`checked` checks them (a default never trips a rule: only values that are not the
        default count as given, as in a saved recipe), or the one-line error of the first wrong."""
        import inspect

        from lmlab.errors import suggest

        hints = cls.declared_params()
        for key in params:
            if key not in hints:
                fix = suggest(key, hints) if hints else "it takes no parameters"
                raise LmlabError(f"unknown parameter {key}= of objective {cls.name!r}", fix)
        positional = [n for n, p in inspect.signature(cls.__init__).parameters.items()
                      if n not in ("self", "tokenizer") and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        if len(args) > len(positional):
            raise LmlabError(f"objective {cls.name!r} takes {len(positional)} positional parameters after "
                             f"the tokenizer, got {len(args)}",
                             "pass the parameters by name, e.g. " + (f"{positional[0]}=..." if positional
                                                                     else "none"))
        named = dict(zip(positional, args))
        twice = [k for k in named if k in params]
        if twice:
            raise LmlabError(f"objective {cls.name!r} got {twice[0]}= twice (by position and by name)",
                             f"pass {twice[0]} once")
        return cls.checked({**named, **params})

    def __init__(self, tokenizer, **params: Any):
        super().__init__()
        if not isinstance(getattr(tokenizer, "vocab_size", None), int):  # what an objective reads of it
            tokenizer_argument(tokenizer, f"{type(self).__name__}'s tokenizer")
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.special_ids = torch.tensor(sorted(tokenizer.special_ids), dtype=torch.long)

    def setup(self, model: nn.Module) -> None:
        """Called once with the freshly built model, before the optimizer is made (and before a
        checkpoint is restored). Objectives whose own parameters depend on the model (ELECTRA's
        generator, which shares the model's embeddings; SpanBERT's span-boundary head) build them
        here. Default: nothing."""

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        """Model inputs and labels for one batch (keyword arguments of ``model(...)``)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss to minimise, plus extra metrics to log (e.g. accuracy, per-part losses).
        Objectives compute their own (backbone, heads, :mod:`lmlab.losses`); this default scores
        ``inputs["labels"]`` with the model's first head, as tasks do
        (:func:`lmlab.models.scoring.scored_loss`: teacher forcing for an encoder-decoder)."""
        if "labels" not in inputs:
            raise LmlabError(f"objective {self.name!r}: prepare() gave no labels for the default loss",
                             "return labels from prepare(), or override Objective.loss")
        return scored_loss(model, inputs), {}

    def is_special(self, ids: Tensor) -> Tensor:
        """Boolean mask of special-token positions (never masked or corrupted)."""
        return torch.isin(ids, self.special_ids.to(ids.device))
