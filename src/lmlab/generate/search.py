"""Decoding loops: greedy, sampling and beam search, with or without a KV cache.

:func:`generate` drives any lmlab generative model one token at a time:

* a **decoder** (GPT-2, Llama) continues ``input_ids``; the result is prompt + new tokens;
* an **encoder-decoder** (T5, BART) encodes ``input_ids`` once, then decodes from
  ``decoder_start_token_id``; the result is the decoder sequence (start token first);
* the **LSTM LM** continues ``input_ids``; its recurrent state plays the role of the cache.

With ``use_cache=True`` each step feeds only the newest token plus the cache
(``past_key_values``) returned by the previous step, so a step costs O(T) instead of O(T^2);
with ``use_cache=False`` the whole sequence is re-read every step. Both give the same tokens.

Greedy takes the highest score; sampling draws from ``softmax(processed scores)`` (see
:mod:`lmlab.generate.sampling`); beam search (below) keeps the ``num_beams`` best partial
sequences by total log-probability. A sequence stops at any ``eos_token_id`` / stop sequence;
generation stops when every sequence has stopped or ``max_new_tokens`` were generated; finished
rows are filled with ``pad_token_id``.

Beam search follows the definition used by Hugging Face ``transformers`` (so the outputs can be
compared token for token): each step ranks the ``2 * num_beams`` best continuations of all
beams; a continuation ending in a stop token, if it ranks among the first ``num_beams``, joins
the finished hypotheses with score ``sum log p / generated_length ** length_penalty``; the best
``num_beams`` non-finished ones continue. A batch row is done when it has ``num_beams`` finished
hypotheses and its best running beam, scored at the current length, cannot beat the worst of
them. At ``max_new_tokens`` the running beams are finished as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmlab import budget, values
from lmlab.arguments import (
    callable_argument,
    describe,
    flag_argument,
    id_list_argument,
    ids_argument,
    model_argument,
    number_argument,
    optional_number,
    tensor_argument,
    token_id_argument,
)
from lmlab.errors import LmlabError
from lmlab.generate.sampling import (
    LogitsProcessor,
    apply_processors,
    build_processors,
    check_sampling_options,
)
from lmlab.generate.sampling import sample as sample_tokens
from lmlab.models.facts import facts_of
from lmlab.models.heads import require_head

NEG_INF = -1.0e9


# --------------------------------------------------------------------------- feeding the model
class _Decoding:
    """The growing token sequences of a batch and the model state that goes with them.

    ``next_logits()`` runs the model on what it has not seen yet (everything, without a cache)
    and returns the last position's scores; ``append()`` adds chosen tokens; ``select()`` keeps
    or repeats rows (beam reordering, expansion to several beams or samples).
    """

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, use_cache: bool,
                 decoder_start_token_id: int | None):
        self.model = model
        self.use_cache = use_cache
        self.seq2seq = getattr(model, "architecture", "") == "seq2seq"
        self.past = None
        self.encoder_out = None
        if self.seq2seq:
            self.src_ids, self.src_mask = input_ids, attention_mask
            self.tokens = torch.full((input_ids.shape[0], 1), decoder_start_token_id, dtype=torch.long,
                                     device=input_ids.device)
            self.mask = None
        else:
            self.src_ids = self.src_mask = None
            self.tokens = input_ids
            padded = attention_mask is not None and not bool(attention_mask.all())
            self.mask = attention_mask if padded else None
        self.prompt_len = self.tokens.shape[1]
        if self.seq2seq and hasattr(model, "encode"):
            # the encoder runs once per prompt, before rows are repeated for beams or samples
            self.encoder_out = model.encode(input_ids, attention_mask).last_hidden_state

    def next_logits(self) -> torch.Tensor:
        cached = self.use_cache and self.past is not None
        feed = self.tokens[:, -1:] if cached else self.tokens
        kwargs = {"use_cache": self.use_cache}
        if cached:
            kwargs["past_key_values"] = self.past
        if self.seq2seq:
            kwargs.update(input_ids=self.src_ids, attention_mask=self.src_mask, decoder_input_ids=feed)
            if self.encoder_out is not None:
                kwargs["encoder_outputs"] = self.encoder_out
        else:
            kwargs["input_ids"] = feed
            if self.mask is not None:
                # left-padded prompts: positions count real tokens only, pads are masked out
                kwargs["attention_mask"] = self.mask
                positions = (self.mask.cumsum(-1) - 1).masked_fill(self.mask == 0, 1)
                kwargs["position_ids"] = positions[:, -feed.shape[1]:]
        out = self.model(**kwargs)
        if self.seq2seq and self.encoder_out is None:
            self.encoder_out = out.encoder_last_hidden_state
        if self.use_cache:
            self.past = out.past_key_values
        return out.logits[:, -1].float()

    def append(self, next_tokens: torch.Tensor) -> None:
        self.tokens = torch.cat([self.tokens, next_tokens[:, None]], dim=1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (in that order, repeats allowed) of every per-row tensor."""
        pick = lambda t: None if t is None else t.index_select(0, rows)  # noqa: E731
        self.tokens, self.mask = pick(self.tokens), pick(self.mask)
        self.src_ids, self.src_mask = pick(self.src_ids), pick(self.src_mask)
        if isinstance(self.encoder_out, torch.Tensor):
            self.encoder_out = pick(self.encoder_out)
        if self.past is not None:
            self.past = _map_tensors(self.past, pick)


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    raise LmlabError(f"cannot reorder a cache of type {type(obj).__name__}",
                     "return past_key_values as nested tuples of tensors")


