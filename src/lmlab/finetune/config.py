"""Fine-tuning hyper-parameters: the ``[finetune]`` section, whose home is
:mod:`lmlab.config.finetune` (this module keeps the names it always offered)."""

from lmlab.config.finetune import (
    LR_SWEEP,
    TASK_OPTION_FIELDS,
    Column,
    DataFormat,
    DecoderStyle,
    FinetuneConfig,
    OnBadLine,
    Precision,
    SelectFraction,
    SelectOn,
)

__all__ = ["LR_SWEEP", "TASK_OPTION_FIELDS", "Column", "DataFormat", "DecoderStyle", "FinetuneConfig",
           "OnBadLine", "Precision", "SelectFraction", "SelectOn"]
