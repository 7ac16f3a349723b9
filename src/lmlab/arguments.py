"""The entry checks of lmlab's Python API: an argument of the wrong kind is one line.

Every public function checks its arguments here before any work, so that a wrong argument is one
:class:`~lmlab.errors.LmlabError` naming the argument, what it got and what to pass, never a
``TypeError`` or ``AttributeError`` from deep inside (nor a silent wrong answer):

* :func:`path_argument`, :func:`path_list_argument`, :func:`text_list_argument`: paths and lists
  (a bare string where a list goes is refused, not read as characters); :func:`text_stream_argument`
  for texts that may also come as a generator or an open file (checked as they are read);
* :func:`model_argument`, :func:`tokenizer_argument`: a model or a tokenizer (a path in their place
  says how to load it; a tokenizer in place of a model is named as such);
* :func:`tensor_argument`, :func:`ids_argument`: tensors of the right kind, rank and shape; token
  ids within the vocabulary;
* :func:`number_argument`: a number or flag in its range, by the same types (:mod:`lmlab.values`)
  the command line's flags and the recipes use, so ``generate(top_p=1.5)`` and ``--top-p 1.5``
  are refused by one rule. Strict: a string is not a number here (``max_new_tokens="10"``).

The checks that read a tensor's values on the host (ids within the vocabulary) run only where
:func:`eager_checks` says so: not while ``torch.compile`` traces, and not inside
:func:`trusted_inputs`, the block of a training loop whose data was checked once.

Nothing here imports torch or pydantic until a check needs them (the command line starts light).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError, a_or_an

#: how long a value's text may be in a message before it is cut
_LIMIT = 40


def _short(text: str, limit: int = _LIMIT) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(value: Any) -> str:
    """A value as a message names it, briefly: ``int 5``, ``NoneType None``, ``str 'abc'``, a
    tensor's dtype and shape, a model's or tokenizer's class (never its whole repr)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{a_or_an(dtype)} tensor of shape {tuple(value.shape)}"
    if is_model(value):
        return f"a model ({type(value).__name__})"
    if is_tokenizer(value):
        return f"a tokenizer ({type(value).__name__})"
    if isinstance(value, os.PathLike) and not isinstance(value, (str, bytes)):
        return f"the path {_short(os.fspath(value))!r}"
    if isinstance(value, (str, bytes, int, float, complex, type(None))):
        return f"{type(value).__name__} {_short(repr(value), 60)}"
    if isinstance(value, (list, tuple, dict, set)):
        text = repr(value)
        return f"{type(value).__name__} {text}" if len(text) <= _LIMIT else f"a {type(value).__name__}"
    return f"a {type(value).__name__}"  # an object's repr says little more, at length


