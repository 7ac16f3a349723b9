"""One validator for every value lmlab reads: flags, recipe TOML, ``--set``, grids and the files a
command loads back (checkpoints, resume states, indexes, metrics).

Each kind of value is a type here, written once as a pydantic ``Annotated`` type with its range
(finite numbers, integer bounds, non-empty text, a fixed set of choices) and, as its description,
the words that tell a user what to write instead. :func:`check` validates a value (or a whole dict
against a schema: a pydantic model or dataclass) and turns a failure into one line,
``error: <where> <what is wrong> (got <value>); <fix>`` (``<where>: <key>: ...`` for a key of a
dict), raised as :class:`LmlabError` before any
work is done. :func:`flag` makes an argparse ``type=`` from the same types, so a flag and the file
key it mirrors accept exactly the same values (``--seed`` and ``train.seed`` are both :data:`Seed`).

A number is never a boolean (``seed = true`` is an error, not 1), and no number is NaN or infinite.
"""

from __future__ import annotations

import codecs
import difflib
import math
import re
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    StrictBool,
    TypeAdapter,
    ValidationError,
)
from pydantic.fields import FieldInfo

from lmlab.errors import LmlabError
from lmlab.text_input import surrogate_problem

T = TypeVar("T")

#: the largest seed torch, NumPy and Python all accept
SEED_MAX = 2**63 - 1
#: the largest count of steps, examples or tokens (far beyond any run; 2**63 is refused)
COUNT_MAX = 2**40
#: the largest number of rows held at once (batch sizes, beams, samples)
BATCH_MAX = 2**20
#: the most micro-batches one optimizer step accumulates (the global batch is batch_size x this)
GRAD_ACCUM_MAX = 2**16


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError("must be a finite number")
    return x


def _not_boolean(x: Any) -> Any:
    if isinstance(x, bool):
        raise ValueError("must be a number, not true or false")
    return x


def _finite_input(x: Any) -> Any:
    """Refuse NaN and infinities (also as text: "nan", "1e999") before any range is compared."""
    x = _not_boolean(x)
    try:
        number = float(x) if isinstance(x, str) else x
    except ValueError:
        return x  # not a number at all: pydantic says so
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError("must be a finite number")
    return x


def _no_surrogates(s: Any) -> Any:
    """Before pydantic's own str check, which refuses a lone surrogate as 'raw data': say which byte."""
    problem = surrogate_problem(s) if isinstance(s, str) else None
    if problem:
        raise ValueError(f"is not valid UTF-8 ({problem})")
    return s


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, hint: str) -> Any:
    """A finite float type in ``[low, high]`` (an end left open with ``low_open``/``high_open``),
    never a boolean; ``hint`` says what to write (it ends every error about such a value)."""
    bounds: dict[str, float] = {}
    if low is not None:
        bounds["gt" if low_open else "ge"] = low
    if high is not None:
        bounds["lt" if high_open else "le"] = high
    return Annotated[float, BeforeValidator(_finite_input), Field(allow_inf_nan=False, description=hint,
                                                                  **bounds), AfterValidator(_finite)]


#: what is wrong with a whole number written as a float (``1.0``, ``1e3``): the one wording
NOT_WHOLE = "must be a whole number, written without a decimal point or exponent"
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+(_\d+)*\s*")


def whole_number(x: Any) -> Any:
    """The one rule of a whole number, for every entry point (a flag's text, a ``--set`` value, a
    TOML value, a Python argument): an int written as one (``1``, ``1000``, on a command line the
    text ``"1000"``). A float is not one even when it has no fraction (``1.0``, ``1e3``, TOML's
    ``max_steps = 1e3``, Python's ``300.0``), nor is text spelling one (``"1.0"``, ``"1e3"``), nor
    a truth value: ``ValueError`` (:data:`NOT_WHOLE`). Anything else is passed on for its type to
    judge (text that is no number at all: "must be a whole number")."""
    x = _not_boolean(x)
    if isinstance(x, float):
        raise ValueError(NOT_WHOLE)
    if isinstance(x, str) and not _INTEGER_TEXT.fullmatch(x):
        try:
            float(x.replace("_", ""))
        except ValueError:
            return x  # not a number at all: pydantic says so
        raise ValueError(NOT_WHOLE)
    return x


