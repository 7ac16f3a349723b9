"""Recurrent language models: the ELMo bidirectional LM and a plain LSTM LM.

RNNConfig and the elmo-tiny / lstm-tiny presets live in ``config.py``, the character CNN, the
LSTM stacks and both language models in ``model.py``.
"""

from lmlab.models.family import FamilySpec
from lmlab.models.rnn.config import PRESETS, RNNConfig
from lmlab.models.rnn.model import (  # noqa: F401
    CHAR_BOW,
    CHAR_BYTE_OFFSET,
    CHAR_EOW,
    CHAR_PAD,
    CHAR_VOCAB_SIZE,
    RNN_FAMILIES,
    CharCNN,
    ELMoBiLM,
    Highway,
    LSTMLanguageModel,
    ScalarMix,
    StackedLSTM,
    _gather_time,
    _next_token_nll,
    _ordering,
    _RNNBase,
    _scatter_time,
    build_rnn,
    encode_token_chars,
)

#: no heads to choose (each model has its own output layer), no counts from the config, no converter
SPEC = FamilySpec("rnn", RNNConfig, PRESETS, lambda config, heads=None: build_rnn(config),
                  families=("lstm", "elmo"))