# --------------------------------------------------------------------------- stop conditions
class _Stops:
    """Stop tokens and stop sequences (token-id lists) checked on the newest tokens."""

    def __init__(self, eos_token_ids: Sequence[int], stop_sequences: Sequence[Sequence[int]]):
        self.eos = list(eos_token_ids)
        self.sequences = [list(s) for s in stop_sequences if len(s)]
        self._eos_tensor: torch.Tensor | None = None
        self._seq_tensors: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.eos) + len(self.sequences)

    def hit(self, tokens: torch.Tensor, n_generated: int) -> torch.Tensor:
        """Bool ``[N]``: the rows of ``tokens`` whose newest token completes a stop condition."""
        last = tokens[:, -1]
        if self._eos_tensor is None:  # built once, on the tokens' device
            self._eos_tensor = torch.tensor(self.eos, dtype=torch.long, device=tokens.device)
            self._seq_tensors = [torch.tensor(s, dtype=torch.long, device=tokens.device)
                                 for s in self.sequences]
        done = torch.isin(last, self._eos_tensor)
        for seq in self._seq_tensors:
            if len(seq) <= n_generated:
                done |= (tokens[:, -len(seq):] == seq).all(dim=1)
        return done


# --------------------------------------------------------------------------- public entry point
@torch.no_grad()
def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
             max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, repetition_penalty: float = 1.0,
             num_beams: int = 1, length_penalty: float = 1.0, num_return_sequences: int = 1,
             eos_token_id: int | Sequence[int] | None = None, stop_sequences: Sequence[Sequence[int]] = (),
             pad_token_id: int | None = None, decoder_start_token_id: int | None = None,
             seed: int | None = None, generator: torch.Generator | None = None, use_cache: bool = True,
             logits_processors: Sequence[LogitsProcessor] = ()) -> torch.Tensor:
    """Generate token ids from a decoder, an encoder-decoder or the LSTM LM.

    Args:
        input_ids: ``[B, T]`` prompt ids (decoders: several prompts of different lengths must be
            left-padded, with ``attention_mask`` marking the real tokens); encoder-decoders: the
            source ids.
        max_new_tokens: tokens to generate at most per sequence.
        do_sample: draw tokens from the distribution (with ``temperature``, ``top_k``, ``top_p``)
            instead of taking the most likely one(s).
        repetition_penalty: CTRL penalty on tokens already present (1.0 = off).
        num_beams: > 1 runs beam search (with ``do_sample``: beam sampling);
            ``length_penalty`` is the exponent of the length normalisation of finished beams.
        num_return_sequences: sequences per prompt (the best beams, or independent samples).
        eos_token_id: stop token(s); None = the model config's ``eos_token_id``; ``[]`` = none.
        stop_sequences: further stop conditions, each a list of token ids.
        pad_token_id: filler after a sequence stopped; None = config's pad, else the first stop token.
        decoder_start_token_id: encoder-decoders only; None = the config's.
        seed / generator: make sampling reproducible.
        use_cache: reuse past keys/values (or the LSTM state) instead of re-reading the sequence.
        logits_processors: extra ``(sequences, scores) -> scores`` functions (constraints).

    Returns:
        ``[B * num_return_sequences, L]`` token ids (see the module docstring for what they hold);
        rows of one prompt are consecutive.
    """
    model = model_argument(model, "generate's model")
    check_can_generate(model)
    cfg = model.config
    kind = getattr(model, "architecture", "")
    input_ids = _check_prompt(model, input_ids)
    if attention_mask is not None:
        attention_mask = tensor_argument(attention_mask, "attention_mask", dims=2, lists=True)
    flag_argument(do_sample, "do_sample")
    flag_argument(use_cache, "use_cache")
    _check_options(kind, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=do_sample,
                   num_beams=num_beams, num_return_sequences=num_return_sequences)
    check_sampling_options(temperature, top_k, top_p, repetition_penalty, do_sample=do_sample)
    number_argument(values.LengthPenalty, length_penalty, "length_penalty")
    optional_number(values.Seed, seed, "seed")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise LmlabError(f"generator must be a torch.Generator, got {describe(generator)}",
                         "pass torch.Generator().manual_seed(0), or seed=0")
    logits_processors = _processors(logits_processors)
    stops = _stop_conditions(cfg, eos_token_id, stop_sequences)
    if pad_token_id is not None:
        pad_token_id = token_id_argument(pad_token_id, "pad_token_id", cfg.vocab_size)
    if pad_token_id is None:
        pad_token_id = getattr(cfg, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = stops.eos[0] if stops.eos else 0
    if kind == "seq2seq":
        decoder_start_token_id = _decoder_start(cfg, decoder_start_token_id)
    check_length(model, input_ids.shape[1] if kind != "seq2seq" else 1, max_new_tokens)
    rows = input_ids.shape[0] * (num_beams if num_beams > 1 else num_return_sequences)
    need = generation_bytes(model, rows, input_ids.shape[1], max_new_tokens, use_cache, num_beams)
    budget.require_fits(need, f"generating {rows:,} sequence(s) of up to {max_new_tokens:,} new tokens",
                        "generate fewer samples or beams at once (--num-samples, --num-beams), or fewer "
                        "tokens (--max-new-tokens)", input_ids.device)

    if generator is None and seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    processors = build_processors(do_sample=do_sample, temperature_=temperature, top_k_=top_k, top_p_=top_p,
                                  penalty=repetition_penalty, extra=logits_processors)
    was_training = model.training
    model.eval()
    try:
        state = _Decoding(model, input_ids, attention_mask, use_cache, decoder_start_token_id)
        if num_beams > 1:
            return beam_search(state, processors, stops, max_new_tokens=max_new_tokens, num_beams=num_beams,
                               length_penalty=length_penalty, num_return_sequences=num_return_sequences,
                               pad_token_id=pad_token_id, do_sample=do_sample, generator=generator)
        if num_return_sequences > 1:
            state.select(torch.arange(input_ids.shape[0], device=input_ids.device)
                         .repeat_interleave(num_return_sequences))
        return sample_or_greedy(state, processors, stops, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                pad_token_id=pad_token_id, generator=generator)
    finally:
        model.train(was_training)


def check_can_generate(model) -> None:
    """Only decoders, encoder-decoders and the LSTM LM generate, and only with their language-model
    head first. ``model``: a model, or the facts of a directory (:func:`lmlab.loading.model_facts`),
    so that ``lmlab generate`` refuses a wrong checkpoint before loading its weights."""
    facts = facts_of(model)
    if facts.architecture not in ("decoder", "seq2seq", "rnn") or facts.family == "elmo":
        name = facts.family or facts.architecture or type(model).__name__
        raise LmlabError(f"a {name} model cannot generate text",
                         "generate with a decoder (gpt2, llama), an encoder-decoder (t5, bart) or an lstm LM")
    require_head(facts, "lm", "generating text",
                 "generate with the pretrained checkpoint, or score texts with `lmlab evaluate`")


def _check_options(kind: str, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
                   max_new_tokens, do_sample: bool, num_beams, num_return_sequences) -> None:
    """The mask, lengths and counts of :func:`generate`, each a one-line error when wrong."""
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise LmlabError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
                             f"{tuple(input_ids.shape)}", "pass one mask entry per token")
        if kind == "rnn" and not bool(attention_mask.all()):
            raise LmlabError("the LSTM LM cannot generate from padded prompts",
                             "generate one prompt at a time")
    check_counts(max_new_tokens=max_new_tokens, do_sample=do_sample, num_beams=num_beams,
                 num_return_sequences=num_return_sequences)


