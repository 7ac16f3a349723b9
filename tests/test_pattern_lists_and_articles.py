"""A bare string given for a list of patterns is refused, not read as one
pattern per character (lmlab.arguments.text_list_argument), and an architecture in a message takes
its article (lmlab.errors.a_or_an: "an encoder")."""

from __future__ import annotations

import pytest

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset


@pytest.fixture(scope="module")
def encoder():
    return build_model(get_preset("bert-tiny", vocab_size=300))


@pytest.mark.parametrize("keyword", ["include", "exclude"])
def test_quantize_and_prune_refuse_a_bare_pattern_string(encoder, keyword):
    from lmlab.adapt.prune import prune_model
    from lmlab.adapt.quantize import quantize_model

    with pytest.raises(LmlabError) as e:
        quantize_model(encoder, **{keyword: "heads.*"})
    assert f"quantize_model's {keyword} must be a list of strings, got the string 'heads.*'" in str(e.value)
    assert '["heads.*"]' in e.value.fix
    with pytest.raises(LmlabError) as e:
        prune_model(encoder, 0.5, **{keyword: "heads.*"})
    assert f"prune_model's {keyword} must be a list of strings" in str(e.value)
    assert not getattr(encoder, "quantization", None)


def test_architecture_words_take_their_article(encoder):
    from lmlab.adapt.peft_io import check_base
    from lmlab.align.logprobs import check_generative
    from lmlab.tasks.instruct import Instruct

    with pytest.raises(LmlabError, match="writes text, not an encoder;"):
        check_generative(encoder)
    with pytest.raises(LmlabError, match="encoder-decoder, not an encoder;"):
        Instruct(architecture="encoder")
    with pytest.raises(LmlabError, match="is for a decoder model, not an encoder;"):
        check_base(encoder, {"architecture": "decoder"}, "ft/adapter")
