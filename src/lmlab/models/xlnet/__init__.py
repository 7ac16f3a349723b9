"""XLNet: a Transformer with two-stream self-attention for permutation language modelling.

Its config and the ``xlnet-tiny`` preset (``config.py``) and the two-stream model (``model.py``).
Sizes come from a built model (no counts from the config) and transformers' XLNet weights are
not converted.
"""

from lmlab.models.family import FamilySpec
from lmlab.models.xlnet.config import XLNetConfig, xlnet_tiny
from lmlab.models.xlnet.model import XLNetModel

SPEC = FamilySpec("xlnet", XLNetConfig, {"xlnet-tiny": xlnet_tiny}, XLNetModel, heads=("lm",))

__all__ = ["SPEC", "XLNetConfig", "XLNetModel", "xlnet_tiny"]
