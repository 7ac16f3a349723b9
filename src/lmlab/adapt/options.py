"""The options of the parameter-efficient methods, in one place: what each may be (its value type of
:mod:`lmlab.values`, range included), how an option written on a command line is read, and what a
method's virtual tokens need of the model's positions.

Every way options arrive goes through here: ``lmlab finetune --method-option KEY=VALUE``
(:func:`parse_option_items`, then :func:`check_options`), the Python API
(``finetune(method_options={...})``, :func:`lmlab.adapt.apply_method`, the method classes of
:mod:`lmlab.adapt.peft_io`) and the options a saved adapter records (:func:`resolve_options`).

* A number is finite (``alpha=nan`` is refused, not trained into a non-finite loss), a whole
  number is whole, a truth value is ``true`` or ``false`` (``train_head=2`` is refused).
* A method's ``apply_*`` function called directly (``apply_lora(model, rank=True)``) checks its
  arguments by the same types (:func:`typed_options`), strictly, as every argument of the Python
  API (:func:`lmlab.arguments.number_argument`): a string is not a number there.
* Each name is a method's option (an unknown one names the closest), each given once.
* LoRA's ``target_modules`` names only layers an lmlab Transformer block has (or a group, or a glob).
* The virtual tokens of ``prompt`` and ``prefix`` fit the model's positions, told from its config
  before any weight is read (:func:`check_positions`).

The defaults stay in each method's ``apply_*`` signature (:func:`lmlab.adapt.resolve_options`);
:func:`option_types` gives the type of each parameter (a method parameter without one is a
programming error, caught by the tests).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from lmlab import values
from lmlab.config.rules import ForArchitectures
from lmlab.errors import LmlabError

#: the linear layers of an lmlab Transformer block, by their attribute names (attention, FFN)
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "fc_in", "fc_gate", "fc_out")
#: LoRA's named groups of target modules
TARGET_GROUPS = {
    "qv": ("q_proj", "v_proj"),
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "ffn": ("fc_in", "fc_gate", "fc_out"),
}
#: every plain target LoRA knows: a layer name, a group, or every linear layer
TARGET_NAMES = ("all-linear", *TARGET_GROUPS, *LINEAR_NAMES)


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def target_problem(pattern: str, known: typing.Iterable[str] = TARGET_NAMES) -> str | None:
    """What is wrong with one LoRA target (a plain name not among ``known``), or None. A glob
    (``layers.1*.attn.*``) is matched against the model's layers; a qualified name
    (``layers.0.attn.q_proj``) must end in a known layer name."""
    if is_glob(pattern):
        return None
    known = list(known)
    last = pattern.rsplit(".", 1)[-1]
    if pattern in known or ("." in pattern and last in known):
        return None
    from lmlab.config.overrides import suggest

    return f"names no linear layer ({suggest(last, known)})"


def _targets(patterns: list[str]) -> list[str]:
    for p in patterns:
        problem = target_problem(p)
        if problem:
            raise ValueError(f"{p!r} {problem}")
    return patterns


#: LoRA's ``target_modules``: layer names, groups, ``all-linear`` or globs, each once
LoraTargets = Annotated[list[values.Text], Field(min_length=1, description=(
    "layer names, groups or globs, e.g. q_proj,v_proj")), values.NoRepeats, AfterValidator(_targets)]
#: a truth value: true or false (never 1, 2 or "yes")
TrueFalse = Annotated[values.Flag, Field(description="true or false")]
#: LoRA's rank r (the update is d_out x r times r x d_in)
Rank = values.whole(1, 2**16, hint="a whole number from 1 to 65536, e.g. 8")
#: a number of virtual tokens (prefix, prompt); the model's positions bound it further
VirtualTokens = values.whole(1, 2**20, hint="a whole number of at least 1, e.g. 20")
#: a width of a hidden layer or a bottleneck (0: the method's default)
Width = values.whole(0, 2**20, hint="a whole number of at least 0 (0 = the default), e.g. 64")


#: the kinds of bottleneck adapter (:mod:`lmlab.adapt.adapters`)
ADAPTER_KINDS = ("houlsby", "pfeiffer")
#: how a prefix or a soft prompt starts: copies of real tokens' vectors, or random ones
INITS = ("vocab", "random")
#: how a prefix numbers the real tokens (:mod:`lmlab.adapt.prefix`)
PREFIX_POSITIONS = ("from_start", "after_prefix")


def _adapter_types() -> dict[str, Any]:
    from lmlab.models.feedforward import ACTIVATIONS

    return {"kind": values.choice(*ADAPTER_KINDS), "bottleneck": Width,
            "reduction_factor": values.whole(1, 2**20, hint="a whole number of at least 1, e.g. 16"),
            "activation": values.choice(*ACTIVATIONS), "train_norms": TrueFalse | None,
            "train_head": TrueFalse}


def option_types(method: str) -> dict[str, Any]:
    """Option name -> value type of ``method`` (one of :data:`lmlab.adapt.METHODS`)."""
    inits = values.choice(*INITS)
    return {
        "lora": lambda: {"rank": Rank, "alpha": values.Positive, "dropout": values.Fraction,
                         "target_modules": LoraTargets, "train_head": TrueFalse},
        "adapter": _adapter_types,
        "prefix": lambda: {"num_virtual_tokens": VirtualTokens, "reparameterize": TrueFalse,
                           "hidden": values.whole(1, 2**20, hint="a whole number of at least 1, e.g. 512"),
                           "init": inits, "seed": values.Seed, "train_head": TrueFalse,
                           "positions": values.choice(*PREFIX_POSITIONS)},
        "prompt": lambda: {"num_virtual_tokens": VirtualTokens, "init": inits, "seed": values.Seed,
                           "train_head": TrueFalse, "before_cls": TrueFalse},
        "adamix": lambda: {**_adapter_types(),
                           "experts": values.whole(1, 1024, hint="a whole number from 1 to 1024, e.g. 4"),
                           "consistency": values.LossWeight, "keep_experts": TrueFalse,
                           "same_init": TrueFalse},
    }[method]()


@dataclasses.dataclass(frozen=True)
class OnlyWith:
    """``option``, when given, does something only when ``other`` (given or at its default) is as
    ``works`` says; otherwise it would be silently ignored, so it is refused naming ``needs`` (what
    ``other`` must be) and ``why``. Given at its default value counts too (``hidden=512`` with
    ``reparameterize=false`` is refused), except in a ``record``: the complete options an adapter
    records hold every option, the ones nobody chose at their defaults."""

    option: str
    other: str
    works: Callable[[Any], bool]
    needs: str
    why: str

    def check(self, method: str, given: dict[str, Any], defaults: dict[str, Any], where: str,
              record: bool = False) -> None:
        if self.option not in given or (record and given[self.option] == defaults.get(self.option)):
            return
        value = given.get(self.other, defaults.get(self.other))
        if not self.works(value):
            shown = _written(value)
            raise LmlabError(f"{where} {self.option}={_written(given[self.option])} has no effect with "
                             f"{self.other}={shown} ({self.why})",
                             f"set {self.needs}, or drop {self.option}")


def check_model_rule(rule: ForArchitectures, method: str, options: dict[str, Any], architecture: str) -> None:
    """``rule``'s option, when true, refused on a model of another architecture (told from its
    config, before any weight is read): the rule kind fine-tuning's settings use too."""
    value = options.get(rule.flag)
    if value and not rule.holds(architecture):
        raise LmlabError(*rule.problem(f"{method} option {rule.flag}={_written(value)}", architecture,
                                       drop=rule.flag))