#: any whole number (:func:`whole_number`), for a field with no range of its own
Integer = Annotated[int, BeforeValidator(whole_number), Field(description="a whole number, e.g. 100")]


def whole(low: int, high: int, *, hint: str) -> Any:
    """An int type in ``[low, high]`` by the one rule of :func:`whole_number`: never a boolean,
    nor a float (``1.0``, ``1e3``), whatever the entry point."""
    return Annotated[int, BeforeValidator(whole_number), Field(ge=low, le=high, description=hint)]


def choice(*options: str, hint: str | None = None) -> Any:
    """A text type that must be one of ``options`` (the error suggests the closest one)."""

    def one_of(value: str) -> str:
        if value not in options:
            close = difflib.get_close_matches(value, options, n=1, cutoff=0.5)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"must be one of {', '.join(options)}{guess}")
        return value

    return Annotated[str, AfterValidator(one_of), Field(description=hint or f"one of {', '.join(options)}")]


# ---------------------------------------------------------------------------------------------
# the value types: each says its range once
Finite = number(hint="a finite number, e.g. 1.0")
Positive = number(0, low_open=True, hint="a finite number greater than 0")
NonNegative = number(0, hint="a finite number of at least 0 (0 = off)")
Probability = number(0, 1, hint="a number from 0 to 1")
Fraction = number(0, 1, high_open=True, hint="a fraction from 0 up to (not including) 1, e.g. 0.1")
#: a probability that must not be 0 (a masking rate, a noise density: at 0 nothing is ever predicted)
PositiveProbability = number(0, 1, low_open=True,
                             hint="a probability greater than 0 and at most 1, e.g. 0.15")
#: a share of a whole greater than 0 (ELECTRA's generator width, XLNet's predicted part)
PositiveShare = number(0, 1, low_open=True, hint="a share greater than 0 and at most 1, e.g. 0.25")
#: a learning rate: AdamW diverges long before 10
LearningRate = number(0, 10, low_open=True, hint="a learning rate greater than 0 and at most 10, e.g. 3e-4")
#: nucleus sampling's probability mass (0 would keep no token)
TopP = number(0, 1, low_open=True, hint="a probability greater than 0 and at most 1, e.g. 0.9")
#: the floor a learning-rate schedule decays to (0 allowed)
MinLearningRate = number(0, 10, hint="a learning rate from 0 to 10, e.g. 1e-4")
#: the largest gradient norm kept (0 = no clipping)
GradClip = number(0, 1e6, hint="a gradient norm from 0 (no clipping) to 1e6, e.g. 1.0")
#: the Huber loss's threshold between squared and absolute residuals (0 = plain least squares)
HuberDelta = number(0, 1e6, hint="a threshold from 0 (plain least squares) to 1e6, e.g. 1e-3")
#: a device's peak TFLOP/s (0 = looked up)
Tflops = number(0, 1e9, hint="TFLOP/s from 0 (look it up) to 1e9, e.g. 989")
#: the mean of a length distribution, in tokens (T5's span length, BART's Poisson lambda)
MeanLength = number(0, 1e6, low_open=True, hint="a mean length greater than 0 and at most 1e6, e.g. 3")
#: the mean length of a span of whole tokens (T5's mean_span_length: a span holds at least one)
MeanSpanLength = number(1, 1e6, hint="a mean span length from 1 to 1e6 tokens, e.g. 3")
#: a share strictly between 0 and 1 (the unigram learner's shrinking factor: 0 keeps nothing, 1 never ends)
OpenFraction = number(0, 1, low_open=True, high_open=True, hint="a number between 0 and 1 (both excluded), "
                      "e.g. 0.75")