#: how a Python caller names :func:`generate`'s counts (``lmlab generate`` passes its flags instead:
#: :data:`lmlab.cli.generate.FLAG_NAMES`)
ARGUMENT_NAMES = {"max_new_tokens": "max_new_tokens", "num_beams": "num_beams",
                  "num_return_sequences": "num_return_sequences", "sample": "do_sample=True"}


def check_counts(*, max_new_tokens, do_sample: bool, num_beams, num_return_sequences,
                 names: dict[str, str] = ARGUMENT_NAMES) -> None:
    """The one rule of how many tokens, beams and sequences a decoding takes, each a one-line error
    naming the setting as the caller wrote it (``names``: the arguments, or a command's flags), so
    that a command can run it before loading the model."""
    number_argument(values.Count, max_new_tokens, names["max_new_tokens"])
    number_argument(values.BatchSize, num_beams, names["num_beams"])
    number_argument(values.BatchSize, num_return_sequences, names["num_return_sequences"])
    beams, returned, n = names["num_beams"], names["num_return_sequences"], num_return_sequences
    if num_beams > 1 and n > num_beams:
        raise LmlabError(f"{returned} {n} exceeds {beams} {num_beams} (beam search returns its best beams)",
                         f"use {beams} {n} or more")
    if num_beams == 1 and not do_sample and n > 1:
        raise LmlabError(f"greedy decoding returns one sequence per prompt, not {returned} {n}",
                         f"use {names['sample']} (or {beams} {n}) for several")


