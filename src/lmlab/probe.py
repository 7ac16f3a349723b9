"""Probing what pretraining taught a model (lectures 002-004).

* :func:`fill_mask` - the model's top-k guesses for a blank written ``[MASK]`` in a sentence
  ("Stanford University is located in [MASK], California."). An encoder reads the whole sentence
  and scores the blank with its MLM head; a decoder sees only the text before the blank and
  predicts the next token; a T5-style encoder-decoder gets the blank as its first sentinel
  (``<extra_id_0>``) and predicts the first token its decoder writes for it.
* :func:`word_similarity` - contextual word similarity: the cosine between the hidden states of the
  same word in different contexts ("A bat flew out of the cave" / "He hit the ball with a bat"), at
  every layer, beside the static baseline. A static embedding (word2vec, SVD, or the model's own
  input embedding table) gives one vector per word whatever the context, so its cosine is exactly
  1; a contextual model gives different vectors, and the lower the cosine, the more the context
  changed the word's representation.

A word's vector at a layer is the mean of the hidden states of the tokens that cover it (found
through the tokenizer's character offsets, so ``record`` split into ``rec`` + ``ord`` counts once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lmlab.errors import LmlabError, a_or_an
from lmlab.models.attention_masks import MaskSpec
from lmlab.models.facts import facts_of
from lmlab.models.heads import require_head

MASK_TEXT = "[MASK]"


@dataclass
class Guess:
    token: str          # the vocabulary entry
    text: str           # how it reads when decoded
    probability: float


def _tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise LmlabError("the checkpoint has no tokenizer",
                         "save the model with its tokenizer (model.save(d, tokenizer=tok))")
    return tok


def _blank(text: str) -> tuple[str, str]:
    """``(before, after)`` the single ``[MASK]`` of ``text``, or a one-line error."""
    n = text.count(MASK_TEXT)
    if n != 1:
        raise LmlabError(f"the text must hold exactly one {MASK_TEXT}, it holds {n}",
                         f'write the blank as {MASK_TEXT}, e.g. "Paris is the capital of {MASK_TEXT}."')
    before, after = text.split(MASK_TEXT)
    return before, after


def _word_blank(tok, text: str) -> str:
    """Where the tokenizer writes a word's leading space into the word's token (byte-level BPE's
    ``Ġword``, SentencePiece's ``▁word``), the space before the blank belongs to the blank: a
    masked word was one such token in pretraining, never a lone space followed by a mask."""
    pieces = tok.tokenize(" zq")
    if pieces and pieces[0][:1] in ("Ġ", "▁") and f" {MASK_TEXT}" in text:
        return text.replace(f" {MASK_TEXT}", MASK_TEXT)
    return text


def _top(logits: torch.Tensor, tok, k: int, banned: set[int]) -> list[Guess]:
    logits = logits.float().clone()
    if banned:
        logits[list(banned)] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    allowed = probs.numel() - len({i for i in banned if 0 <= i < probs.numel()})
    values, ids = probs.topk(min(k, allowed))  # a special token is never guessed, however many asked
    tokens = tok.convert_ids_to_tokens(ids.tolist())
    return [Guess(t, tok.decode([i]), float(p)) for t, i, p in zip(tokens, ids.tolist(), values.tolist())]


def check_can_fill_mask(model) -> None:
    """The models :func:`fill_mask` reads: an encoder with its MLM head, a decoder with its
    language-model head first, an encoder-decoder. ``model``: a model, or a directory's facts
    (:func:`lmlab.loading.model_facts`), so that ``lmlab probe fill-mask`` refuses a fine-tuned
    classifier before loading its weights."""
    facts = facts_of(model)
    if facts.architecture == "encoder":
        require_head(facts, "mlm", "fill-mask", "probe a checkpoint pretrained with the mlm objective "
                     "(not a fine-tuned or bare encoder)", first=False)
    elif facts.architecture in ("decoder", "seq2seq"):
        require_head(facts, "lm", "fill-mask",
                     "probe the pretrained checkpoint (its language-model head), not a fine-tuned classifier")
    else:
        kind = facts.architecture or type(model).__name__
        raise LmlabError(f"fill-mask does not know {a_or_an(kind)} model",
                         "probe an encoder, a decoder or an encoder-decoder checkpoint")


@torch.no_grad()
def fill_mask(model, text: str, top_k: int = 5) -> list[Guess]:
    """The ``top_k`` most likely tokens for the ``[MASK]`` in ``text`` (see the module docstring)."""
    if top_k < 1:
        raise LmlabError(f"top_k must be at least 1, got {top_k}", "ask for e.g. --top-k 5")
    check_can_fill_mask(model)
    tok = _tokenizer(model)
    before, _ = _blank(text)
    arch = getattr(model, "architecture", "")
    model.eval()
    specials = set(tok.special_ids)
    if arch == "encoder":
        mask_id = tok.role_id("mask")
        if mask_id is None:
            raise LmlabError("the tokenizer has no [MASK] token",
                             "use a tokenizer trained with the default specials")
        mask_token = tok.convert_ids_to_tokens([mask_id])[0]
        enc = tok.encode_plus(_word_blank(tok, text).replace(MASK_TEXT, mask_token))
        ids = torch.tensor([enc.ids])
        where = [i for i, t in enumerate(enc.ids) if t == mask_id]
        if len(where) != 1:
            raise LmlabError("the [MASK] did not survive tokenisation", "write it as a separate word: [MASK]")
        hidden = model.backbone(ids, mask=MaskSpec(padding=torch.ones_like(ids)))
        return _top(model.heads["mlm"](hidden[0, where[0]]), tok, top_k, specials)
    if arch == "decoder":
        prompt = before.rstrip()
        if not prompt:
            raise LmlabError("a decoder reads only the text before the blank, and there is none",
                             "put the blank after some words, e.g. \"The capital of France is [MASK].\"")
        ids = tok.encode(prompt)
        bos = tok.role_id("bos")
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        ids_t = torch.tensor([ids])
        out = model(input_ids=ids_t)
        return _top(out.logits[0, -1], tok, top_k, specials)
    if arch == "seq2seq":
        sentinel = "<extra_id_0>"
        sid = tok.token_to_id.get(sentinel)
        if sid is None:
            raise LmlabError("the tokenizer has no <extra_id_0> sentinel for the blank",
                             "probe a T5 checkpoint pretrained with span corruption")
        src = tok.encode(_word_blank(tok, text).replace(MASK_TEXT, sentinel))
        eos = tok.role_id("eos")
        if eos is not None:
            src = [*src, eos]
        start = model.config.decoder_start_token_id
        dec = torch.tensor([[start, sid]])
        src_t = torch.tensor([src])
        out = model(input_ids=src_t, attention_mask=torch.ones_like(src_t), decoder_input_ids=dec)
        return _top(out.logits[0, -1], tok, top_k, specials)
    raise AssertionError(f"check_can_fill_mask let a {arch} model through")  # pragma: no cover


# ----------------------------------------------------------------------------- similarity
@dataclass
class Occurrence:
    text: int                # which text
    start: int               # character offsets of the word in it
    end: int
    vectors: list[torch.Tensor]   # one per layer (0 = embeddings)

    def label(self, texts: list[str]) -> str:
        around = texts[self.text][max(0, self.start - 12):self.end + 12]
        return f"text {self.text + 1} @{self.start}: ...{around}..."


def _hidden_states(model, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    arch = getattr(model, "architecture", "")
    mask = torch.ones_like(ids)
    if arch == "encoder":
        return model.encode(ids, mask, output_hidden_states=True)[1]
    if arch == "decoder":
        return model(input_ids=ids, output_hidden_states=True).hidden_states
    if arch == "seq2seq":
        return model.encoder(ids, mask, output_hidden_states=True)[1]
    raise LmlabError(f"similarity does not know a {arch or type(model).__name__} model",
                     "probe an encoder, a decoder or an encoder-decoder checkpoint")


@torch.no_grad()
def word_occurrences(model, word: str, texts: list[str]) -> list[Occurrence]:
    """Every whole-word, case-insensitive occurrence of ``word`` in ``texts``, with its per-layer
    vector (mean over the tokens that overlap it)."""
    if not word.strip():
        raise LmlabError("the word is empty", "pass --word WORD")
    tok = _tokenizer(model)
    model.eval()
    pattern = re.compile(rf"(?<!\w){re.escape(word.strip())}(?!\w)", re.IGNORECASE)
    found: list[Occurrence] = []
    for i, text in enumerate(texts):
        spans = [(m.start(), m.end()) for m in pattern.finditer(text)]
        if not spans:
            continue
        enc = tok.encode_plus(text)
        states = _hidden_states(model, torch.tensor([enc.ids]))
        for s, e in spans:
            cover = [j for j, (a, b) in enumerate(enc.offsets)
                     if b > a and a < e and b > s and not enc.special_tokens_mask[j]]
            if not cover:
                continue
            found.append(Occurrence(i, s, e, [h[0, cover].float().mean(0) for h in states]))
    return found


def word_similarity(model, word: str, texts: list[str]) -> dict:
    """Cosines between every pair of occurrences of ``word`` across ``texts``, per layer, beside the
    static baseline (1.0 by construction: one vector per word). Needs at least two occurrences."""
    occ = word_occurrences(model, word, texts)
    if len(occ) < 2:
        raise LmlabError(f"the word {word!r} occurs {len(occ)} time(s) in the texts; two are needed",
                         "pass two or more --text sentences that use the word")
    pairs = []
    for a in range(len(occ)):
        for b in range(a + 1, len(occ)):
            cos = [float(F.cosine_similarity(x, y, dim=0)) for x, y in zip(occ[a].vectors, occ[b].vectors)]
            pairs.append({"a": occ[a].label(texts), "b": occ[b].label(texts), "cosine_by_layer": cos,
                          "static": 1.0})
    return {"word": word, "layers": len(occ[0].vectors), "pairs": pairs}
