"""Names the README documented keep working for one release, with a DeprecationWarning."""

from __future__ import annotations

import pytest


def test_models_load_model_still_imports_and_warns():
    with pytest.warns(DeprecationWarning, match="lmlab.loading.load_model"):
        from lmlab.models import load_model
    from lmlab.loading import load_model as new

    assert load_model is new


def test_an_unknown_name_is_still_an_attribute_error():
    import lmlab.models

    with pytest.raises(AttributeError):
        lmlab.models.no_such_name  # noqa: B018