def _stop_conditions(cfg, eos_token_id: int | Sequence[int] | None,
                     stop_sequences: Sequence[Sequence[int]]) -> _Stops:
    """The stop tokens (None: the config's ``eos_token_id``) and sequences, each id checked."""
    if eos_token_id is None:
        eos_token_id = getattr(cfg, "eos_token_id", None)
    v = cfg.vocab_size
    if eos_token_id is None:
        eos = []
    elif isinstance(eos_token_id, (list, tuple)) or getattr(eos_token_id, "dim", lambda: 0)() == 1:
        eos = id_list_argument(eos_token_id, "eos_token_id", v)
    else:
        eos = [token_id_argument(eos_token_id, "eos_token_id", v)]
    if isinstance(stop_sequences, (str, bytes)) or not isinstance(stop_sequences, (list, tuple)):
        raise LmlabError(f"stop_sequences must be a list of token-id lists, got {describe(stop_sequences)}",
                         "pass e.g. [tokenizer.encode(text)]")
    sequences = [id_list_argument(s, f"stop_sequences[{i}]", v) for i, s in enumerate(stop_sequences)]
    return _Stops(eos, sequences)


def _processors(processors) -> Sequence[LogitsProcessor]:
    """``logits_processors`` as a list of callables (one function alone is refused with the list)."""
    if callable(processors) or not isinstance(processors, (list, tuple)):
        fix = "pass a list: [processor]" if callable(processors) else "pass a list of functions"
        raise LmlabError(f"logits_processors must be a list of functions, got {describe(processors)}", fix)
    return [callable_argument(p, f"logits_processors[{i}]") for i, p in enumerate(processors)]