def is_model(value: Any) -> bool:
    """Whether ``value`` is a torch module (without importing torch: one that is not loaded made no
    module)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def is_tokenizer(value: Any) -> bool:
    """Whether ``value`` has a tokenizer's face: ``encode``, ``decode`` and an int ``vocab_size``
    (not a model: an encoder-decoder has an ``encode`` too)."""
    return (callable(getattr(value, "encode", None)) and callable(getattr(value, "decode", None))
            and isinstance(getattr(value, "vocab_size", None), int) and not is_model(value)
            and not isinstance(value, type))


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes)


# --------------------------------------------------------------------------- paths and lists
def path_argument(value: object, what: str) -> Path:
    """``value`` as a Path when it is one (a str or an ``os.PathLike``), else a one-line error: the
    entry check of every public function that takes a path (``load_tokenizer(None)`` must not fail
    deep inside with a TypeError). ``what`` names the argument (``"load_tokenizer's path"``)."""
    if _is_path(value):
        text = os.fspath(value)
        if isinstance(text, str) and text and "\x00" not in text:
            return Path(text)
        raise LmlabError(f"{what} must be a path, got {value!r}", "pass a file or folder path, e.g. \"out\"")
    raise LmlabError(f"{what} must be a path (str or os.PathLike), got {describe(value)}",
                     "pass a file or folder path, e.g. \"out\"")


def text_argument(value: object, fn: str) -> str:
    """``value`` when it is a string, else the one-line error of a text function given something
    else: ``encode takes a string, got bytes``."""
    if isinstance(value, str):
        return value
    raise LmlabError(f"{fn} takes a string, got {type(value).__name__}",
                     "pass the text as str (decode bytes first)")


def text_list_argument(value: object, what: str) -> list[str]:
    """``value`` as a list of strings when it is a list or tuple of them, else a one-line error. A bare
    string is refused, not iterated as characters (``special_tokens="[CLS]"`` is not 5 tokens)."""
    if isinstance(value, str):
        raise LmlabError(f"{what} must be a list of strings, got the string {_short(value)!r}",
                         f"pass a list: [{json.dumps(_short(value), ensure_ascii=False)}]")
    if not isinstance(value, (list, tuple)):
        raise LmlabError(f"{what} must be a list of strings, got {describe(value)}",
                         'pass a list, e.g. ["..."]')
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise LmlabError(f"{what}[{i}] must be a string, got {describe(item)}",
                             'pass a list of strings, e.g. ["..."]')
    return list(value)


def text_stream_argument(value: object, what: str) -> Iterable[str]:
    """``value`` as texts: a list or tuple checked whole now (:func:`text_list_argument`), any other
    iterable (a generator, an open file) item by item as it is read, so a corpus is never held
    whole for the check; an item that is not a string is one line naming its index. A bare string
    or bytes is refused, not read as characters."""
    if isinstance(value, (list, tuple, str, bytes)) or not isinstance(value, Iterable):
        return text_list_argument(value, what)
    return _checked_texts(value, what)


def _checked_texts(items: Iterable[object], what: str) -> Iterator[str]:
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise LmlabError(f"{what}[{i}] must be a string, got {describe(item)}",
                             'pass strings, e.g. ["..."] or an open text file')
        yield item


def path_list_argument(value: object, what: str) -> list[Path]:
    """``value`` as a list of Paths when it is a list or tuple of paths; a bare path (a str or an
    ``os.PathLike``) is refused with the list to write, so ``"small.txt"`` is not read as characters."""
    if isinstance(value, (str, os.PathLike)):
        raise LmlabError(f"{what} must be a list of paths, got the single path {_short(str(value))!r}",
                         f"pass a list: [{json.dumps(_short(str(value)), ensure_ascii=False)}]")
    if not isinstance(value, (list, tuple)):
        raise LmlabError(f"{what} must be a list of paths, got {describe(value)}",
                         'pass a list, e.g. ["corpus.txt"]')
    return [path_argument(item, f"{what}[{i}]") for i, item in enumerate(value)]


# --------------------------------------------------------------------------- models, tokenizers
def model_argument(value: Any, what: str) -> Any:
    """``value`` when it is a model (a ``torch.nn.Module``), else a one-line error that says how to
    get one: a path is loaded with ``load_model``, a tokenizer is not the model."""
    if is_model(value):
        return value
    if _is_path(value):
        fix = f"load it first: model = load_model({os.fspath(value)!r}) (lmlab.loading)"
    elif is_tokenizer(value):
        fix = "pass the model here (the tokenizer is another argument, or model.tokenizer)"
    else:
        fix = "pass a model: build_model(get_preset(...)) (lmlab.models) or load_model(path) (lmlab.loading)"
    raise LmlabError(f"{what} must be a model (a torch.nn.Module), got {describe(value)}", fix)


def tokenizer_argument(value: Any, what: str, *, path: bool = False) -> Any:
    """``value`` when it is a tokenizer (or, with ``path``, a tokenizer's path, returned as a Path),
    else a one-line error: a path where only a tokenizer goes says how to load it, a model in place
    of a tokenizer is named as such."""
    if is_tokenizer(value):
        return value
    if path and _is_path(value):
        return path_argument(value, what)
    if _is_path(value):
        fix = f"load it first: load_tokenizer({os.fspath(value)!r}) (lmlab.tokenizers)"
    elif is_model(value):
        fix = "pass the model's tokenizer (model.tokenizer), not the model"
    else:
        fix = ("pass a tokenizer: train_tokenizer(...) or load_tokenizer(path) (lmlab.tokenizers)"
               + (", or its path" if path else ""))
    kind = "a tokenizer or its path" if path else "a tokenizer"
    raise LmlabError(f"{what} must be {kind}, got {describe(value)}", fix)


# --------------------------------------------------------------------------- tensors
_SHAPE_WORDS = {1: "[length]", 2: "[batch, length]", 3: "[batch, length, classes]"}


def tensor_argument(value: Any, what: str, *, dims: int | tuple[int, ...] | None = None,
                    kind: str | None = None, shape: str | None = None, lists: bool = False):
    """``value`` when it is a ``torch.Tensor`` with one of ``dims`` dimensions and of ``kind``
    (``"integer"``: ids or labels, no float or bool; ``"float"``: scores), else a one-line error.
    ``shape`` names the dimensions in the message (``"[batch, length]"``). With ``lists``, a (nested)
    list or tuple of numbers is taken as the tensor it spells (``generate`` takes ``[[1, 2, 3]]``)."""
    import torch

    if lists and isinstance(value, (list, tuple)):
        value = _as_tensor(value, what, kind)
    if not isinstance(value, torch.Tensor):
        example = "torch.tensor([tokenizer.encode(text)])" if kind == "integer" else "a torch.Tensor"
        raise LmlabError(f"{what} must be a torch tensor, got {describe(value)}", f"pass {example}")
    allowed = (dims,) if isinstance(dims, int) else dims
    if allowed is not None and value.dim() not in allowed:
        words = shape or " or ".join(_SHAPE_WORDS.get(d, f"{d}-D") for d in allowed)
        fix = (f"add a batch dimension: {'ids' if kind == 'integer' else 'x'}[None]"
               if value.dim() + 1 in allowed else f"pass a {words} tensor")
        raise LmlabError(f"{what} must be {words}, got shape {tuple(value.shape)}", fix)
    if kind == "integer" and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise LmlabError(f"{what} must hold integer ids, got {describe(value)}",
                         "pass token ids as a torch.long tensor (e.g. .long() on ids you computed)")
    if kind == "float" and not value.is_floating_point():
        raise LmlabError(f"{what} must hold float scores, got {describe(value)}",
                         "pass the model's logits (a float tensor)")
    return value


def _as_tensor(value: list | tuple, what: str, kind: str | None):
    import torch

    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise LmlabError(f"{what} must be a tensor or a list of lists of numbers, got {describe(value)}",
                         "pass token ids, e.g. torch.tensor([tokenizer.encode(text)])") from None
    return tensor.long() if kind == "integer" and not tensor.is_floating_point() else tensor


def ids_argument(value: Any, what: str, vocab_size: int | None = None, *, dims: int | tuple[int, ...] = 2,
                 ignore: int | None = None, lists: bool = False,
                 fix: str = "encode with the model's own tokenizer", item: str = "token id",
                 among: str | None = None):
    """``value`` as an integer id tensor of ``dims`` dimensions (:func:`tensor_argument`) whose ids
    all lie in ``[0, vocab_size)`` (``ignore``, e.g. the loss's ignore label, is allowed too), else a
    one-line error naming the first id outside: ``input_ids token id 1265 is out of range for the
    model's vocabulary of 270`` (``item`` and ``among`` name them otherwise: labels and classes).
    The range is read on the host only where :func:`eager_checks`."""
    ids = tensor_argument(value, what, dims=dims, kind="integer", lists=lists)
    if vocab_size is not None and eager_checks() and ids.numel():
        seen = ids if ignore is None else ids[ids != ignore]
        if seen.numel():
            lo, hi = int(seen.min()), int(seen.max())
            if lo < 0 or hi >= vocab_size:
                bad = hi if hi >= vocab_size else lo
                among = among or f"the model's vocabulary of {vocab_size}"
                raise LmlabError(f"{what} {item} {bad} is out of range for {among}", fix)
    return ids


def token_id_argument(value: Any, what: str, vocab_size: int | None = None) -> int:
    """``value`` as an int token id (a Python or NumPy integer, a 0-d integer tensor) within
    ``[0, vocab_size)``, else a one-line error."""
    import operator

    try:
        torch = sys.modules.get("torch")
        if isinstance(value, bool) or (torch is not None and getattr(value, "dtype", None) is torch.bool):
            raise TypeError
        i = operator.index(value)
    except TypeError:
        raise LmlabError(f"{what} must be a token id (a whole number), got {describe(value)}",
                         "pass an id of the model's tokenizer, e.g. tokenizer.eos_id") from None
    if i < 0 or (vocab_size is not None and i >= vocab_size):
        raise LmlabError(f"{what} {i} is out of range for the model's vocabulary of {vocab_size}"
                         if vocab_size is not None else f"{what} must be a token id of at least 0, got {i}",
                         "pass ids of the model's tokenizer")
    return i


def not_text_argument(value: Any, what: str) -> Any:
    """``value`` unless it is text (a str or bytes) where token ids go: ``decode("abc")`` is a text
    given to the function that takes ids, not ids ``'a'``, ``'b'``... out of range."""
    if isinstance(value, (str, bytes)):
        kind = "a string" if isinstance(value, str) else "bytes"
        raise LmlabError(f"{what} takes token ids, got {kind} {_short(repr(value))}",
                         "pass a list of ids, such as tokenizer.encode(text) gives")
    return value


def id_list_argument(value: Any, what: str, vocab_size: int | None = None) -> list[int]:
    """``value`` as a list of token ids (a list, tuple or 1-D tensor of them), each checked by
    :func:`token_id_argument`; a bare id is refused with the list to write, text as text."""
    not_text_argument(value, what)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.dim() == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        example = f"[{value!r}]" if isinstance(value, int) else "[2, 7]"
        raise LmlabError(f"{what} must be a list of token ids, got {describe(value)}",
                         f"pass a list, e.g. {example}")
    return [token_id_argument(t, f"{what}[{i}]", vocab_size) for i, t in enumerate(value)]


def flag_argument(value: Any, what: str) -> bool:
    """``value`` when it is True or False (not a string: ``"no"`` would be true), else a one-line error."""
    if isinstance(value, bool):
        return value
    raise LmlabError(f"{what} must be True or False, got {describe(value)}", "pass True or False")


def callable_argument(value: Any, what: str) -> Any:
    """``value`` when it can be called, else a one-line error."""
    if callable(value):
        return value
    raise LmlabError(f"{what} must be a function, got {describe(value)}",
                     "pass a function or a callable object")


# --------------------------------------------------------------------------- numbers
def number_argument(kind: Any, value: Any, what: str) -> Any:
    """``value`` validated as ``kind``, a type of :mod:`lmlab.values` (``values.TopP``,
    ``values.Count``...), the one statement of each range; strict: a string or a float is not a
    whole number, a bool is not a number. A one-line error otherwise:
    ``generate's top_p must be at most 1 (got 1.5); use a probability greater than 0 and at most 1``."""
    from lmlab import values

    return values.check(kind, value, what, strict=True)


def optional_number(kind: Any, value: Any, what: str) -> Any:
    """:func:`number_argument`, with None passed through (an argument whose default is None)."""
    return None if value is None else number_argument(kind, value, what)


# --------------------------------------------------------------------------- host-reading checks
_TRUSTED = contextvars.ContextVar("lmlab_trusted_inputs", default=False)


def eager_checks() -> bool:
    """Whether to run the input checks that read a tensor's values on the host (ids in the
    vocabulary, positions in range, "is there padding at all"): not while ``torch.compile``
    traces the model, where such a read would split the graph, and not inside
    :func:`trusted_inputs`, where each read would make the host wait for the device. The trainer
    checks its data's ids and lengths once, before the first step, so its steps lose nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():  # first: dynamo cannot trace a ContextVar
        return False
    return not _TRUSTED.get()


@contextlib.contextmanager
def trusted_inputs() -> Iterator[None]:
    """Skip the host-reading input checks of every model forward (and loss) inside the block: for a
    training loop whose data was checked once (ids in the vocabulary, windows within the positions),
    so a step on a GPU never waits on the device for them."""
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)
