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
import typing
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab import values
from lmlab.config.overrides import suggest
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

    def validate(self) -> FinetuneConfig:
        """What relates fields to each other (each field's range is its type, checked by from_dict)."""
        from lmlab.config.loggers import check_loggers

        check_loggers(self.loggers, "loggers")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "") -> FinetuneConfig:
        """The config of ``data`` (field -> value), every value checked against its field's type;
        an error names ``where`` + the field (e.g. ``grid.toml: finetune.lr``)."""
        hints = typing.get_type_hints(cls, include_extras=True)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise LmlabError(f"unknown fine-tuning settings {[where + k for k in unknown]}",
                             suggest(unknown[0], hints))
        if "loggers" in data:  # the message that lists the logger names
            from lmlab.config.loggers import check_loggers

            check_loggers(data["loggers"], f"{where}loggers")
        from lmlab.config.fields import build_section  # the one typed check (strings stay strings)

        return build_section(cls, dict(data), where.rstrip(".") or "finetune", what="fine-tuning setting"
                             ).validate()

    def task_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in TASK_OPTION_FIELDS if getattr(self, k) is not None}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
