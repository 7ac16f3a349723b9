"""The words every one-line error shares: the article a noun takes (one helper, not a test of the
first letter at each message)."""

import pytest

from lmlab.errors import a_or_an


@pytest.mark.parametrize(("words", "said"), [
    ("encoder", "an encoder"), ("decoder", "a decoder"), ("encoder-decoder", "an encoder-decoder"),
    ("--out", "an --out"), ("--checkpoint", "a --checkpoint"), ("float32", "a float32"),
    ("int8", "an int8"), ("EncoderConfig", "an EncoderConfig"), ("", "a "),
])
def test_the_article_follows_the_first_letter(words, said):
    assert a_or_an(words) == said
