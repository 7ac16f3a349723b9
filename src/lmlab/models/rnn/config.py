"""The recurrent family's config and presets: the ELMo bidirectional LM and the LSTM LM."""

from __future__ import annotations

from dataclasses import dataclass, field

from lmlab.errors import LmlabError
from lmlab.models.config import TransformerConfig, check_fields, check_special_ids


@dataclass
class RNNConfig:
    """Recurrent language models: ELMo bi-LM and the LSTM LM. Owned by ``models/rnn.py`` (helper C).

    * ``d_model``: token representation width and LSTM output width (ELMo: 512).
    * ``d_hidden``: LSTM cells per layer (ELMo: 4096); when larger than ``d_model`` each layer's
      output is projected back to ``d_model`` (LSTMP).
    * ``residual``: add each LSTM layer's input to its output (layers above the first; ELMo).
    * ``tie_embeddings``: LSTM LM only, output matrix = input embedding matrix.
    * ``max_chars``, ``char_dim``, ``char_filters`` ([width, n_filters] pairs), ``n_highway``: ELMo's
      character CNN (ELMo: 50, 16, 2048 filters of widths 1-7, 2 highway layers).
    """

    family: str = "lstm"           # lstm | elmo
    vocab_size: int = 10000
    d_model: int = 256
    d_hidden: int = 512
    n_layers: int = 2
    dropout: float = 0.1
    residual: bool = False
    tie_embeddings: bool = True
    max_chars: int = 50
    char_dim: int = 16
    char_filters: list[list[int]] = field(
        default_factory=lambda: [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]])
    n_highway: int = 2
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def validate(self) -> RNNConfig:
        if self.family not in ("lstm", "elmo"):
            raise LmlabError(f"unknown recurrent family {self.family!r}", "use 'lstm' or 'elmo'")
        check_fields(self)  # each field's kind and range: its file schema's (lmlab.models.config)
        if self.d_hidden < self.d_model:
            raise LmlabError(f"d_hidden {self.d_hidden} is smaller than d_model {self.d_model}",
                             "set d_hidden >= d_model (larger cells are projected down to d_model)")
        if self.max_chars < 3:
            raise LmlabError(f"max_chars {self.max_chars} leaves no room for a character",
                             "use max_chars >= 3")
        ok = isinstance(self.char_filters, (list, tuple)) and len(self.char_filters) > 0 and all(
            isinstance(f, (list, tuple)) and len(f) == 2 and all(isinstance(v, int) and v > 0 for v in f)
            for f in self.char_filters)
        if not ok:
            raise LmlabError(f"char_filters must be a non-empty list of [width, n_filters], "
                             f"got {self.char_filters!r}", "e.g. [[1, 32], [2, 32], [3, 64]]")
        self.char_filters = [list(f) for f in self.char_filters]
        if max(w for w, _ in self.char_filters) > self.max_chars:
            raise LmlabError(f"a char filter is wider than max_chars {self.max_chars}",
                             "narrow it or raise max_chars")
        check_special_ids(self)
        return self

    to_dict = TransformerConfig.to_dict
    from_dict = TransformerConfig.__dict__["from_dict"]
    replace = TransformerConfig.replace


def _elmo_tiny() -> RNNConfig:
    return RNNConfig(family="elmo", vocab_size=1000, d_model=32, d_hidden=64, n_layers=2, residual=True,
                     max_chars=16, char_dim=8, char_filters=[[1, 16], [2, 16], [3, 32], [4, 32]], n_highway=2)


def _lstm_tiny() -> RNNConfig:
    return RNNConfig(family="lstm", vocab_size=1000, d_model=32, d_hidden=64, n_layers=2, tie_embeddings=True)

#: preset name -> a fresh config
PRESETS = {"elmo-tiny": _elmo_tiny, "lstm-tiny": _lstm_tiny}
