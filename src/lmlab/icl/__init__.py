"""In-context learning: zero-, one- and few-shot evaluation of decoders (Brown et al. 2020, GPT-3).

>>> from lmlab.icl import PromptTemplate, evaluate_icl
>>> template = PromptTemplate("Translate English to French:")
>>> print(template.build([("sea otter", "loutre de mer")], "cheese"))
Translate English to French:
sea otter => loutre de mer
cheese =>

* :mod:`lmlab.icl.prompts` - the prompt template (task description, ``example => answer`` lines);
* :mod:`lmlab.icl.evaluate` - scoring by label likelihood or by greedy generation, and the
  evaluation loop :func:`evaluate_icl`.
"""

from lmlab.icl.evaluate import continuation_logprobs, evaluate_icl, normalize_answer
from lmlab.icl.prompts import PromptTemplate

__all__ = ["PromptTemplate", "continuation_logprobs", "evaluate_icl", "normalize_answer"]
