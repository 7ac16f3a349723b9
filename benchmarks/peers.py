"""The reference tokenizers lmlab is measured against, configured like lmlab's algorithms.

Each lmlab algorithm is paired with the peer trainers that learn the same kind of vocabulary
from the same pre-tokenization, so a time ratio compares learners, not set-ups:

* ``bpe`` (character BPE, whitespace words, end-of-word ``_``): HF ``BPE`` with
  ``WhitespaceSplit`` and ``end_of_word_suffix="_"``; sentencepiece ``bpe``;
* ``bytelevel`` (GPT-2): HF ``BPE`` with the ``ByteLevel`` pre-tokenizer and its 256-symbol
  initial alphabet (what ``ByteLevelBPETokenizer`` does);
* ``wordpiece`` (BERT, cased like lmlab's default): HF ``WordPiece`` with
  ``BertNormalizer(lowercase=False)`` + ``BertPreTokenizer``;
* ``unigram`` (SentencePiece style): sentencepiece ``unigram`` and HF ``Unigram`` with ``Metaspace``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

#: Peer trainers per lmlab algorithm; the first is the one the issue's target is measured against.
PEERS: dict[str, list[str]] = {
    "bpe": ["hf-bpe", "spm-bpe"],
    "bytelevel": ["hf-bytelevel"],
    "wordpiece": ["hf-wordpiece"],
    "unigram": ["spm-unigram", "hf-unigram"],
}

#: The issue's training-time targets: lmlab time / reference time must not exceed this.
# issue 14: time against the first peer of each algorithm; peak memory where the issue sets a bound
TRAIN_TARGETS: dict[str, float] = {"bpe": 1.5, "bytelevel": 1.5, "wordpiece": 1.5, "unigram": 2.0}
TRAIN_MEMORY_TARGETS: dict[str, float] = {"wordpiece": 2.0, "unigram": 1.2}

PEER_NAMES = {
    "hf-bpe": "HF BPE", "hf-bytelevel": "HF ByteLevelBPE", "hf-wordpiece": "HF WordPiece",
    "hf-unigram": "HF Unigram", "spm-bpe": "sentencepiece bpe", "spm-unigram": "sentencepiece unigram",
}


def hf_tokenizer_and_trainer(kind: str, vocab_size: int, specials: Sequence[str]):
    """An untrained HF ``Tokenizer`` and its trainer for peer ``kind`` (``hf-...``)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = list(specials)
    unk = "[UNK]" if "[UNK]" in specials else None
    if kind == "hf-bpe":
        tok = Tokenizer(models.BPE(unk_token=unk, end_of_word_suffix="_"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      end_of_word_suffix="_", show_progress=False)
    elif kind == "hf-bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "hf-wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk or "[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)  # lmlab's default: cased
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                            show_progress=False)
    elif kind == "hf-unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token=unk,
                                          show_progress=False)
    else:
        raise ValueError(f"unknown Hugging Face peer {kind!r}")
    return tok, trainer


def train_hf(kind: str, lines: Sequence[str], vocab_size: int, specials: Sequence[str]):
    """Train HF peer ``kind`` on ``lines``; returns the trained ``tokenizers.Tokenizer``."""
    tok, trainer = hf_tokenizer_and_trainer(kind, vocab_size, specials)
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return tok


def train_spm(kind: str, lines: Sequence[str], vocab_size: int, threads: int) -> bytes:
    """Train sentencepiece (``spm-bpe`` / ``spm-unigram``) on ``lines``; returns the model proto.

    ``hard_vocab_limit=False`` lets a tiny corpus end below ``vocab_size`` instead of failing;
    ``character_coverage=1.0`` keeps every character, as the lmlab learners do.
    """
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type=kind.removeprefix("spm-"), num_threads=threads, hard_vocab_limit=False,
        character_coverage=1.0, max_sentence_length=1 << 16, minloglevel=2,
    )
    return model.getvalue()
