"""lmlab: pretrain language models and adapt them."""

__version__ = "0.1.0"