def _written(value: Any) -> str:
    """An option's value as written on a command line (``true``, ``4``)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


#: a bottleneck adapter's width: ``bottleneck``, or ``d_model // reduction_factor`` when it is 0
_REDUCTION = OnlyWith("reduction_factor", "bottleneck", lambda v: not v, "bottleneck=0",
                      "bottleneck, when given, is the width and reduction_factor is not used")

#: the rules between a method's options that need no model (each option's range is its type's):
#: an option that another one turns off is refused rather than ignored
OPTION_RULES: dict[str, tuple[OnlyWith, ...]] = {
    "prefix": (OnlyWith("hidden", "reparameterize", lambda v: v is True, "reparameterize=true",
                        "hidden is the width of the reparameterizing MLP"),),
    "adapter": (_REDUCTION,),
    "adamix": (_REDUCTION,),
}

#: the options that apply to some architectures only (checked with the model's config)
MODEL_RULES: dict[str, tuple[ForArchitectures, ...]] = {
    "prompt": (ForArchitectures("before_cls", ("encoder",),
                                "only an encoder's input starts with [CLS]"),),
}


def _unwrapped(kind: Any) -> Any:
    while typing.get_origin(kind) is Annotated:
        kind = typing.get_args(kind)[0]
    return kind


def _optional(kind: Any) -> bool:
    """Whether ``kind`` is ``X | None``."""
    return type(None) in typing.get_args(_unwrapped(kind))


def _base(kind: Any) -> Any:
    """The Python type a value type holds (``list`` for a list type; ``X`` for ``X | None``)."""
    kind = _unwrapped(kind)
    if _optional(kind):
        return _base(next(a for a in typing.get_args(kind) if a is not type(None)))
    return typing.get_origin(kind) or kind


def read_text(kind: Any, text: str) -> Any:
    """An option's value as written on a command line: a TOML literal (``8``, ``0.1``, ``true``,
    ``["q_proj"]``); a list may also be comma-separated (``q_proj,v_proj``); ``none`` or ``null``
    for an option that may be unset; any other text is the text itself (checked by its type)."""
    from lmlab.config.toml import parse_value

    base = _base(kind)
    if text.strip().lower() in ("none", "null") and _optional(kind):
        return None
    if base is str:
        return text
    parsed = parse_value(text)
    if base is list and not isinstance(parsed, list):
        return values.comma_list(text)  # a ListProblem for an empty item
    return parsed


def check_options(method: str, options: dict[str, Any], defaults: dict[str, Any],
                  where: str = "") -> dict[str, Any]:
    """The options given (``options``) of ``method``, whose options and their defaults are
    ``defaults`` (its ``apply_*`` signature's), each name known and each value checked against its
    type and converted; a string where another type belongs is read as command-line text
    (:func:`read_text`). ``where``: how an option is named in errors (default ``"METHOD option"``;
    the command line says ``--method-option``). Returns only the options given."""
    from lmlab.config.overrides import suggest

    types = option_types(method)
    untyped = sorted(set(defaults) - set(types))
    if untyped:  # a new option of a method: give it its type in option_types
        raise TypeError(f"{method} options {untyped} have no value type in lmlab.adapt.options")
    where = where or f"{method} option"
    out = {}
    for name, value in options.items():
        if name not in defaults:
            known = ", ".join(f"{k}={d!r}" for k, d in defaults.items())
            close = suggest(str(name), defaults).split(" (valid")[0]
            guess = f"{close}; " if close.startswith("did you mean") else ""
            raise LmlabError(f"{method} has no option {name!r}", f"{guess}known options (defaults): {known}")
        kind = types[name]
        if isinstance(value, str):
            try:
                value = read_text(kind, value)
            except values.ListProblem as e:
                raise LmlabError(f"{where} {name}={options[name]!r} {e}", f"give e.g. {name}=a,b") from None
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = values.check(kind, value, f"{where} {name}")
    record = set(out) >= set(defaults)  # every option: what an adapter records (model.peft["options"])
    for rule in OPTION_RULES.get(method, ()):
        rule.check(method, out, defaults, where, record)
    return out


def check_arguments(method: str, fn: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``method``'s ``apply_*`` function ``fn`` as a Python caller gave them, each
    checked against its option's type, strictly (a string is not a number, a bool not a number,
    0 not a bool; a tuple stands for a list): one line naming ``fn's name``. The checked values."""
    types = option_types(method)
    return {name: values.check(types[name], list(value) if isinstance(value, tuple) else value,
                               f"{fn}'s {name}", strict=True)
            for name, value in arguments.items()}


def typed_options(method: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The decorator of ``method``'s ``apply_*`` function: its model and every argument given are
    checked (:func:`check_arguments`) before the function runs, so ``apply_lora(model, rank=True)``
    is refused as ``apply_method(model, "lora", {"rank": True})`` is, before the model changes. The
    signature (the options' defaults, :func:`lmlab.adapt.option_defaults`) is the function's."""

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> None:
            from lmlab.arguments import model_argument

            given = signature.bind(*args, **kwargs).arguments
            model_argument(given.pop("model", None), f"{fn.__name__}'s model")
            check_arguments(method, fn.__name__, given)
            return fn(*args, **kwargs)

        return checked

    return wrap


def parse_option_items(items: list[str], flag: str = "--method-option") -> dict[str, str]:
    """``["rank=8", "alpha=16"]`` -> ``{"rank": "8", "alpha": "16"}``, the text as written (read
    by :func:`check_options`); an item without ``=`` or an option given twice is refused."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LmlabError(f"{flag} {item!r} is not KEY=VALUE", f"write e.g. {flag} rank=8")
        pairs.append((key.strip(), value.strip()))
    twice = values.repeated(pairs, key=lambda kv: kv[0])
    if twice is not None:
        given = " and ".join(f"{k}={v}" for k, v in pairs if k == twice[0])
        raise LmlabError(f"{flag} {twice[0]} is given more than once ({given})",
                         f"give each option once, e.g. {flag} {twice[0]}={twice[1]}")
    return dict(pairs)


def positions_needed(method: str, options: dict[str, Any]) -> tuple[int, int]:
    """``(taken from every input, longest run alone)``: the positions a method's virtual tokens take
    in front of each input (a soft prompt; a prefix numbered ``after_prefix``), and the longest
    sequence it runs through the model by itself (a prefix started from real tokens' keys and values,
    ``init=vocab``, runs those tokens). ``options``: resolved (:func:`resolve_options`)."""
    n = options.get("num_virtual_tokens", 0) if method in ("prompt", "prefix") else 0
    if method == "prompt":
        return n, n
    if method == "prefix":
        alone = n if options["init"] == "vocab" and not options["reparameterize"] else 0
        return (n if options["positions"] == "after_prefix" else 0), alone
    return 0, 0


def check_positions(method: str, options: dict[str, Any], config) -> int:
    """Refuse, from a model's ``config`` (before its weights are read), an option of another
    architecture (:data:`MODEL_RULES`: ``before_cls`` off an encoder) and virtual tokens that leave
    no position for the input (:func:`lmlab.models.config.position_limit`); returns the positions they
    take from every input (0 when nothing bounds the positions)."""
    from lmlab.models.config import position_limit
    from lmlab.models.registry import spec_of_config

    for rule in MODEL_RULES.get(method, ()):
        check_model_rule(rule, method, options, spec_of_config(config).name)
    taken, alone = positions_needed(method, options)
    limit = position_limit(config)
    if limit is None:
        return 0
    n = options.get("num_virtual_tokens")
    if taken >= limit:
        raise LmlabError(f"{method} option num_virtual_tokens={n} leaves no room for the input in the "
                         f"model's {limit} positions", f"lower num_virtual_tokens to at most {limit - 1}")
    if alone > limit:
        raise LmlabError(f"{method} option num_virtual_tokens={n} with init=vocab runs {n} real tokens, "
                         f"more than the model's {limit} positions",
                         f"lower num_virtual_tokens to at most {limit} (or use init=random)")
    return taken