#: a softmax temperature (distillation, RLHF sampling)
Temperature = number(0, 1000, low_open=True, hint="a temperature greater than 0 and at most 1000, e.g. 1.0")
#: a sampling temperature of `lmlab generate`: 0 is greedy decoding
SamplingTemperature = number(0, 1000, hint="0 (greedy) or a temperature up to 1000, e.g. 0.7")
#: a multiplicative penalty (CTRL's repetition penalty: 1 = off)
Penalty = number(0, 1000, low_open=True, hint="a penalty greater than 0 and at most 1000 (1.0 = off), "
                 "e.g. 1.2")
#: the exponent of beam search's length normalisation, log p / length**A
LengthPenalty = number(-100, 100, hint="an exponent from -100 to 100 (1.0 = average log-probability)")
WeightDecay = number(0, 10, hint="a weight decay from 0 (off) to 10, e.g. 0.01")
#: the weight of one loss term beside another (an auxiliary LM loss, DPO's beta...)
LossWeight = number(0, 1e6, hint="a weight from 0 to 1e6, e.g. 0.5")
#: a positive weight (DPO's beta: 0 would divide by zero in IPO)
PositiveWeight = number(0, 1e6, low_open=True, hint="a weight greater than 0 and at most 1e6, e.g. 0.1")
#: conservative DPO's assumed share of flipped preferences (at 0.5 the pairs say nothing)
LabelSmoothing = number(0, 0.5, high_open=True, hint="a share from 0 up to (not including) 0.5, e.g. 0.1")


def _small_positive(x: float) -> float:
    if not 0 < x < 1:
        raise ValueError("must be a small positive number")
    return x


#: a term added to avoid a division by zero (AdamW's eps): in (0, 1)
Epsilon = Annotated[number(hint="a small positive number, e.g. 1e-8"), AfterValidator(_small_positive)]
#: a training budget in FLOPs
Flops = number(0, 1e40, low_open=True, hint="a number of FLOPs greater than 0, e.g. 1e18")
#: a positive ratio (tokens per parameter, width per layer)
Ratio = number(0, 1e9, low_open=True, hint="a ratio greater than 0, e.g. 20")

Seed = whole(0, SEED_MAX, hint="a whole number from 0 to 2**63 - 1, e.g. 0")
Count = whole(1, COUNT_MAX, hint="a whole number of at least 1")  # how many of something: at least one
#: a vocabulary: at least two tokens (one token predicts nothing)
VocabSize = whole(2, COUNT_MAX, hint="a whole number of tokens, at least 2, e.g. 8000")
Size = whole(0, COUNT_MAX, hint="a whole number of at least 0")  # 0 allowed (often "all" or "off")
#: the fewest tokens a shard file may hold (``data prepare --shard-tokens``): 2**20 tokens (2 MiB at
#: uint16) keeps a corpus to one file per million tokens; the reader memory-maps every shard, and a
#: process gets about 65,000 maps, so even 60 billion tokens stay readable (at 1 token a shard, 60 KB
#: of text made 48,891 files)
SHARD_TOKENS_MIN = 2**20
ShardTokens = whole(SHARD_TOKENS_MIN, COUNT_MAX, hint=f"a number of tokens per shard of at least "
                    f"{SHARD_TOKENS_MIN:,} (2**20), e.g. 100000000")
#: rows held in memory at once: batch sizes, beams, samples per prompt
BatchSize = whole(1, BATCH_MAX, hint=f"a whole number from 1 to {BATCH_MAX}")
#: micro-batches per optimizer step (pretraining's train.grad_accum, align's --grad-accum)
GradAccum = whole(1, GRAD_ACCUM_MAX, hint=f"a whole number from 1 to {GRAD_ACCUM_MAX:,} (the global batch "
                  "is the batch size times this), e.g. 8")
class ListProblem(ValueError):
    """What is wrong with a list as written (an empty item), in words an error shows as they are."""


def repeated(items: Iterable[Any], key: Callable[[Any], Any] | None = None) -> Any:
    """The first item of ``items`` that repeats an earlier one (compared by ``key(item)``), or None."""
    seen = set()
    for item in items:
        k = item if key is None else key(item)
        if k in seen:
            return item
        seen.add(k)
    return None


