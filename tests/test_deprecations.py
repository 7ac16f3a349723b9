"""Names the README documented keep working for one release, with a DeprecationWarning, issued
through one function (lmlab.deprecation) in one wording, which the suite turns into an error
wherever a test does not expect it."""

from __future__ import annotations

import ast
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import lmlab
from lmlab.deprecation import WORDING, deprecation_message, warn_deprecated


def test_models_load_model_still_imports_and_warns():
    with pytest.warns(DeprecationWarning, match="lmlab.loading.load_model"):
        from lmlab.models import load_model
    from lmlab.loading import load_model as new

    assert load_model is new


def test_an_unknown_name_is_still_an_attribute_error():
    import lmlab.models

    with pytest.raises(AttributeError):
        lmlab.models.no_such_name  # noqa: B018


# ----------------------------------------------- one home, one wording, errors in the suite

SRC = Path(lmlab.__file__).parent
ROOT = SRC.parents[1]
WARNING_NAMES = {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}


def warnings_outside_the_one_home() -> list[str]:
    """``file:line`` of every ``warnings.warn(...)`` call and every deprecation warning class named
    in code (docstrings and comments do not count) outside lmlab/deprecation.py."""
    found = []
    for f in sorted(SRC.rglob("*.py")):
        if f == SRC / "deprecation.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            warn_call = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                         and node.func.attr == "warn" and isinstance(node.func.value, ast.Name)
                         and node.func.value.id == "warnings")
            if warn_call or (isinstance(node, ast.Name) and node.id in WARNING_NAMES):
                found.append(f"{f.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_deprecation_warning_in_lmlab_goes_through_warn_deprecated():
    assert warnings_outside_the_one_home() == []


def test_the_suite_turns_lmlab_deprecations_and_only_those_into_errors():
    """pyproject.toml's filter matches the one wording, and no other library's wording."""
    filters = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    filters = filters["tool"]["pytest"]["ini_options"]["filterwarnings"]
    ours = [f for f in filters if f.startswith("error:") and f.endswith(":DeprecationWarning")]
    assert len(ours) == 1, filters
    pattern = re.compile(ours[0].split(":")[1], re.I)
    assert pattern.match(deprecation_message("lmlab.old_name", "use lmlab.new_name"))
    for theirs in ("`torch_dtype` is deprecated! Use `dtype` instead!",
                   "The `use_auth_token` argument is deprecated and will be removed in v5 of Transformers."):
        assert not pattern.match(theirs)


def test_a_deprecated_path_outside_pytest_warns_fails_the_test():
    with pytest.raises(DeprecationWarning, match=WORDING):
        from lmlab.interop.hf_encoder import from_hf  # noqa: F401
    with pytest.raises(DeprecationWarning, match=WORDING):
        warn_deprecated("old()", "call new()")
    with warnings.catch_warnings(record=True) as seen:  # the suite's filters, as they are
        warnings.warn("`torch_dtype` is deprecated! Use `dtype` instead!", DeprecationWarning, stacklevel=1)
        warnings.warn("peft: this will change in a future release", FutureWarning, stacklevel=1)
    assert [w.category for w in seen] == [DeprecationWarning, FutureWarning]


def test_warn_deprecated_is_silent_while_torch_compile_traces(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    warn_deprecated("old()", "call new()")  # no error under the suite's filter


def tiny(name, **over):
    from lmlab.models import build_model, get_preset

    torch.manual_seed(0)
    return build_model(get_preset(name, vocab_size=60, **over)).eval()


def deprecated_calls():
    """One call per kind of deprecated path, each written on its own line of this file."""
    from lmlab.models.attention_masks import MaskSpec  # noqa: F401

    ids = torch.randint(5, 60, (2, 6))
    docs = torch.zeros(2, 6, dtype=torch.long)
    enc, dec = tiny("bert-tiny"), tiny("gpt2-tiny")
    xlnet, txl = tiny("xlnet-tiny"), tiny("transfo-xl-tiny")
    pattern, query = torch.ones(2, 6, 6, dtype=torch.bool), torch.ones(2, 1, 6, dtype=torch.bool)
    return {
        "encoder labels": lambda: enc(ids, labels=ids),
        "encoder forward mask keyword": lambda: enc(ids, doc_ids=docs),
        "encoder heads keyword": lambda: enc(ids, heads=("mlm",)),
        "encoder encode mask keyword": lambda: enc.encode(ids, doc_ids=docs),
        "encoder forward() called directly": lambda: enc.forward(ids, labels=ids),
        "decoder labels": lambda: dec(ids, labels=ids),
        "decoder heads keyword": lambda: dec(ids, heads=("lm",)),
        "decoder forward mask keyword": lambda: dec(ids, doc_ids=docs),
        "decoder decode mask keyword": lambda: dec.decode(ids, doc_ids=docs),
        "xlnet keywords": lambda: xlnet(ids, attention_pattern=pattern, query_pattern=query,
                                        target_positions=torch.tensor([[1], [2]])),
        "transformer-xl keyword": lambda: txl(ids, attention_pattern=torch.ones(2, 6, 6, dtype=torch.bool)),
        "transformer-xl labels": lambda: txl(ids, labels=ids),
        "moved module": lambda: __import__("lmlab.interop.hf_decoder", fromlist=["from_hf"]).from_hf,
        "moved name": lambda: __import__("lmlab.models", fromlist=["load_model"]).load_model,
    }


@pytest.mark.parametrize("kind", list(deprecated_calls()))
def test_each_deprecation_warning_points_at_the_line_that_used_the_old_path(kind):
    call = deprecated_calls()[kind]
    with pytest.warns(DeprecationWarning, match=WORDING) as caught:
        call()
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, call.__code__.co_firstlineno)}
