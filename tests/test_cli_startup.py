"""`lmlab --help` and every `lmlab COMMAND --help` answer without importing torch or numpy (lmlab
issue 27: every command took about 3 s to start because torch came first). Building the parser
reads only light modules; a command's run function imports what it needs. Each check runs in a
fresh interpreter, where nothing is imported yet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: what building the parser must not import: torch alone takes seconds, numpy a tenth of one
HEAVY = ("torch", "numpy")

REPORT = f"""
import json, sys
print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], **globals().get("found", {{}})}}))
"""

EVERY_HELP = """
import argparse, contextlib, io, sys
import lmlab.cli

def paths(parser, prefix=()):
    yield list(prefix)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from paths(sub, (*prefix, name))

found = {"commands": [], "exit_codes": {}, "first_heavy": None}
for path in paths(lmlab.cli.build_parser()):
    command = " ".join(["lmlab", *path])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            lmlab.cli.main([*path, "--help"])
        except SystemExit as e:
            found["exit_codes"][command] = e.code
    found["commands"].append(command)
    assert "usage: " + command in out.getvalue(), command
    if found["first_heavy"] is None and any(m in sys.modules for m in HEAVY):
        found["first_heavy"] = command
"""


def run_fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; what it imported of :data:`HEAVY` (and what it found)."""
    p = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{code}\n{REPORT}"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_building_the_parser_imports_neither_torch_nor_numpy():
    found = run_fresh("import lmlab.cli\nlmlab.cli.build_parser()")
    assert found["heavy"] == []


def test_every_help_answers_without_torch_or_numpy():
    found = run_fresh(EVERY_HELP)
    assert found["first_heavy"] is None and found["heavy"] == [], found["first_heavy"]
    assert {"lmlab", "lmlab finetune", "lmlab tokenizer train", "lmlab data prepare", "lmlab scale fit",
            "lmlab align"} <= set(found["commands"])
    assert set(found["exit_codes"].values()) == {0}


def test_the_light_names_are_the_registries_own():
    """What the parser offers comes from the registries' own light homes: one list, not a copy."""
    from lmlab import data, finetune, scaling
    from lmlab.data import prepare
    from lmlab.finetune import loop
    from lmlab.scaling import fit

    assert finetune.METHODS is loop.METHODS and prepare.DOC_SEPARATORS is data.DOC_SEPARATORS
    assert fit.FORMS is scaling.FORMS


def test_lazy_names_still_import_from_their_package():
    found = run_fresh("import lmlab.cli\nlmlab.cli.build_parser()\n"  # light submodules imported first
                      "from lmlab.finetune import finetune, FinetuneConfig, METHODS\n"
                      "from lmlab.align import align, dpo_loss\n"
                      "from lmlab.data import TokenShards\n"
                      "from lmlab.scaling import plan, fit_runs\n"
                      "from lmlab.tokenizers import Tokenizer\n"
                      "found = {'plan': plan.__module__, 'lora': METHODS['lora'],\n"
                      "         'tokenizer': Tokenizer.__name__, 'finetune': callable(finetune)}")
    assert found["plan"] == "lmlab.scaling.plan"  # the function, though a submodule has its name
    assert found["lora"] == "lmlab.adapt.peft_io:LoRAFineTuning"  # the adapt methods are registered
    assert found["tokenizer"] == "Tokenizer" and found["finetune"] is True
    assert "torch" in found["heavy"]  # asking for them imports what they need


def test_no_package_name_is_shadowed_by_a_submodule():
    """Importing a submodule sets the package's attribute of that name: a lazy name sharing it
    would then be the module."""
    import importlib
    import pkgutil
    import types

    for name in ("lmlab.align", "lmlab.data", "lmlab.finetune", "lmlab.scaling", "lmlab.tokenizers"):
        package = importlib.import_module(name)
        for sub in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{name}.{sub.name}")
        shadowed = [n for n in package.__all__ if isinstance(getattr(package, n), types.ModuleType)]
        assert shadowed == [], name


def test_a_name_no_package_offers_is_an_attribute_error():
    import lmlab.finetune

    with pytest.raises(AttributeError, match="no_such_name"):
        lmlab.finetune.no_such_name  # noqa: B018