def _no_repeats(items: Any) -> Any:
    twice = repeated(items)
    if twice is not None:
        raise ValueError(f"lists {twice!r} twice (each may appear once)")
    return items


#: a list type whose items may not repeat (pydantic checks it after the items): layer numbers, the
#: learning rates of a sweep, the seeds of a grid, where a repeat would only do the same work twice
NoRepeats = AfterValidator(_no_repeats)


def check_distinct(items: Iterable[Any], where: str, fix: str,
                   key: Callable[[Any], Any] | None = None) -> None:
    """The one refusal of a list whose items repeat where a repeat means nothing (a run counted
    twice, a file read twice, the same task scored twice): one line naming ``where`` and the item;
    ``key`` says when two items are the same (e.g. their resolved path)."""
    twice = repeated(items, key)
    if twice is not None:
        raise LmlabError(f"{str(twice)!r} is given twice in {where}", fix)


def comma_list(text: str, convert: Callable[[str], T] = str) -> list[T]:  # type: ignore[assignment]
    """The one reader of a comma-separated list as written on a command line (``"0, 2,4"``): each
    item stripped and converted; an empty item (a doubled, leading or trailing comma: ``1,2,,3``,
    ``"0, "``) is a :class:`ListProblem`, never dropped in silence; an unreadable one a ValueError."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise ListProblem("is empty")
    if not all(parts):
        raise ListProblem("has an empty item (a doubled, leading or trailing comma)")
    return [convert(part) for part in parts]


#: the seeds of a series of runs (a grid's): one or more, each once
Seeds = Annotated[list[Seed], Field(min_length=1, description="a list of seeds, e.g. [0, 1, 2]"), NoRepeats]
Threads = whole(0, 4096, hint="a number of threads from 0 (automatic) to 4096")
Workers = whole(1, 1024, hint="a number of processes from 1 to 1024")
Text = Annotated[str, BeforeValidator(_no_surrogates), Field(min_length=1, description="non-empty text")]
Flag = StrictBool
#: layer numbers (``--student-layers 0,2,4``), at least one, each once
Layers = Annotated[list[Size], Field(min_length=1, description="comma-separated layer numbers, each once, "
                                                                "e.g. 0,2,4"), NoRepeats]

#: token ids as given on a command line (``--ids 12,7 301``)
TokenIds = Annotated[list[Size], Field(min_length=1, description="token ids (whole numbers of at least 0), "
                                                                "e.g. 12 7 301")]


def comma_ints(text: str) -> list[int]:
    """``"0, 2,4"`` -> ``[0, 2, 4]`` (:func:`comma_list`: a ValueError for anything else)."""
    return comma_list(text, int)


#: where torch runs: auto, cpu, cuda, cuda:N or mps (``meta`` and the like hold no numbers)
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d{1,4})?|mps")


def _device(value: str) -> str:
    if not DEVICE_PATTERN.fullmatch(value):
        raise ValueError("is not a device lmlab runs on")
    return value


Device = Annotated[str, AfterValidator(_device), Field(description="auto, cpu, cuda, cuda:N or mps")]

#: names a CSV delimiter may be given by
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}


def delimiter_character(text: str) -> str:
    """The character a valid ``Delimiter`` text stands for (``tab`` -> a tab)."""
    return DELIMITER_NAMES.get(text, text)


def _delimiter(value: str) -> str:
    d = delimiter_character(value)
    if len(d) != 1:
        raise ValueError("must be one character or one of tab, comma, semicolon, pipe")
    if d == '"':
        raise ValueError("is CSV's quote character, which cannot also separate the fields")
    if d in "\r\n":
        raise ValueError("is a line break, which ends a CSV row and cannot separate its fields")
    return value  # kept as written ("tab"): it is saved with the model and keys cached runs


Delimiter = Annotated[str, AfterValidator(_delimiter),
                      Field(description="one character other than '\"' or a line break, or tab, comma, "
                                        "semicolon, pipe, e.g. ';'")]


def _encoding(value: str) -> str:
    try:
        codecs.lookup(value)
    except LookupError:
        raise ValueError("is not a text encoding Python knows") from None
    return value


Encoding = Annotated[str, AfterValidator(_encoding), Field(description="a Python codec name such as utf-8 "
                                                                        "or latin-1")]


def _path(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a file or folder path (text)")
    if not value:
        raise ValueError("must not be empty")
    if "\x00" in value:
        raise ValueError("holds a NUL character, which no file name may hold")
    return value


#: a file or folder name as given (non-empty: "" would mean the current folder). Not pydantic's str,
#: which refuses a name that is not UTF-8 (bytes Python keeps as lone surrogates): a valid file name
PathText = Annotated[str, PlainValidator(_path), Field(description="a file or folder path")]

_ADAPTERS: dict[Any, TypeAdapter] = {}


def _adapter(kind: Any) -> TypeAdapter:
    try:
        return _ADAPTERS[kind]
    except (KeyError, TypeError):
        adapter = TypeAdapter(kind)
        try:
            _ADAPTERS[kind] = adapter
        except TypeError:  # an unhashable type expression: do not cache
            pass
        return adapter


#: pydantic's words for a problem -> ours
_WORDS = {
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "int_parsing_size": "must be a whole number of at most 2**63 - 1",
    "string_too_short": "must not be empty",
    "missing": "is missing",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "bool_type": "must be True or False",
}


def _problem(error: ValidationError, shown: Any = None) -> tuple[str, str]:
    """``(where inside the value, what is wrong with the value it found)`` for the first problem;
    ``shown``: the value to name instead (a flag's text as typed), else the value pydantic saw."""
    first = error.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    msg = _WORDS.get(first.get("type", ""), first.get("msg", "is not valid"))
    if first.get("type") == "too_short":
        n = first.get("ctx", {}).get("min_length", 1)
        msg = "must not be empty" if n == 1 else f"must have at least {n} items"
    elif first.get("type") == "too_long":
        n = first.get("ctx", {}).get("max_length")
        msg = f"must have at most {n} items"
    msg = msg.removeprefix("Value error, ").replace("Input should be", "must be")
    msg = msg.replace("String should have", "must have").replace("List should have", "must have")
    msg = msg.replace("greater than or equal to", "at least").replace("less than or equal to", "at most")
    if first.get("type") not in ("missing",):
        shown = repr(first.get("input") if shown is None else shown)
        msg += f" (got {shown[:57] + '...' if len(shown) > 60 else shown})"
    return loc, msg


def _with_bound(error: ValidationError, words: str) -> str:
    """``words`` (what a kind accepts), with the upper bound the value broke when they leave it
    out (``a whole number of at least 1``, broken by 10**30: ``... and at most 1099511627776``)."""
    first = error.errors(include_url=False)[0]
    kind, ctx = first.get("type"), first.get("ctx", {})
    if not words or kind not in ("less_than_equal", "less_than"):
        return words
    bound = ctx.get("le" if kind == "less_than_equal" else "lt")
    shown = f"{bound:g}" if isinstance(bound, float) else str(bound)
    if any(said in words for said in ("at most", "up to", "below", "less than", f"to {shown}")) \
            or _names_number(words, bound):
        return words  # the words name the bound already ("a number from 0 to 1", "from 1 to 1e6")
    return f"{words}, and {'at most' if kind == 'less_than_equal' else 'less than'} {shown}"


def _names_number(words: str, number) -> bool:
    """Whether ``words`` write ``number`` (``1e6``, ``1,000,000``, ``1000000``)."""
    for text in re.findall(r"\d[\d,_]*(?:\.\d+)?(?:e[+-]?\d+)?", words):
        try:
            if float(text.replace(",", "").replace("_", "")) == float(number):
                return True
        except (ValueError, OverflowError):
            continue
    return False


def describe(error: ValidationError) -> str:
    """The first problem of a pydantic error as plain words: ``field.sub: message (got X)``."""
    loc, msg = _problem(error)
    return f"{loc}: {msg}" if loc else msg


def hint(kind: Any) -> str:
    """What a valid ``kind`` is, in words (its description; ``true or false`` for a truth value,
    the choices of a ``Literal``), or ""."""
    if kind is bool or kind == Flag:
        return "true or false"
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(kind))
    for part in typing.get_args(kind):
        if isinstance(part, FieldInfo) and part.description:
            return part.description
    for part in typing.get_args(kind):
        if not isinstance(part, FieldInfo):
            found = hint(part)
            if found:
                return found
    return ""


