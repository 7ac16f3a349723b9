"""A number or flag given to a public Python function directly is checked by the one typed rule
(:mod:`lmlab.values`, strictly: :func:`lmlab.arguments.number_argument`): a bool, NaN, a string
or an out-of-range number is one line naming the argument, before any work, the same wording
whichever function takes it. These functions used to carry their own ``isinstance(x, int)`` /
``x <= 0`` checks, which took ``rank=True`` as 1, ``"3"`` as a number, or said something else."""

from __future__ import annotations

import math

import pytest

from lmlab.errors import LmlabError

NAN = math.nan
#: every kind of wrong value the brief names; each case below lists those wrong for its argument
NUMBER = (True, NAN, "3", -1, 0)  # a positive number
SIZE = (True, NAN, "3", -1)       # a number of at least 0
FLAG = ("3", 0, 1)                # True or False, nothing else

# (function, argument, wrong values)
ADAPT = [
    ("apply_lora", "rank", NUMBER), ("apply_lora", "alpha", NUMBER), ("apply_lora", "dropout", SIZE + (1,)),
    ("apply_lora", "train_head", FLAG),
    ("apply_prefix", "num_virtual_tokens", NUMBER), ("apply_prefix", "hidden", (True, "3", 0)),
    ("apply_prefix", "seed", (True, "3", -1)), ("apply_prefix", "reparameterize", FLAG),
    ("apply_prompt", "num_virtual_tokens", NUMBER), ("apply_prompt", "seed", (True, "3", -1)),
    ("apply_adapters", "reduction_factor", NUMBER), ("apply_adapters", "bottleneck", SIZE),
    ("apply_adapters", "train_norms", FLAG),
    ("apply_adamix", "experts", NUMBER), ("apply_adamix", "consistency", SIZE),
    ("apply_adamix", "same_init", FLAG),
]
OBJECTIVES = [
    ("electra", "generator_size", NUMBER), ("electra", "generator_layers", (True, "3", 0)),
    ("electra", "disc_weight", NUMBER), ("electra", "temperature", NUMBER),
    ("spanbert", "geometric_p", NUMBER), ("spanbert", "max_span_words", NUMBER), ("spanbert", "sbo", FLAG),
    ("t5", "noise_density", NUMBER), ("t5", "mean_span_length", NUMBER), ("t5", "add_eos", FLAG),
    ("transfo-xl", "segment_len", NUMBER), ("transfo-xl", "carry_memory", FLAG),
    ("mlm", "seed", (True, "3", -1)), ("mlm", "whole_word", FLAG),
]


def _cases(table):
    return [pytest.param(fn, arg, bad, id=f"{fn}({arg}={bad!r})")
            for fn, arg, wrong in table for bad in wrong]


def _one_line(e: pytest.ExceptionInfo, starts: str) -> None:
    message = str(e.value)
    assert message.startswith(f"{starts} must be"), message
    assert "\n" not in message and e.value.fix.startswith("use "), message


@pytest.fixture(scope="module")
def tok():
    from lmlab.tokenizers import train_tokenizer

    specials = ["[PAD]", "[MASK]", "[CLS]", "[SEP]", "[UNK]", *(f"<extra_id_{i}>" for i in range(10))]
    return train_tokenizer("bytelevel", ["to be or not to be, that is the question " * 20], vocab_size=300,
                           special_tokens=specials)


@pytest.mark.parametrize(("fn", "arg", "bad"), _cases(ADAPT))
def test_a_method_function_called_directly_checks_its_options_by_their_types(fn, arg, bad):
    """apply_lora(model, rank=True) used to add rank-1 adapters; the apply_* functions now check
    their arguments by the options' types (@typed_options), as apply_method does."""
    import importlib

    from lmlab.adapt import METHODS
    from lmlab.models import build_model, get_preset

    method = next(m for m, where in METHODS.items() if where.endswith(f":{fn}"))
    module, name = METHODS[method].split(":")
    model = build_model(get_preset("gpt2-tiny", vocab_size=300))
    before = {n for n, _ in model.named_modules()}
    with pytest.raises(LmlabError) as e:
        getattr(importlib.import_module(module), name)(model, **{arg: bad})
    _one_line(e, f"{fn}'s {arg}")
    assert {n for n, _ in model.named_modules()} == before  # refused before the model changed
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(("name", "arg", "bad"), _cases(OBJECTIVES))
def test_an_objective_made_in_python_checks_its_parameters_strictly(tok, name, arg, bad):
    """SegmentRecurrentLM(tok, segment_len="3") used to be read as 3 and carry_memory=0 as False: the
    parameter types of __init__ (Objective.checked) are strict for Python callers."""
    from lmlab.objectives import get_objective

    with pytest.raises(LmlabError) as e:
        get_objective(name)(tok, **{arg: bad})
    _one_line(e, f"objective.{arg}")


