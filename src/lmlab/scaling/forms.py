"""The forms of a scaling law that :mod:`lmlab.scaling.fit` fits, importable without numpy (the
command-line parser offers them as choices)."""

from __future__ import annotations

#: form -> (parameter names, the law as text)
FORMS: dict[str, tuple[tuple[str, ...], str]] = {
    "chinchilla": (("E", "A", "alpha", "B", "beta"), "L(N, D) = E + A / N^alpha + B / D^beta"),
    "n": (("E", "A", "alpha"), "L(N) = E + A / N^alpha"),
    "d": (("E", "B", "beta"), "L(D) = E + B / D^beta"),
    "c": (("E", "A", "gamma"), "L(C) = E + A / C^gamma"),
}
