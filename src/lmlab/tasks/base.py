"""What every fine-tuning task shares: the :class:`Task` contract, batching and head swapping.

A task is three decisions (lecture 4, "fine-tuning"): how an example becomes model inputs
(:meth:`Task.features`), which head reads the network's hidden states (:attr:`Task.head`), and
which metrics judge the predictions (:meth:`Task.score`). The fine-tuning loop
(:mod:`lmlab.finetune`) only calls this interface:

1. ``task.read(path)`` -> examples; ``task.fit(train)`` learns the label set and
   ``task.check(dev)`` rejects labels never seen in training;
2. ``model = task.prepare_model(model)`` swaps the pretraining head for the task head
   (:func:`attach_head`);
3. ``feats = task.features(examples, tokenizer)``; each step ``task.loss(model, collate(batch))``;
4. ``task.evaluate(model, examples)`` -> ``{"accuracy": ..., ...}``.

``task.state()`` (saved as ``task.json`` beside the fine-tuned weights) is what
:func:`lmlab.tasks.load_task` needs to rebuild the task for ``lmlab evaluate``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from lmlab.arguments import number_argument
from lmlab.errors import LmlabError, a_or_an
from lmlab.losses import IGNORE
from lmlab.models.scoring import scored_loss
from lmlab.tasks.readers import BadLines, Example, policy
from lmlab.tasks.tables import FORMATS, ROLES, column_choice, read_table
from lmlab.values import Count, LossWeight, Size

#: feature keys that become tensors; everything else stays per-feature metadata
TENSOR_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "start_positions", "end_positions",
               "lm_labels", "doc_ids", "position_ids")
#: padding value of each padded key (input_ids use the tokenizer's pad id)
PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "labels": IGNORE, "lm_labels": IGNORE, "doc_ids": -1,
              "position_ids": 0}


@dataclass
class TaskOptions:
    """Settings of how examples become inputs; saved with the model so evaluation repeats them.

    * ``max_length``: tokens per input (longer inputs are truncated; SQuAD contexts are split).
    * ``doc_stride``: SQuAD, tokens shared by two consecutive windows of a long context.
    * ``max_answer_length``: SQuAD, longest answer span (tokens) considered at prediction.
    * ``lm_weight``: decoder classification, weight λ of the auxiliary LM loss (GPT: 0.5).
    * ``decoder_style``: ``gpt`` (``[START] a [DELIM] b [EXTRACT]``) or ``last`` (plain text,
      classify from the last token's hidden state).
    * ``max_target_length``: text-to-text, tokens generated at most.
    * ``prefix``: text-to-text generation, text put before every source (``"summarize: "``).
    * ``rouge_stemmer``: text-to-text, ROUGE with Porter stemming (as published summarisation
      numbers usually are; the ``metrics`` extra).
    * ``format``, ``header``, ``delimiter``, ``fields``: how data files are read
      (:mod:`lmlab.tasks.tables`): the file format (None: from the extension), whether TSV/CSV
      files have a header row (None: decide), the CSV delimiter, and role -> column (name or
      0-based index), e.g. ``{"text": 1, "label": 0}``.
    * ``template``, ``packing``: instruction tuning (:mod:`lmlab.tasks.instruct`): the prompt
      template ("" = the default) and whether examples are packed into rows (None = decoders).

    A number's kind and range is its field's type (:mod:`lmlab.values`, as ``lmlab finetune``'s
    settings), checked strictly by :meth:`validate` (``max_length=True`` or ``"128"`` is refused).
    """

    max_length: Count = 128
    doc_stride: Size = 128
    max_answer_length: Count = 30
    lm_weight: LossWeight = 0.5
    decoder_style: str = "gpt"
    max_target_length: Count = 32
    prefix: str = ""
    rouge_stemmer: bool = False
    format: str | None = None
    header: bool | None = None
    delimiter: str | None = None
    fields: dict[str, str | int] = dataclasses.field(default_factory=dict)
    template: str = ""
    packing: bool | None = None

    def validate(self) -> TaskOptions:
        if self.format is not None and self.format not in FORMATS:
            raise LmlabError(f"unknown data format {self.format!r}", f"use one of: {', '.join(FORMATS)}")
        if self.header not in (None, True, False):
            raise LmlabError(f"header must be true, false or unset, got {self.header!r}",
                             "pass --header or --no-header")
        if not isinstance(self.fields, dict) or set(self.fields) - set(ROLES):
            raise LmlabError(f"unknown data fields {sorted(set(self.fields) - set(ROLES))}",
                             f"choose columns for some of: {', '.join(ROLES)}")
        self.fields = {k: column_choice(v) for k, v in self.fields.items() if v is not None}
        for name, kind in _NUMBER_FIELDS.items():
            setattr(self, name, number_argument(kind, getattr(self, name), f"task option {name}"))
        if self.packing not in (None, True, False) or not isinstance(self.template, str):
            raise LmlabError(f"packing must be true, false or unset and template a string, got "
                             f"{self.packing!r}, {type(self.template).__name__}",
                             "pass --no-packing or --template FILE")
        if self.decoder_style not in ("gpt", "last"):
            raise LmlabError(f"unknown decoder_style {self.decoder_style!r}", "use 'gpt' or 'last'")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names}).validate()


#: the number fields of :class:`TaskOptions` -> their value types (its annotations of lmlab.values)
_NUMBER_FIELDS = {name: hint for name, hint in typing.get_type_hints(TaskOptions, include_extras=True).items()
                  if typing.get_origin(hint) is typing.Annotated}


class Task:
    """Base class; subclasses set the class attributes and override what differs."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = ""
    main_metric: ClassVar[str] = ""
    architectures: ClassVar[tuple[str, ...]] = ("encoder",)
    #: option defaults of this task that differ from :class:`TaskOptions`'
    defaults: ClassVar[dict[str, Any]] = {}
    #: the columns this task reads from a table file (:data:`lmlab.tasks.tables.ROLES`)
    roles: ClassVar[tuple[str, ...]] = ()
    #: those of ``roles`` a file may lack
    optional_roles: ClassVar[tuple[str, ...]] = ()

    def __init__(self, name: str | None = None, options: TaskOptions | None = None):
        self.name = name or self.name
        self.options = (options or TaskOptions(**self.defaults)).validate()
        self.labels: list = []

    # ----------------------------------------------------------------- data
    def read(self, path, on_bad_line: str | BadLines = "error", warn=None) -> list[Example]:
        return self.read_table(path, on_bad_line, warn)

    def read_table(self, path, on_bad_line: str | BadLines = "error", warn=None) -> list[Example]:
        """Examples from a TSV, CSV, JSON Lines or Parquet file, columns chosen by ``options``
        (:mod:`lmlab.tasks.tables`); a malformed row goes to the bad-line policy."""
        bad = policy(on_bad_line, warn)
        o = self.options
        roles = [dataclasses.replace(ROLES[r], required=ROLES[r].required and r not in self.optional_roles)
                 for r in self.roles]
        rows = read_table(path, roles, o.fields, o.format, o.header, o.delimiter, bad=bad,
                          probe=self.header_probe, note=bad.warn)
        out = []
        for where, values in rows:
            e = self.example(values, where, bad)
            if e is not None:
                out.append(e)
        bad.done(path, len(out))
        if not out:
            raise LmlabError(f"{path} holds no usable examples", "check the file and its columns")
        return out

    def example(self, values: dict[str, Any], where: str, bad: BadLines) -> Example | None:
        """The example of one table row (``role -> value``), or None after reporting it to ``bad``."""
        raise NotImplementedError

    def header_probe(self, first: dict[str, str], rest: list[dict[str, str]]) -> bool | None:
        """Whether the first row of a table whose columns are all chosen by index is a header
        (None: cannot tell; the user must pass --header or --no-header)."""
        return None

    def fit(self, train: Sequence[Example]) -> None:
        """Learn what training data fixes (the label set); default: nothing."""

    def check(self, examples: Sequence[Example], what: str = "dev") -> None:
        """Reject examples the model cannot handle (labels unseen in training); default: none."""

    @property
    def num_labels(self) -> int:
        return max(1, len(self.labels))

    # ----------------------------------------------------------------- model
    def prepare_model(self, model):
        """Return ``model`` with this task's head (see :func:`attach_head`)."""
        check_architecture(self, model)
        return attach_head(model, (self.head,), self.num_labels)

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        raise NotImplementedError

    def model_inputs(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The keyword arguments of the model's forward for a collated batch."""
        keys = ["input_ids", "attention_mask", "labels", "start_positions", "end_positions"]
        if getattr(model.config, "type_vocab_size", 0) and model.config.type_vocab_size > 1:
            keys.append("token_type_ids")
        return {k: batch[k] for k in keys if k in batch}

    def loss(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return scored_loss(model, self.model_inputs(model, batch))

    # ----------------------------------------------------------------- evaluation
    def predict(self, model, examples: Sequence[Example], batch_size: int = 64) -> list:
        raise NotImplementedError

    def score(self, predictions: Sequence, examples: Sequence[Example]) -> dict[str, float]:
        raise NotImplementedError

    def metric_names(self, examples: Sequence[Example]) -> tuple[str, ...] | None:
        """The names of the metrics :meth:`evaluate` gives, told before any model runs by scoring
        the gold answers of a few of ``examples`` (None where that cannot tell): what a
        ``select_metric`` is checked against before training."""
        sample = list(examples)[:8]
        if not sample:
            return None
        try:
            return tuple(self.score([e.label for e in sample], sample))
        except Exception:  # a task whose predictions are not its labels: not known before a model runs
            return None

    def baseline(self, train: Sequence[Example],
                 dev: Sequence[Example]) -> tuple[str, dict[str, float]] | None:
        """The trivial answer and its scores on ``dev``: the majority class of ``train`` for class
        labels, the mean for numbers (its correlation is 0); None where there is none (tags, spans)."""
        labels = [e.label for e in train]
        if not labels or not dev:
            return None
        if all(isinstance(x, str) for x in labels):
            counts: dict[str, int] = {}
            for x in labels:
                counts[x] = counts.get(x, 0) + 1
            top = max(counts, key=lambda k: (counts[k], k))
            try:
                return f"majority class {top!r}", self.score([top] * len(dev), dev)
            except Exception:  # a task that cannot score a constant answer has no baseline
                return None
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in labels):
            return "mean prediction", {"pearson": 0.0, "spearman": 0.0}
        return None

    def evaluate(self, model, examples: Sequence[Example], batch_size: int = 64) -> dict[str, float]:
        """Predict and score ``examples``: the task's metrics by name."""
        return self.predict_and_score(model, examples, batch_size)[1]

    def predict_and_score(self, model, examples: Sequence[Example],
                          batch_size: int = 64) -> tuple[list, dict[str, float]]:
        """The predictions for ``examples`` (class names, numbers, tag lists, answer texts) and
        their metrics by name."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                preds = self.predict(model, examples, batch_size)
        finally:
            model.train(was_training)
        return preds, {k: float(v) for k, v in self.score(preds, examples).items()}

    # ----------------------------------------------------------------- persistence
    def state(self) -> dict[str, Any]:
        return {"task": self.name, "architecture": self.architectures[0], "kind": type(self).__name__,
                "labels": list(self.labels), "options": dataclasses.asdict(self.options)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.labels = list(state.get("labels", []))


# --------------------------------------------------------------------------- helpers


def table_chosen(options, path) -> bool:
    """True when a preset (GLUE, SQuAD, CoNLL) reads ``path`` as a generic table rather than by its
    own file layout: a column, format, header or delimiter was chosen, or the file is no TSV."""
    if options.fields or options.format or options.header is not None or options.delimiter:
        return True
    name = str(path).lower().removesuffix(".gz")
    return not name.endswith((".tsv", ".txt", ".tab"))


def check_architecture(task: Task, model) -> None:
    arch = getattr(model, "architecture", "")
    if arch not in task.architectures:
        need = " or ".join(task.architectures)
        raise LmlabError(f"task {task.name!r} ({type(task).__name__}) needs {a_or_an(need)} model, "
                         f"the checkpoint is {a_or_an(arch or type(model).__name__)}",
                         "pick a checkpoint of the right architecture or another task")


def check_tokenizer(model, tokenizer=None):
    """The tokenizer to use with ``model``: it must exist and fit the embedding table."""
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise LmlabError("the checkpoint has no tokenizer",
                         "pass --tokenizer DIR (the one it was pretrained with)")
    v = getattr(model.config, "vocab_size", None)
    if v is not None and tokenizer.vocab_size > v:  # (a --tokenizer is checked in full by lmlab.loading)
        raise LmlabError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary has {v}: "
                         "they do not belong together", "use the tokenizer saved with the checkpoint")
    return tokenizer


def attach_generation_head(task: Task, model):
    """``model`` ready for a task that writes its answer as text (text-to-text, instructions):
    checked against the task, with its LM head, and ``task.end`` set to the token that ends an
    answer (``task.end_id``)."""
    check_architecture(task, model)
    tok = check_tokenizer(model)
    model = attach_head(model, ("lm",), model.config.num_labels)
    task.end = task.end_id(tok, model)
    return model


def attach_head(model, heads: tuple[str, ...], num_labels: int, vocab_size: int | None = None):
    """``model`` rebuilt with task ``heads`` (and ``num_labels`` outputs), keeping every weight that fits.

    The pretraining heads (MLM, NSP, LM...) are dropped unless named in ``heads``; the body,
    the pooler and, when the model already had the same head with the same shape (continued
    fine-tuning), that head's weights are copied; new heads start from the model's usual
    initialisation. ``vocab_size`` larger than the model's grows the token embeddings (and a
    tied or untied LM head) by new randomly initialised rows, for added special tokens.
    """
    from lmlab.models import build_model

    cfg = model.config
    changes = {}
    if getattr(cfg, "num_labels", None) != num_labels:
        changes["num_labels"] = num_labels
    if vocab_size is not None and vocab_size > cfg.vocab_size:
        changes["vocab_size"] = vocab_size
    if not changes and tuple(model.head_names) == tuple(heads):
        return model
    new_cfg = dataclasses.replace(cfg, **changes).validate() if changes else cfg
    new = build_model(new_cfg, heads=heads, architecture=model.architecture)
    old_state, new_state = model.state_dict(), new.state_dict()
    keep = {}
    for k, t in new_state.items():
        o = old_state.get(k)
        if o is None:
            continue
        if o.shape == t.shape:
            keep[k] = o
        elif "vocab_size" in changes and o.dim() == t.dim() and o.shape[1:] == t.shape[1:] \
                and o.shape[0] < t.shape[0]:
            grown = t.clone()
            grown[: o.shape[0]] = o
            keep[k] = grown
    new.load_state_dict(keep, strict=False)
    if hasattr(new, "tie_weights"):
        new.tie_weights()
    new.tokenizer = getattr(model, "tokenizer", None)
    grown_from = getattr(model, "vocab_grown_from", None)
    if "vocab_size" in changes or grown_from:  # the base's size: its new rows exist only in this model
        new.vocab_grown_from = grown_from or cfg.vocab_size
    return new.to(next(model.parameters()).device).train(model.training)


def collate(feats: Sequence[dict[str, Any]], pad_id: int, device: torch.device | str = "cpu") -> dict:
    """Stack features into tensors, right-padding sequences (ids with ``pad_id``, labels with -100)."""
    out = {}
    for key in TENSOR_KEYS:
        if key not in feats[0]:
            continue
        values = [f[key] for f in feats]
        if isinstance(values[0], list):
            width = max(len(v) for v in values)
            fill = pad_id if key == "input_ids" else PAD_VALUES.get(key, 0)
            values = [v + [fill] * (width - len(v)) for v in values]
        dtype = torch.float32 if any(isinstance(x, float) for x in _flat(values)) else torch.long
        out[key] = torch.tensor(values, dtype=dtype, device=device)
    return out


def _flat(values) -> Iterator:
    for v in values:
        if isinstance(v, list):
            yield from v
        else:
            yield v


def batches(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def by_length(feats: Sequence[dict[str, Any]], size: int) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
    """Batches of features of similar length for prediction: ``(their indices, the features)``.

    Sorting by length before batching keeps padding small; callers put results back by index.
    """
    order = sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    for k in range(0, len(order), size):
        idx = order[k:k + size]
        yield idx, [feats[i] for i in idx]


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def pad_id_of(tokenizer, model=None) -> int:
    pad = tokenizer.pad_id
    if pad is None and model is not None:
        pad = getattr(model.config, "pad_token_id", None)
    if pad is None:
        pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    return pad


def truncate_pair(a: list, b: list | None, budget: int) -> tuple[list, list | None]:
    """Longest-first truncation of two token lists to ``budget`` tokens in total."""
    if b is None:
        return a[:max(0, budget)], None
    a, b = list(a), list(b)
    while len(a) + len(b) > budget and (a or b):
        if len(a) >= len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def unseen_label_error(label, where: str, known: Sequence) -> LmlabError:
    shown = ", ".join(repr(k) for k in list(known)[:10])
    return LmlabError(f"{where}: label {label!r} never occurs in the training data (labels: {shown})",
                      "fix the label or add training examples of that class")