def test_valid_values_still_apply(tok):
    """Ints for floats, tuples for lists and apply_method's resolved options are taken as before."""
    from lmlab.adapt import apply_method
    from lmlab.adapt.lora import LoRALinear, apply_lora
    from lmlab.models import build_model, get_preset
    from lmlab.objectives import get_objective

    model = build_model(get_preset("gpt2-tiny", vocab_size=300))
    apply_lora(model, rank=2, alpha=4, dropout=0, target_modules=("q_proj",))
    assert any(isinstance(m, LoRALinear) for m in model.modules())
    other = build_model(get_preset("gpt2-tiny", vocab_size=300))
    assert apply_method(other, "prefix", {"num_virtual_tokens": "4", "reparameterize": True,
                                    "hidden": 8})["num_virtual_tokens"] == 4
    assert get_objective("t5")(tok, noise_density=0.5, mean_span_length=2, num_sentinels=10, add_eos=False)
    assert get_objective("transfo-xl")(tok, segment_len=8, carry_memory=False).segment_len == 8


def _others(tok=None):
    """(name, call taking the wrong value, the words the message starts with, wrong values)."""
    from lmlab.models import get_preset
    from lmlab.scaling import compute_optimal
    from lmlab.scaling.fit import fit_runs
    from lmlab.scaling.plan import plan
    from lmlab.tasks import make_task

    def icl(k):
        from lmlab.icl import evaluate_icl
        from lmlab.models import build_model

        return evaluate_icl(build_model(get_preset("gpt2-tiny", vocab_size=300)), tok, [("a", "b")], [], k)

    return [
        ("get_preset(d_model)", lambda v: get_preset("gpt2-tiny", d_model=v), "d_model", NUMBER),
        ("get_preset(dropout)", lambda v: get_preset("gpt2-tiny", dropout=v), "dropout", SIZE + (1,)),
        ("get_preset(n_decoder_layers)", lambda v: get_preset("t5-tiny", n_decoder_layers=v),
         "n_decoder_layers", NUMBER),
        ("get_preset(mem_len)", lambda v: get_preset("transfo-xl-tiny", mem_len=v), "mem_len", SIZE),
        ("get_preset(n_highway)", lambda v: get_preset("elmo-tiny", n_highway=v), "n_highway", SIZE),
        ("make_task(max_length)", lambda v: make_task("sst2", max_length=v), "task option max_length",
         NUMBER),
        ("make_task(lm_weight)", lambda v: make_task("sst2", lm_weight=v), "task option lm_weight", SIZE),
        ("make_task(doc_stride)", lambda v: make_task("squad", doc_stride=v), "task option doc_stride", SIZE),
        ("evaluate_icl(k)", icl, "evaluate_icl's k", SIZE),
        ("compute_optimal(flops)", lambda v: compute_optimal(v), "compute_optimal's flops", NUMBER),
        ("plan(tokens_per_param)", lambda v: plan(1e18, tokens_per_param=v), "plan's tokens_per_param",
         NUMBER),
        ("plan(aspect_ratio)", lambda v: plan(1e18, aspect_ratio=v), "plan's aspect_ratio", NUMBER),
        ("fit_runs(bootstrap)", lambda v: fit_runs([], bootstrap=v), "fit_runs' bootstrap", SIZE),
    ]


def _other_cases():
    return [pytest.param(i, bad, id=f"{name}={bad!r}")
            for i, (name, _, _, wrong) in enumerate(_others()) for bad in wrong]


@pytest.mark.parametrize(("i", "bad"), _other_cases())
def test_model_settings_task_options_icl_and_scaling_numbers_share_the_rule(tok, i, bad):
    """dropout="0.1" in get_preset used to be a TypeError, vocab_size's and make_task's checks took
    other words; the model configs now check every field by their file schema's types, TaskOptions
    by its fields' types, and evaluate_icl, compute_optimal, plan and fit_runs by number_argument."""
    _, call, starts, _ = _others(tok)[i]
    with pytest.raises(LmlabError) as e:
        call(bad)
    _one_line(e, starts)


@pytest.mark.parametrize("bad", (True, NAN, "3", -1, 0))
def test_tokenizer_numbers_share_the_rule(tok, bad):
    from lmlab.tokenizers import train_tokenizer

    with pytest.raises(LmlabError) as e:
        tok.encode_many(["a b"], workers=bad)
    _one_line(e, "encode_many's workers")
    unigram = train_tokenizer("unigram", ["to be or not to be"] * 5, vocab_size=40)
    with pytest.raises(LmlabError) as e:
        unigram.sample("to be", alpha=bad)
    _one_line(e, "sample's alpha")
