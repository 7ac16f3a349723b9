"""The options of the parameter-efficient methods have one home (lmlab.adapt.options): each value is
checked against its type (finite numbers, true/false, known layer names), each option is given once,
and virtual tokens must fit the model's positions, all before the model's weights are read."""

from __future__ import annotations

import pytest
import torch
from assertions import assert_one_line_error, exit_code

from lmlab.adapt import apply_method, option_defaults, resolve_options
from lmlab.adapt.lora import find_targets
from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset


@pytest.fixture()
def bare_ckpt(ckpt):
    """The tiny GPT-2 checkpoint without its weights file: a command that reads the weights fails,
    so an error about the options proves they were checked before the model loaded."""
    (ckpt / "model.safetensors").unlink()
    return ckpt


def finetune_args(ckpt, tmp_path, method, *options):
    missing = tmp_path / "no-such-train.tsv"  # never read: the option fails first
    args = ["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(missing), "--dev",
            str(missing), "--out", str(tmp_path / "o"), "--method", method, "--no-progress"]
    for option in options:
        args += ["--method-option", option]
    return args


def tiny(preset="gpt2-tiny", **kw):
    torch.manual_seed(0)
    return build_model(get_preset(preset, vocab_size=300, **kw))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_a_non_finite_number_is_refused_by_the_options_type(bare_ckpt, tmp_path, capsys, value):
    assert exit_code(finetune_args(bare_ckpt, tmp_path, "lora", f"alpha={value}")) == 2
    assert_one_line_error(capsys, "--method-option alpha must be a finite number",
                          "a finite number greater than 0")
    assert not (tmp_path / "o").exists()
    with pytest.raises(LmlabError, match="alpha must be a finite number"):
        resolve_options("lora", {"alpha": float("nan")})
    with pytest.raises(LmlabError, match="consistency must be a finite number"):
        resolve_options("adamix", {"consistency": float("inf")})


def test_every_lora_target_must_be_a_known_layer(bare_ckpt, tmp_path, capsys):
    assert exit_code(finetune_args(bare_ckpt, tmp_path, "lora", "target_modules=q_proj,nonexist")) == 2
    assert_one_line_error(capsys, "target_modules 'nonexist' names no linear layer", "valid: all-linear",
                          "q_proj")
    assert exit_code(finetune_args(bare_ckpt, tmp_path, "lora", "target_modules=q_proj,v_prj")) == 2
    assert_one_line_error(capsys, "'v_prj' names no linear layer (did you mean v_proj?")
    with pytest.raises(LmlabError, match="'nonexist' names no linear layer"):
        apply_method(tiny(), "lora", {"target_modules": ["q_proj", "nonexist"]})
    # a name lmlab's blocks have but this model lacks (GPT-2's FFN is not gated), a glob matching nothing
    with pytest.raises(LmlabError, match="'fc_gate' matches no linear layer of this model; did you mean"):
        find_targets(tiny(), ["q_proj", "fc_gate"])
    with pytest.raises(LmlabError, match="'layers.9.\\*' matches no linear layer"):
        find_targets(tiny(), ["q_proj", "layers.9.*"])
    # both q_proj; k, v, o of layer 1
    assert len(find_targets(tiny(), ["q_proj", "layers.1.attn.*"])) == 2 + 3


def test_an_option_given_twice_is_refused(bare_ckpt, tmp_path, capsys):
    assert exit_code(finetune_args(bare_ckpt, tmp_path, "lora", "rank=8", "rank=4")) == 2
    assert_one_line_error(capsys, "--method-option rank is given more than once (rank=8 and rank=4)",
                          "give each option once")


@pytest.mark.parametrize("value", ["2", "1", "0", "yes", "maybe"])
def test_a_truth_value_is_true_or_false(bare_ckpt, tmp_path, capsys, value):
    assert exit_code(finetune_args(bare_ckpt, tmp_path, "lora", f"train_head={value}")) == 2
    assert_one_line_error(capsys, "--method-option train_head must be", "use true or false")


def test_true_and_false_are_read_and_typed():
    assert resolve_options("lora", {"train_head": "false", "rank": "4"})["train_head"] is False
    assert resolve_options("prefix", {"reparameterize": "true"})["reparameterize"] is True
    assert resolve_options("adapter", {"train_norms": "null"})["train_norms"] is None
    with pytest.raises(LmlabError, match="train_head must be True or False"):
        resolve_options("lora", {"train_head": 2})


