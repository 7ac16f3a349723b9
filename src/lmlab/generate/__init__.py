"""Text generation from decoders, encoder-decoders and the LSTM LM.

>>> from lmlab.generate import generate
>>> out = generate(model, ids, max_new_tokens=20, do_sample=True, top_p=0.9, seed=0)  # doctest: +SKIP

* :mod:`lmlab.generate.sampling` - logits processors (repetition penalty, temperature, top-k,
  top-p) and seeded sampling;
* :mod:`lmlab.generate.search` - the decoding loops (greedy, sampling, beam search) with or
  without the KV cache, stop tokens and stop sequences.
"""

from lmlab.generate.sampling import LogitsProcessor, repetition_penalty, temperature, top_k, top_p
from lmlab.generate.search import beam_search, generate, sample_or_greedy

__all__ = ["LogitsProcessor", "beam_search", "generate", "repetition_penalty", "sample_or_greedy",
           "temperature", "top_k", "top_p"]
