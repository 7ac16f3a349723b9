"""``[finetune]``: fine-tuning hyper-parameters, one typed section checked once, with the usual
BERT/GPT defaults.

Defaults follow the BERT paper's fine-tuning recipe (Devlin et al. 2019, appendix A.3): AdamW
(Loshchilov & Hutter 2019) with weight decay 0.01, learning rate in {2,3,5}e-5, batch 32, 2-4
epochs, linear warmup over the first 10% of steps then linear decay to 0. The task options
(``max_length``...) are passed on to :class:`lmlab.tasks.TaskOptions`; None keeps the task's own
default (e.g. 384 tokens for SQuAD).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab import values
from lmlab.config.overrides import NOWHERE, Origin, suggest
from lmlab.config.rules import (
    KEYWORDS,
    ForArchitectures,
    Needs,
    NotAbove,
    SettingNames,
    check_architecture,
    check_rules,
)
from lmlab.errors import LmlabError
from lmlab.values import (
    BatchSize,
    Count,
    Delimiter,
    Device,
    Fraction,
    GradClip,
    LearningRateOrAuto,
    LearningRates,
    LossWeight,
    Probability,
    Seed,
    Size,
    Text,
    Threads,
    WeightDecay,
    choice,
)

#: FinetuneConfig fields that are task options (forwarded to lmlab.tasks.make_task)
TASK_OPTION_FIELDS = ("max_length", "doc_stride", "max_answer_length", "lm_weight", "decoder_style",
                      "max_target_length", "prefix", "rouge_stemmer", "format", "header", "delimiter",
                      "fields", "template", "packing")


#: the learning rates ``lr = "auto"`` tries, each a full fine-tuning run, the best on the selection
#: data (``select_on``) kept (the BERT paper's recipe, Devlin et al. 2019 §A.3, with a range wide
#: enough for tiny and base models)
LR_SWEEP = (1e-4, 3e-4, 1e-3)
Precision = choice("auto", "fp32", "bf16")
DecoderStyle = choice("gpt", "last")
#: the data that chooses the epoch and the lr (lmlab.finetune.selection): the dev file, or a
#: validation slice of the training file (the dev file then only scores the chosen model)
SelectOn = choice("dev", "train-slice")
SelectFraction = values.number(0, 1, low_open=True, high_open=True,
                               hint="a fraction greater than 0 and less than 1, e.g. 0.1")


#: how a malformed data row is handled; the data file formats (lmlab.tasks.tables.FORMATS)
OnBadLine = choice("error", "skip")
DataFormat = choice("tsv", "csv", "jsonl", "parquet")
#: a data file column: a header name or a 0-based index
Column = Text | Size

_QA = ("qa", "squad")
#: the condition of the settings a task other than instruction tuning reads
_CLASSIFICATION = "a task other than instruct"


def _classification(task: Any) -> bool:
    return task != "instruct"
#: what a fine-tuning setting needs of the others, by field name (:mod:`lmlab.config.rules`): the
#: one statement of them, for ``lmlab finetune``'s flags, ``--config``/``--set``, a grid's
#: ``[finetune]`` and ``[[tasks]] finetune``, and the keywords of :func:`lmlab.finetune.finetune`
RULES = (
    Needs("select_fraction", "select_on", ("train-slice",)),
    Needs("lr_sweep", "lr", ("auto",)),
    Needs("max_bad_fraction", "on_bad_line", ("skip",)),
    Needs("delimiter", "format", ("csv", None), note="or .csv files"),
    NotAbove("warmup_steps", "max_steps", why="the learning rate would never reach lr"),
)
#: what a setting needs of the task (``task``: its name), checked where the task is known
#: (:meth:`FinetuneConfig.check_task`), before any model loads
TASK_RULES = (
    Needs("doc_stride", "task", _QA, why="context windows of extractive QA"),
    Needs("max_answer_length", "task", _QA, why="answer spans of extractive QA"),
    Needs("rouge_stemmer", "task", ("text2text",)),
    Needs("packing", "task", ("instruct",)),
    Needs("template", "task", ("instruct",)),
    # a decoder classifier's settings: instruction tuning (a decoder's generation task) reads neither
    *(Needs(name, "task", _classification, shown=_CLASSIFICATION, why=why, verb="use") for name, why in (
        ("lm_weight", "the weight of a decoder classifier's auxiliary LM loss"),
        ("decoder_style", "how a decoder classifier lays out its input"))),
    Needs("prefix", "task", _classification, shown=_CLASSIFICATION, verb="use",
          why="the text put before an encoder-decoder's source; instruction tuning uses its template"),
)
#: what a setting needs of the model's architecture (or, for some, of the task): the options only
#: one formulation of a task reads (:func:`lmlab.tasks.make_task`), checked where the checkpoint's
#: architecture is first known, from its config before any weight is read
#: (:meth:`FinetuneConfig.check_architecture`: ``lmlab finetune``, ``finetune()``, a grid's arms)
ARCHITECTURE_RULES = (
    ForArchitectures("lm_weight", ("decoder",), "the weight of a decoder classifier's auxiliary LM loss"),
    ForArchitectures("decoder_style", ("decoder",), "how a decoder classifier lays out its input"),
    ForArchitectures("max_target_length", ("seq2seq",), "the longest answer generated",
                     tasks=("instruct",)),
    ForArchitectures("prefix", ("seq2seq",), "the text put before an encoder-decoder's source"),
)


@dataclass
class FinetuneConfig:
    """Every field's type (:mod:`lmlab.values`) is its range, checked by :meth:`from_dict` before
    anything is read; :meth:`validate` checks what relates fields to each other."""

    lr: LearningRateOrAuto = 5e-5         # or "auto": a sweep over lr_sweep, chosen on select_on
    lr_sweep: LearningRates = LR_SWEEP
    batch_size: BatchSize = 32
    group_by_length: bool = True          # batches of similar lengths (less padding); see epoch_batches
    eval_batch_size: BatchSize = 64
    epochs: Count = 3
    max_steps: Count | None = None        # stops early when set (and overrides epochs when larger)
    warmup_ratio: Fraction = 0.1          # share of all steps spent warming up
    warmup_steps: Size | None = None      # overrides warmup_ratio
    weight_decay: WeightDecay = 0.01
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    grad_clip: GradClip = 1.0             # max global gradient norm; 0 = no clipping
    seed: Seed = 0
    eval_every: Count | None = None       # evaluate every N steps too (default: at each epoch end)
    log_every: Count = 10
    max_train_examples: Count | None = None
    max_eval_examples: Count | None = None
    select_metric: Text | None = None     # metric that picks the best checkpoint (task's main one)
    select_on: SelectOn = "dev"           # the data that picks the step and the --lr auto rate
    select_fraction: SelectFraction = 0.1  # select_on="train-slice": the share of train held out for it
    on_bad_line: OnBadLine = "error"
    max_bad_fraction: Probability = 0.01  # with on_bad_line="skip": more malformed rows stop the run
    device: Device = "auto"
    precision: Precision = "auto"         # auto = bf16 autocast on a CUDA GPU that has it, else fp32
    threads: Threads | None = None        # None or 0: OMP_NUM_THREADS, else auto (lmlab.runtime)
    progress: bool = True
    loggers: tuple[Text, ...] = ()        # also write the metrics rows there, e.g. ("tensorboard",)
    save_every: Count | None = None       # resume state every N steps (default: after each evaluation)
    # task options (None = the task's default)
    max_length: Count | None = None
    doc_stride: Size | None = None
    max_answer_length: Count | None = None
    lm_weight: LossWeight | None = None
    decoder_style: DecoderStyle | None = None
    max_target_length: Count | None = None
    prefix: str | None = None
    rouge_stemmer: bool | None = None
    template: str | None = None           # instruct: the prompt template text (None = the default)
    packing: bool | None = None           # instruct: several examples per row (None = on for decoders)
    # how data files are read (lmlab.tasks.tables; None = from the extension / decided / the defaults)
    format: DataFormat | None = None
    header: bool | None = None
    delimiter: Delimiter | None = None
    fields: dict[str, Column] | None = None   # role -> column name or 0-based index

    def validate(self, given=(), names: SettingNames = KEYWORDS) -> FinetuneConfig:
        """What relates fields to each other (each field's range is its type, checked by from_dict):
        a field of ``given`` (those the user set) without the partner it needs (:data:`RULES`) is
        one line naming both as the user writes them (``names``)."""
        from lmlab.config.loggers import check_loggers

        check_loggers(self.loggers, "loggers")
        check_rules(RULES, given, lambda name: getattr(self, name), names)
        return self

    def check_task(self, task: str, given=(), names: SettingNames = KEYWORDS) -> None:
        """The settings of ``given`` that only some tasks read (:data:`TASK_RULES`: ``doc_stride``
        for extractive QA, ``template`` for instruct...) refused for any other ``task``."""
        values = {"task": task}
        check_rules(TASK_RULES, given, lambda name: values[name] if name in values else getattr(self, name),
                    names)

    def check_architecture(self, architecture: str, task: str | None, given=(),
                           names: SettingNames = KEYWORDS, model: str = "") -> None:
        """The settings of ``given`` that a model of ``architecture`` fine-tuned on ``task`` would
        ignore (:data:`ARCHITECTURE_RULES`: ``lm_weight`` off a decoder, ``prefix`` off an
        encoder-decoder...) refused, naming the checkpoint ``model`` when there is one."""
        check_architecture(ARCHITECTURE_RULES, given, architecture, task, names, model)

    def check_files(self, paths, names: SettingNames = KEYWORDS) -> None:
        """A ``delimiter`` (CSV only) with a data file of ``paths`` that is told a TSV file by its
        extension (``format`` unset): refused before any model loads, named as the user wrote it."""
        if self.delimiter is None or self.format is not None:
            return
        from lmlab.tasks.tables import format_of

        for path in paths:
            if isinstance(path, (str, os.PathLike)) and format_of(path) == "tsv":
                csv = names.setting("format", ["csv"])
                raise names.error("delimiter", f"applies to CSV, but {path} is a TSV file (its extension)",
                                  f"drop {names.to_set('delimiter')}, or {names.verb} {csv}")

    def check_select_metric(self, metrics, task_name: str, names: SettingNames = KEYWORDS) -> None:
        """``select_metric``, when set, must be one of ``metrics`` (the task's, None: not known)."""
        if self.select_metric is not None and metrics is not None and self.select_metric not in metrics:
            raise names.error("select_metric", f"{self.select_metric!r} is not a metric of task {task_name}",
                              f"choose one of: {', '.join(metrics)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "", names: SettingNames | None = None,
                  given=None, origin: Origin = NOWHERE) -> FinetuneConfig:
        """The config of ``data`` (field -> value), every value checked against its field's type;
        an error names ``where`` + the field (e.g. ``grid.toml: finetune.lr``). The rules between
        fields (:meth:`validate`) hold for ``given`` (default: every key of ``data``), named by
        ``names`` (default: ``where`` + the field). ``origin``: which keys ``--set`` gave (their
        values are command-line text, named ``--set finetune.KEY``)."""
        hints = typing.get_type_hints(cls, include_extras=True)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise LmlabError(f"unknown fine-tuning settings {[where + k for k in unknown]}",
                             suggest(unknown[0], hints))
        if "loggers" in data:  # the message that lists the logger names
            from lmlab.config.loggers import check_loggers

            check_loggers(data["loggers"], f"{where}loggers")
        from lmlab.config.fields import build_section  # the one typed check (strings stay strings)

        if names is None:
            names = SettingNames("key", where) if where else KEYWORDS
        return build_section(cls, dict(data), where.rstrip(".") or "finetune", origin,
                             what="fine-tuning setting").validate(data if given is None else given, names)

    def task_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in TASK_OPTION_FIELDS if getattr(self, k) is not None}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
