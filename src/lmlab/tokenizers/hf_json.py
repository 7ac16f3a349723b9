"""The Hugging Face on-disk format of lmlab tokenizers: ``tokenizer.json`` and
``tokenizer_config.json``, written (:class:`HfJsonExport`, a mixin of
:class:`~lmlab.tokenizers.base.Tokenizer`) and read back (the ``hf_...`` helpers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmlab.arguments import path_argument
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, write_json

FORMAT_VERSION = 1


def hf_vocab_by_id(data: dict[str, Any], kind: str) -> list[str]:
    """Tokens in id order from a tokenizer.json whose model maps ``{token: id}`` (BPE, WordPiece),
    added tokens included; a one-line error when the vocabulary is missing or has gaps."""
    raw = data["model"].get("vocab")
    if not isinstance(raw, dict) or not raw:
        raise LmlabError(f"tokenizer.json {kind} model has no vocabulary", "re-save the tokenizer")
    by_id = dict(sorted((i, t) for t, i in raw.items()))
    for t in data.get("added_tokens") or []:
        by_id.setdefault(t["id"], t["content"])
    if list(by_id) != list(range(len(by_id))):
        raise LmlabError(
            "tokenizer.json vocabulary ids are not 0..N-1 without gaps",
            "re-save the tokenizer with contiguous ids",
        )
    return list(by_id.values())


def hf_special_tokens(data: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """The special tokens of a saved tokenizer: lmlab's list, else tokenizer.json's special added tokens."""
    specials = config.get("lmlab_special_tokens")
    if specials is None:
        specials = [t["content"] for t in data.get("added_tokens") or [] if t.get("special")]
    return specials


class HfJsonExport:
    """Mixin of :class:`~lmlab.tokenizers.base.Tokenizer`: the tokenizer as ``tokenizer.json`` and
    ``tokenizer_config.json`` (export, fingerprint, save)."""

    def fingerprint(self) -> str:
        """SHA-256 of what the tokenizer does (vocabulary, merges, specials, normalisation), the
        same for equal tokenizers however they were saved: a model records the one it was trained
        with, so a tokenizer swapped for another of the same size is caught."""
        import hashlib
        import json

        config = {k: v for k, v in self.tokenizer_config().items() if k != "lmlab_format_version"}
        canon = json.dumps({"hf": self.to_hf_json(), "config": config}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    def to_hf_json(self) -> dict[str, Any]:
        """The whole Hugging Face ``tokenizer.json`` document for this tokenizer."""
        parts = self._hf_parts()
        added = [
            {
                "id": self.token_to_id[t],
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t in self.special_tokens
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": parts.get("normalizer"),
            "pre_tokenizer": parts.get("pre_tokenizer"),
            "post_processor": self._hf_post_processor(),
            "decoder": parts.get("decoder"),
            "model": parts["model"],
        }

    def _hf_post_processor(self) -> dict[str, Any] | None:
        single, _ = self._template(1, None)
        if len(single) == 1:
            return None

        def piece(slot, type_id, seq):
            if slot is None:
                return {"Sequence": {"id": seq, "type_id": type_id}}
            return {"SpecialToken": {"id": slot, "type_id": type_id}}

        pair, pair_types = self._template(1, 1)
        single_t = [piece(s, 0, "A") for s in single]
        seen_a = False
        pair_t = []
        for s, ty in zip(pair, pair_types):
            seq = "A"
            if s is None:
                seq = "B" if seen_a else "A"
                seen_a = True
            pair_t.append(piece(s, ty, seq))
        used = list(dict.fromkeys(s for s in single + pair if s is not None))  # ordered: deterministic file
        return {
            "type": "TemplateProcessing",
            "single": single_t,
            "pair": pair_t,
            "special_tokens": {t: {"id": t, "ids": [self.token_to_id[t]], "tokens": [t]} for t in used},
        }

    def tokenizer_config(self) -> dict[str, Any]:
        """Contents of tokenizer_config.json (roles in the names transformers uses)."""
        cfg: dict[str, Any] = {f"{role}_token": tok for role, tok in self.roles.items()}
        cfg.update(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "lmlab_algo": self.algo,
                "lmlab_format_version": FORMAT_VERSION,
                "lmlab_special_tokens": self.special_tokens,
                "lmlab_options": self._options(),
            }
        )
        return cfg

    def _extra_files(self) -> dict[str, str]:
        """Additional text files to write on save (e.g. WordPiece's vocab.txt)."""
        return {}

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` atomically."""
        directory = path_argument(directory, "tokenizer.save's directory")
        with atomic_dir(directory, marker="tokenizer.json", what="tokenizer") as tmp:
            write_json(tmp / "tokenizer.json", self.to_hf_json(), indent=None)
            write_json(tmp / "tokenizer_config.json", self.tokenizer_config())
            for name, text in self._extra_files().items():
                (tmp / name).write_text(text, encoding="utf-8")
        return directory