def check(kind: Any, value: Any, where: str, fix: str = "", *, strict: bool = False) -> Any:
    """``value`` validated (and converted) as ``kind``, or a one-line :class:`LmlabError` naming
    ``where`` (a flag, ``FILE key``), the value and ``fix`` (by default: what ``kind`` accepts).
    ``strict``: no conversion between kinds (the text "10" is not a number; 10.0 is no whole number
    anywhere, :func:`whole_number`),
    for an argument of the Python API (:func:`lmlab.arguments.number_argument`)."""
    try:
        return _adapter(kind).validate_python(value, strict=strict or None)
    except ValidationError as e:
        words = _with_bound(e, hint(kind))
        fix = fix or (f"use {words}" if words else "see --help for the valid values")
        loc, msg = _problem(e)
        raise LmlabError(f"{where}: {loc}: {msg}" if loc else f"{where} {msg}", fix) from None


def flag(kind: Any, parse: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """An argparse ``type=`` that validates the text as ``kind`` (after ``parse``, when given); a
    failure becomes argparse's one-line usage error, ``error: argument --x: <what is wrong>
    (got <text>); use <what kind accepts>``. The callable's ``kind`` is ``kind``."""
    import argparse

    words = hint(kind)
    use = f"; use {words}" if words else ""

    def convert(text: str):
        try:
            raw = text if parse is None else parse(text)
        except ListProblem as e:
            raise argparse.ArgumentTypeError(f"{e} (got {text!r}){use}") from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"cannot be read (got {text!r}){use}") from None
        try:
            return _adapter(kind).validate_python(raw)
        except ValidationError as e:
            loc, msg = _problem(e, shown=text)
            bounded = f"; use {_with_bound(e, words)}" if words else ""
            raise argparse.ArgumentTypeError(f"{loc}: {msg}{bounded}" if loc else f"{msg}{bounded}") from None

    convert.__name__ = getattr(parse, "__name__", None) or "value"
    convert.kind = kind  # type: ignore[attr-defined]
    return convert


