"""The model-family registry: one folder and one spec per family, looked up by name."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
import warnings

import pytest

from lmlab.errors import LmlabError
from lmlab.models import FAMILIES, PRESETS, build_model, config_from_dict, family_spec, get_preset
from lmlab.models.family import FamilySpec


@pytest.mark.parametrize("architecture", list(FAMILIES))
def test_each_family_folder_names_its_config_presets_and_builder(architecture):
    spec = family_spec(architecture)
    assert isinstance(spec, FamilySpec) and spec.name == architecture
    for name, make in spec.presets.items():
        config = make()
        assert type(config) is spec.config_class and config.family in spec.families, name
        assert config_from_dict(config.to_dict()) == config
    tiny = next(name for name in spec.presets if name.endswith("-tiny"))
    assert build_model(get_preset(tiny)).architecture == architecture


def test_the_registry_lists_every_preset_and_family_of_before():
    from lmlab.models.config import FAMILY_CONFIGS

    assert set(FAMILY_CONFIGS) == {"bert", "roberta", "albert", "electra", "gpt2", "llama", "t5", "bart",
                                   "lstm", "elmo", "xlnet", "transfo-xl"}
    sizes = [f"{family}-{size}" for family in ("bert", "roberta", "albert", "electra", "gpt2", "llama", "t5",
                                                "bart") for size in ("tiny", "small", "base")]
    assert list(PRESETS) == [*sizes, "elmo-tiny", "lstm-tiny", "xlnet-tiny", "transfo-xl-tiny"]


def test_the_old_config_paths_name_the_classes_of_the_family_folders():
    import lmlab.models as models
    from lmlab.models import config
    from lmlab.models.encoder.config import EncoderConfig
    from lmlab.models.xlnet.config import XLNetConfig

    assert config.EncoderConfig is models.EncoderConfig is EncoderConfig
    assert config.XLNetConfig is models.XLNetConfig is XLNetConfig
    assert config.get_preset("gpt2-tiny") == get_preset("gpt2-tiny")
    assert models.CONFIG_ARCHITECTURE[EncoderConfig] == "encoder"
    assert models.model_class("seq2seq") is family_spec("seq2seq").build


def test_an_unknown_architecture_or_family_is_one_line():
    with pytest.raises(LmlabError, match="unknown model architecture 'gptj'"):
        family_spec("gptj")
    with pytest.raises(LmlabError, match="unknown model family 'gptj'"):
        config_from_dict({"family": "gptj"})
    with pytest.raises(LmlabError, match="cannot build a model from a dict"):
        build_model({"family": "bert"})


def test_a_family_registered_under_another_name_than_its_spec_is_refused(monkeypatch):
    monkeypatch.setitem(FAMILIES, "gptj", "lmlab.models.decoder")
    with pytest.raises(LmlabError, match="SPEC is named 'decoder', registered as 'gptj'"):
        family_spec("gptj")


def test_importing_the_models_loads_no_family_folder():
    """The folders are imported by name when first asked for (``lmlab --help`` stays fast)."""
    folders = ("encoder", "decoder", "seq2seq", "rnn", "xlnet", "transformer_xl")
    code = ("import sys, lmlab.models, lmlab.models.config, lmlab.models.flops; "
            f"print(sorted(m for m in sys.modules if m.split('.')[:3] in "
            f"[['lmlab', 'models', f] for f in {folders}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_encoder_counts_the_nsp_head_as_it_builds_it():
    """The lab counted BERT's mlm + nsp pretraining by dropping "nsp" (count_parameters refused it)."""
    from lmlab.models.flops import count_parameters

    config = get_preset("bert-tiny", vocab_size=500)
    for heads in (("mlm", "nsp"), ("nsp",), ("mlm",), ()):
        built = build_model(config, heads=heads)
        assert count_parameters(config, heads=heads).total == built.num_parameters(), heads


def test_families_without_counts_say_so():
    from lmlab.models.flops import count_parameters, forward_flops

    with pytest.raises(LmlabError, match="does not count the parameters of a xlnet model"):
        count_parameters(get_preset("xlnet-tiny"))
    with pytest.raises(LmlabError, match="does not count the forward FLOPs of a rnn model"):
        forward_flops(get_preset("lstm-tiny"), 16)


def test_the_planner_sizes_the_families_whose_spec_says_so():
    from lmlab.models.registry import family_specs
    from lmlab.scaling.plan import ARCHS

    plannable = {f for spec in family_specs().values() if spec.plan for f in spec.plan.families}
    assert plannable == set(ARCHS)


def test_the_hugging_face_converters_come_from_the_family_specs():
    from lmlab.interop import CONVERTERS, converter

    encoders = ("bert", "roberta", "albert", "electra")
    assert CONVERTERS == {**dict.fromkeys(encoders, "lmlab.models.encoder.hf"),
                          **dict.fromkeys(("gpt2", "llama"), "lmlab.models.decoder.hf"),
                          **dict.fromkeys(("t5", "bart"), "lmlab.models.seq2seq.hf")}
    assert converter("llama").MODEL_TYPES == ("gpt2", "llama")
    with pytest.raises(LmlabError, match="'xlnet' is not supported"):
        converter("xlnet")


def test_the_old_converter_paths_work_for_one_release_with_a_warning():
    from lmlab.models.encoder import hf

    for old in ("hf_encoder", "hf_decoder", "hf_seq2seq"):
        module = importlib.import_module(f"lmlab.interop.{old}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            to_hf = module.to_hf
        assert [w.category for w in caught] == [DeprecationWarning], old
        assert to_hf.__module__ == f"lmlab.models.{old[3:]}.hf"
    assert hf.config_to_hf.__module__ == "lmlab.models.encoder.hf"


def test_a_config_of_a_subclass_is_not_taken_for_its_parents_family():
    """Exact classes: a family built on DecoderConfig is its own family, not a decoder."""
    from lmlab.models.decoder.config import DecoderConfig

    @dataclasses.dataclass
    class Other(DecoderConfig):
        pass

    with pytest.raises(LmlabError, match="cannot build a model from a Other"):
        build_model(Other(family="gpt2", vocab_size=100, d_model=32, n_layers=1, n_heads=2, d_ff=64))