def _decoder_start(cfg, decoder_start_token_id: int | None) -> int:
    """An encoder-decoder's first decoder token: the one given, else the config's."""
    if decoder_start_token_id is None:
        decoder_start_token_id = getattr(cfg, "decoder_start_token_id", None)
    if decoder_start_token_id is None:
        raise LmlabError("the model config has no decoder_start_token_id",
                         "pass decoder_start_token_id=...")
    return token_id_argument(decoder_start_token_id, "decoder_start_token_id", cfg.vocab_size)


def generation_bytes(model, rows: int, prompt_len: int, max_new_tokens: int, use_cache: bool = True,
                     num_beams: int = 1) -> int:
    """Coarse memory of generating ``rows`` sequences (prompts x samples, or x beams) from prompts
    of ``prompt_len`` tokens (:mod:`lmlab.budget`): the largest logits of one forward pass (the
    whole prompt, or the whole sequence without a cache), a few copies of one step's scores, the
    KV cache (the LSTM's state is smaller) and the token rows (three more for beam search)."""
    cfg = model.config
    vocab, width = int(cfg.vocab_size), int(getattr(cfg, "d_model", 0) or 0)
    layers = int(getattr(cfg, "decoder_layers", None) or getattr(cfg, "n_layers", 0) or 0)
    seq2seq = getattr(model, "architecture", "") == "seq2seq"
    length = (1 if seq2seq else prompt_len) + max_new_tokens
    fed = (1 if seq2seq else prompt_len) if use_cache else length
    logits = budget.tensor_bytes(rows, fed, vocab) + budget.tensor_bytes(4, rows, vocab)
    cache = budget.tensor_bytes(rows, length + (prompt_len if seq2seq else 0), layers, 2, width)
    hidden = budget.tensor_bytes(rows, fed, width, 8)  # a forward pass's activations, kept briefly
    tokens = budget.tensor_bytes(rows, length, 4 if num_beams > 1 else 1, itemsize=8)
    return logits + (cache if use_cache else 0) + hidden + tokens


def _check_prompt(model, input_ids) -> torch.Tensor:
    """The prompt as a ``[batch, length]`` long tensor (one prompt ``[length]`` gains the batch
    dimension; a list of lists of ids is taken as the tensor it spells), its ids in the vocabulary."""
    ids = tensor_argument(input_ids, "the prompt (input_ids)", dims=(1, 2), kind="integer", lists=True)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.shape[1] == 0:
        raise LmlabError(f"the prompt must be a non-empty [batch, length] id tensor, got shape "
                         f"{tuple(ids.shape)}", "start with at least one token (e.g. the BOS id)")
    return ids_argument(ids, "prompt", model.config.vocab_size,
                        fix="encode the prompt with the model's own tokenizer").long()


def check_length(model, start_len: int, max_new_tokens: int, names: dict[str, str] = ARGUMENT_NAMES) -> None:
    """Learned absolute positions end at ``max_positions``: refuse to run past them, naming the
    budget as the caller wrote it (``names``: the arguments, or a command's flags), so that a
    command can run it before it generates anything."""
    cfg = model.config
    if getattr(cfg, "positions", None) == "learned" and start_len + max_new_tokens > cfg.max_positions:
        room = max(cfg.max_positions - start_len, 0)
        budget = names["max_new_tokens"]
        raise LmlabError(f"prompt ({start_len} tokens) + {budget} {max_new_tokens} exceeds the "
                         f"model's {cfg.max_positions} positions",
                         f"shorten the prompt or use {budget} {room} or less")