def either(kind: Any, *words: str) -> Any:
    """``kind``, or one of the texts ``words`` as they are (a learning rate, or ``"auto"``)."""

    def validate(value: Any) -> Any:
        if isinstance(value, str) and value in words:
            return value
        return _adapter(kind).validate_python(value)

    words_too = f"{hint(kind)}, or {' or '.join(words)}"
    return Annotated[Any, BeforeValidator(validate), Field(description=words_too)]


#: a learning rate, or "auto": fine-tuning sweeps the rates of lr_sweep and keeps the best on dev
LearningRateOrAuto = either(LearningRate, "auto")
#: the rates an lr = "auto" sweep tries, at least one, each once (a repeat would train the same run twice)
LearningRates = Annotated[tuple[LearningRate, ...],
                          Field(min_length=1, description="learning rates greater than 0, each once, e.g. "
                                                          "[1e-4, 3e-4]"), NoRepeats]


# ready-made flag types for the common cases
seed_flag = flag(Seed)
count_flag = flag(Count)
size_flag = flag(Size)
batch_flag = flag(BatchSize)
threads_flag = flag(Threads)
workers_flag = flag(Workers)
finite_flag = flag(Finite)
positive_flag = flag(Positive)
nonnegative_flag = flag(NonNegative)
grad_clip_flag = flag(GradClip)
probability_flag = flag(Probability)
fraction_flag = flag(Fraction)
lr_flag = flag(LearningRate)
temperature_flag = flag(Temperature)
weight_decay_flag = flag(WeightDecay)
loss_weight_flag = flag(LossWeight)
text_flag = flag(Text)
path_flag = flag(PathText)
device_flag = flag(Device)
encoding_flag = flag(Encoding)
delimiter_flag = flag(Delimiter)