@pytest.mark.parametrize(("method", "n", "words"), [
    ("prefix", "100000", "runs 100000 real tokens, more than the model's 1024 positions; lower "
                         "num_virtual_tokens to at most 1024"),
    ("prompt", "1030", "leaves no room for the input in the model's 1024 positions; lower "
                       "num_virtual_tokens to at most 1023"),
])
def test_virtual_tokens_must_fit_the_positions_before_the_model_loads(bare_ckpt, tmp_path, capsys,
                                                                      method, n, words):
    assert exit_code(finetune_args(bare_ckpt, tmp_path, method, f"num_virtual_tokens={n}")) == 2
    err = assert_one_line_error(capsys, words)
    assert "truncate" not in err


def test_a_max_length_must_leave_room_for_the_soft_prompt(bare_ckpt, tmp_path, capsys):
    args = finetune_args(bare_ckpt, tmp_path, "prompt", "num_virtual_tokens=1010")
    assert exit_code([*args, "--max-length", "100"]) == 2
    assert_one_line_error(capsys, "--max-length 100 exceeds the 14 positions the model has after 1010 "
                                  "virtual tokens", "use --max-length 14 or less")


def test_apply_method_checks_the_positions_first():
    model = tiny(max_positions=16)
    with pytest.raises(LmlabError, match="lower num_virtual_tokens to at most 15"):
        apply_method(model, "prompt", {"num_virtual_tokens": 16})
    assert not getattr(model, "peft", None)  # refused before the model changed
    # a prefix from random vectors, numbered from the start, takes no position
    apply_method(tiny(max_positions=16), "prefix", {"num_virtual_tokens": 40, "init": "random"})


def test_every_option_of_every_method_has_a_value_type():
    from lmlab.adapt import METHODS, option_defaults
    from lmlab.adapt.options import option_types

    for method in METHODS:
        assert set(option_defaults(method)) == set(option_types(method)), method
        resolve_options(method)  # the defaults pass their own types


@pytest.mark.parametrize(("method", "options", "words"), [
    ("prefix", ("hidden=128",), "hidden=128 has no effect with reparameterize=false"),
    ("adapter", ("kind=pfeiffer", "bottleneck=4", "reduction_factor=4"),
     "reduction_factor=4 has no effect with bottleneck=4"),
    ("adamix", ("bottleneck=4", "reduction_factor=4"), "reduction_factor=4 has no effect with bottleneck=4"),
    ("prompt", ("before_cls=true",), "before_cls=true has no effect on a decoder model"),
    # given at its default value is still given (before: compared with the default, ignored)
    ("prefix", ("reparameterize=false", "hidden=512"), "hidden=512 has no effect with reparameterize=false"),
    ("adapter", ("bottleneck=8", "reduction_factor=16"),
     "reduction_factor=16 has no effect with bottleneck=8"),
])
def test_an_option_another_one_turns_off_is_refused_not_ignored(bare_ckpt, tmp_path, capsys, method, options,
                                                                  words):
    assert exit_code(finetune_args(bare_ckpt, tmp_path, method, *options)) == 2
    assert_one_line_error(capsys, words)
    assert not (tmp_path / "o").exists()


def test_the_option_rules_hold_in_python_and_leave_defaults_and_working_pairs_alone():
    with pytest.raises(LmlabError, match="set reparameterize=true, or drop hidden"):
        resolve_options("prefix", {"hidden": 64})
    with pytest.raises(LmlabError, match="on a decoder model .*; drop before_cls, or use an encoder model$"):
        apply_method(tiny(), "prompt", {"before_cls": True})
    assert resolve_options("prefix", {"hidden": 64, "reparameterize": True})["hidden"] == 64
    assert resolve_options("adapter", {"reduction_factor": 4})["reduction_factor"] == 4
    resolve_options("adapter", resolve_options("adapter", {"bottleneck": 8}))  # a saved adapter's record
    apply_method(tiny("bert-tiny"), "prompt", {"before_cls": True, "num_virtual_tokens": 2})


def test_the_options_an_adapter_records_apply_again_as_they_are():
    """A record holds every option, those nobody chose at their defaults (``hidden=512`` beside
    ``reparameterize=false``): applied again as it is, not refused as if the user had given them."""
    first = tiny()
    recorded = apply_method(first, "prefix", {"num_virtual_tokens": 2})
    assert recorded["reparameterize"] is False and recorded["hidden"] == option_defaults("prefix")["hidden"]
    assert apply_method(tiny(), "prefix", dict(first.peft["options"])) == recorded
    with pytest.raises(LmlabError, match="hidden=512 has no effect with reparameterize=false"):
        apply_method(tiny(), "prefix", {"num_virtual_tokens": 2, "hidden": 512})