# --------------------------------------------------------------------------- greedy / sampling
def sample_or_greedy(state: _Decoding, processors: Sequence[LogitsProcessor], stops: _Stops, *,
                     max_new_tokens: int, do_sample: bool, pad_token_id: int,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per step per row: the arg-max (greedy) or a draw from the processed distribution."""
    running = torch.ones(state.tokens.shape[0], dtype=torch.bool, device=state.tokens.device)
    for step in range(max_new_tokens):
        scores = apply_processors(processors, state.tokens, state.next_logits())
        if do_sample:
            nxt = sample_tokens(scores.softmax(dim=-1), generator)
        else:
            nxt = scores.argmax(dim=-1)
        nxt = torch.where(running, nxt, torch.full_like(nxt, pad_token_id))
        state.append(nxt)
        if len(stops):
            running &= ~stops.hit(state.tokens, step + 1)
            if not bool(running.any()):
                break
    return state.tokens


# --------------------------------------------------------------------------- beam search
def beam_search(state: _Decoding, processors: Sequence[LogitsProcessor], stops: _Stops, *,
                max_new_tokens: int, num_beams: int, length_penalty: float = 1.0,
                num_return_sequences: int = 1, pad_token_id: int = 0, do_sample: bool = False,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Beam search over ``state`` (one row per prompt); see the module docstring for the rules.

    Returns the ``num_return_sequences`` best finished hypotheses per prompt, padded with
    ``pad_token_id`` to the longest one.
    """
    B, K, dev = state.tokens.shape[0], num_beams, state.tokens.device
    prompt_len = state.prompt_len
    state.select(torch.arange(B, device=dev).repeat_interleave(K))
    # candidates ranked per step: enough that K of them do not stop, so the beams can be refilled
    n_keep = max(2, 1 + len(stops.eos)) * K
    # running beams: only beam 0 is live at first, so the first step does not pick K copies of one token
    run_scores = torch.full((B, K), NEG_INF, device=dev)
    run_scores[:, 0] = 0.0
    finished = _Finished(B, K, prompt_len + max_new_tokens, pad_token_id, dev)
    open_rows = torch.ones(B, dtype=torch.bool, device=dev)   # rows whose finished set can still improve
    batch_base = (torch.arange(B, device=dev) * K)[:, None]

    for step in range(max_new_tokens):
        cur_len = state.tokens.shape[1]
        logprobs = apply_processors(processors, state.tokens, state.next_logits().log_softmax(dim=-1))
        V = logprobs.shape[-1]
        n_keep = min(n_keep, K * V)
        total = (logprobs.view(B, K, V) + run_scores[:, :, None]).view(B, K * V)
        cand_scores, cand = _rank_candidates(total, n_keep, do_sample, generator)
        cand_beam, cand_token = cand // V, cand % V
        cand_rows = (batch_base + cand_beam).view(-1)
        cand_seqs = torch.cat([state.tokens.index_select(0, cand_rows), cand_token.view(-1, 1)], dim=1)
        last_step = step == max_new_tokens - 1
        if last_step:
            stopped = torch.ones_like(cand_scores, dtype=torch.bool)
        elif len(stops):
            stopped = stops.hit(cand_seqs, step + 1).view(B, n_keep)
        else:
            stopped = torch.zeros_like(cand_scores, dtype=torch.bool)
        finished.add(cand_scores, cand_seqs, stopped, open_rows, cur_len + 1 - prompt_len, length_penalty)
        if last_step:
            break

        # running beams: the best K candidates that did not stop
        live_scores = cand_scores + stopped.float() * NEG_INF
        top = torch.topk(live_scores, K, dim=1).indices
        run_scores = live_scores.gather(1, top)
        rows = (batch_base + cand_beam.gather(1, top)).view(-1)
        state.select(rows)
        state.append(cand_token.gather(1, top).view(-1))

        # a row is done once its K finished hypotheses cannot be beaten by its best running beam
        best_running = run_scores[:, 0] / ((cur_len + 1 - prompt_len) ** length_penalty)
        open_rows &= ~(finished.filled.all(dim=1) & (best_running <= finished.worst()))
        if not bool(open_rows.any()):
            break
    return finished.best(num_return_sequences)


def _rank_candidates(total: torch.Tensor, n_keep: int, do_sample: bool,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, indices)`` of ``n_keep`` continuations per row of ``total`` (``[B, K * V]``), best
    first: the top ones, or (beam sampling) ones drawn from ``softmax(total)``."""
    if do_sample:
        cand = torch.multinomial(total.softmax(dim=-1), n_keep, generator=generator)
        cand_scores = total.gather(1, cand)
        cand_scores, order = cand_scores.sort(dim=1, descending=True)
        return cand_scores, cand.gather(1, order)
    return torch.topk(total, n_keep, dim=1)


class _Finished:
    """The ``K`` best finished hypotheses per prompt: their tokens (padded with ``pad_token_id`` to
    ``total_len``), length-normalised scores, lengths, and which slots hold one."""

    def __init__(self, B: int, K: int, total_len: int, pad_token_id: int, dev: torch.device):
        self.pad_token_id = pad_token_id
        self.tokens = torch.full((B, K, total_len), pad_token_id, dtype=torch.long, device=dev)
        self.scores = torch.full((B, K), NEG_INF, device=dev)
        self.lengths = torch.zeros((B, K), dtype=torch.long, device=dev)
        self.filled = torch.zeros((B, K), dtype=torch.bool, device=dev)

    def add(self, cand_scores: torch.Tensor, cand_seqs: torch.Tensor, stopped: torch.Tensor,
            open_rows: torch.Tensor, gen_len: int, length_penalty: float) -> None:
        """Keep the best of the finished hypotheses and the candidates (``[B, n_keep]`` scores,
        ``[B * n_keep, L]`` sequences) that stopped among the first ``K`` of an open row."""
        (B, K, total_len), n_keep = self.tokens.shape, cand_scores.shape[1]
        seq_len = cand_seqs.shape[1]
        new_fin = stopped.clone()
        new_fin[:, K:] = False
        new_fin &= open_rows[:, None]
        norm = cand_scores / (gen_len ** length_penalty)
        norm = torch.where(new_fin, norm, torch.full_like(norm, NEG_INF))
        merged_scores = torch.cat([self.scores, norm], dim=1)
        keep = torch.topk(merged_scores, K, dim=1).indices
        cand_padded = torch.full((B, n_keep, total_len), self.pad_token_id, dtype=torch.long,
                                 device=cand_scores.device)
        cand_padded[:, :, :seq_len] = cand_seqs.view(B, n_keep, -1)
        self.tokens = torch.cat([self.tokens, cand_padded], dim=1).gather(
            1, keep[:, :, None].expand(-1, -1, total_len))
        self.scores = merged_scores.gather(1, keep)
        self.lengths = torch.cat([self.lengths, torch.full_like(cand_scores, seq_len, dtype=torch.long)],
                                 dim=1).gather(1, keep)
        self.filled = torch.cat([self.filled, new_fin], dim=1).gather(1, keep)

    def worst(self) -> torch.Tensor:
        """``[B]``: the lowest score among each row's finished hypotheses (``NEG_INF`` if a slot is empty)."""
        return self.scores.masked_fill(~self.filled, NEG_INF).min(dim=1).values

    def best(self, n: int) -> torch.Tensor:
        """The ``n`` best hypotheses of each prompt, ``[B * n, L]``, cut to the longest of them."""
        B, _, total_len = self.tokens.shape
        best = self.tokens[:, :n].reshape(B * n, total_len)
        longest = int(self.lengths[:, :n].max())
        return best[:, :longest]
