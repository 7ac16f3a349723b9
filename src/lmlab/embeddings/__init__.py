"""Classic word embeddings (lecture 1): word2vec skip-gram / CBOW and SVD of a PPMI matrix.

>>> from lmlab.embeddings import train_word2vec, train_svd
>>> wv = train_word2vec(text, mode="skipgram", dim=100, epochs=2)   # doctest: +SKIP
>>> wv.nearest("king", k=5)                                          # doctest: +SKIP
[('queen', 0.71), ...]

Both return :class:`WordVectors` (``nearest(word, k)`` by cosine, ``similarity(a, b)``,
``save(dir)`` / ``WordVectors.load(dir)``). They are independent of the Transformer trainer.
"""

from lmlab.embeddings.svd import train_svd
from lmlab.embeddings.vectors import WordVectors
from lmlab.embeddings.vocab import Vocabulary, words
from lmlab.embeddings.word2vec import train_word2vec

__all__ = ["Vocabulary", "WordVectors", "train_svd", "train_word2vec", "words"]
