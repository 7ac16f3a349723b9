"""Word vectors with cosine nearest-neighbour queries, saved as ``vectors.npy`` + ``words.txt``."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir


class WordVectors:
    """A matrix of word vectors, one row per word of ``words``.

    >>> wv = WordVectors(["a", "b", "c"], np.eye(3))
    >>> wv.nearest("a", k=1)[0][0] in {"b", "c"}
    True
    """

    def __init__(self, words: list[str], vectors: np.ndarray):
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(words):
            raise LmlabError(
                f"{len(words)} words but vectors of shape {vectors.shape}", "give one vector row per word"
            )
        self.words = list(words)
        self.vectors = vectors
        self._index = {w: i for i, w in enumerate(self.words)}
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self._unit = vectors / np.maximum(norms, 1e-12)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def __getitem__(self, word: str) -> np.ndarray:
        return self.vectors[self._id(word)]

    def _id(self, word: str) -> int:
        if word not in self._index:
            raise LmlabError(
                f"word {word!r} is not in the vocabulary ({len(self)} words)",
                "query a word that occurs at least min_count times in the training text",
            )
        return self._index[word]

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of two words."""
        return float(self._unit[self._id(a)] @ self._unit[self._id(b)])

    def nearest(self, word: str, k: int = 10) -> list[tuple[str, float]]:
        """The ``k`` words with the highest cosine similarity to ``word`` (itself excluded)."""
        if k < 1:
            raise LmlabError(f"k must be at least 1, got {k}", "ask for e.g. k=10 neighbours")
        i = self._id(word)
        sims = self._unit @ self._unit[i]
        sims[i] = -np.inf
        top = np.argsort(-sims, kind="stable")[: min(k, len(self) - 1)]
        return [(self.words[j], float(sims[j])) for j in top]

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``vectors.npy`` and ``words.txt`` (one word per line) atomically."""
        from lmlab.arguments import path_argument

        directory = path_argument(directory, "vectors.save's directory")
        with atomic_dir(directory, marker="vectors.npy", what="word-vectors") as tmp:
            buf = io.BytesIO()
            np.save(buf, self.vectors, allow_pickle=False)
            (tmp / "vectors.npy").write_bytes(buf.getvalue())
            (tmp / "words.txt").write_text("\n".join(self.words) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> WordVectors:
        directory = Path(directory)
        vec, wordfile = directory / "vectors.npy", directory / "words.txt"
        if not vec.is_file() or not wordfile.is_file():
            raise LmlabError(
                f"{directory} does not hold vectors.npy and words.txt",
                "pass a directory written by WordVectors.save",
            )
        return cls(wordfile.read_text(encoding="utf-8").splitlines(), np.load(vec, allow_pickle=False))
