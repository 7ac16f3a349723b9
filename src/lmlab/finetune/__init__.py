"""Fine-tuning pretrained models on tasks, and evaluating the result.

>>> from lmlab.finetune import finetune, evaluate
>>> res = finetune("ck/minilm", "sst2", "glue/sst2/train.tsv", "glue/sst2/dev.tsv", "ft/",
...                epochs=1, lr=5e-5)                                    # doctest: +SKIP
>>> res.metrics                                                          # doctest: +SKIP
{'accuracy': 0.86}
>>> evaluate("ft/", "glue/sst2/dev.tsv")                                 # doctest: +SKIP

``METHODS`` maps a method name (``full``; LoRA, adapters, prefix/prompt tuning register
themselves here) to the class that adapts the model; see :mod:`lmlab.finetune.loop`.
"""

from lmlab.finetune.config import FinetuneConfig
from lmlab.finetune.loop import (
    METHODS,
    FinetuneResult,
    FullFineTuning,
    evaluate,
    finetune,
    load_finetuned,
    method_class,
)

__all__ = ["METHODS", "FinetuneConfig", "FinetuneResult", "FullFineTuning", "evaluate", "finetune",
           "load_finetuned", "method_class"]

# parameter-efficient methods (lmlab.adapt; see docs/peft.md), imported on first use
METHODS["lora"] = "lmlab.adapt.peft_io:LoRAFineTuning"
METHODS["adapter"] = "lmlab.adapt.peft_io:AdapterFineTuning"
METHODS["prefix"] = "lmlab.adapt.peft_io:PrefixFineTuning"
METHODS["prompt"] = "lmlab.adapt.peft_io:PromptFineTuning"
METHODS["adamix"] = "lmlab.adapt.peft_io:AdaMixFineTuning"
