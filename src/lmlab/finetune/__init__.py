"""Fine-tuning pretrained models on tasks, and evaluating the result.

>>> from lmlab.finetune import finetune, evaluate
>>> res = finetune("ck/minilm", "sst2", "glue/sst2/train.tsv", "glue/sst2/dev.tsv", "ft/",
...                epochs=1, lr=5e-5)                                    # doctest: +SKIP
>>> res.metrics                                                          # doctest: +SKIP
{'accuracy': 0.86}
>>> evaluate("ft/", "glue/sst2/dev.tsv")                                 # doctest: +SKIP

``METHODS`` maps a method name (``full``; ``lora``, ``adapter``, ``prefix``, ``prompt``, ``adamix``
from :mod:`lmlab.adapt`) to the class that adapts the model; see :mod:`lmlab.finetune.loop`.
"""

from lmlab.lazy import lazy_exports

# imported on first use: reading lmlab.finetune.config (the command-line parser does) costs no torch
__getattr__, __dir__ = lazy_exports(__name__, {
    "config": ("FinetuneConfig",),
    "loop": ("METHODS", "FinetuneResult", "FullFineTuning", "evaluate", "finetune", "load_finetuned",
             "method_class"),
})

__all__ = ["METHODS", "FinetuneConfig", "FinetuneResult", "FullFineTuning", "evaluate", "finetune",
           "load_finetuned", "method_class"]
