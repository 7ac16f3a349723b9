"""`lmlab generate --variant NAME=DIR ... --prompts FILE`: many tuned variants of one base model
continue their prompts in shared batches (see lmlab.adapt.multi)."""

from __future__ import annotations

import json

from lmlab.errors import LmlabError
from lmlab.values import path_flag, text_flag

#: rows per batch
BATCH_ROWS = 32


def add_arguments(p) -> None:
    g = p.add_argument_group("many tuned variants in one batch (--checkpoint is their shared base)")
    g.add_argument("--variant", type=text_flag, action="append", default=[], metavar="NAME=DIR",
                   help="a LoRA, prefix- or prompt-tuned variant of the base (an `lmlab finetune --method` "
                        "output or adapter folder); NAME alone is the base itself; repeat for more")
    g.add_argument("--prompts", type=path_flag, metavar="FILE",
                   help='JSON lines {"variant": NAME, "prompt": TEXT}; prints one JSON line per row and '
                        "sample")


def read_prompts(path: str, names: list[str]) -> list[tuple[str, str]]:
    """``(variant, prompt)`` of every line of ``path``, checked (one-line errors with the line)."""
    from lmlab.fileio import iter_text_lines
    from lmlab.text_input import parse_json

    rows = []
    for n, line in enumerate(iter_text_lines(path), 1):
        if not line.strip():
            continue
        try:
            rec = parse_json(line)
        except ValueError as e:
            raise LmlabError(f"{path} line {n} is not JSON ({e.msg})",
                             'write {"variant": ..., "prompt": ...}') from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or "variant" not in rec:
            raise LmlabError(f"{path} line {n} needs a \"variant\" and a text \"prompt\"",
                             'write {"variant": NAME, "prompt": TEXT}')
        if rec["variant"] not in names:
            raise LmlabError(f"{path} line {n}: unknown variant {rec['variant']!r}",
                             f"name one of the --variant names: {', '.join(names)}")
        rows.append((rec["variant"], rec["prompt"]))
    if not rows:
        raise LmlabError(f"{path} holds no prompts", 'write one {"variant": NAME, "prompt": TEXT} per line')
    return rows


def run_variants(args, mode: dict, continuation, names: dict[str, str]) -> int:
    """Generate every row of --prompts with its variant, BATCH_ROWS rows at a time;
    ``continuation(tok, new_ids, eos, stops)`` is the text printed for the new ids; ``names``: the
    decoding settings as the command's flags name them."""
    import torch

    from lmlab.adapt.multi import MultiAdapterModel, generate_variants, parse_variants
    from lmlab.generate.search import check_can_generate, check_length
    from lmlab.loading import load_model
    from lmlab.runtime import pick_device

    variants = parse_variants(args.variant)
    rows = read_prompts(args.prompts, list(variants))
    device = pick_device(args.device or "auto")  # and the thread count (lmlab.runtime's one policy)
    base = load_model(args.checkpoint, check=check_can_generate)
    tok = getattr(base, "tokenizer", None)
    if tok is None:
        raise LmlabError(f"checkpoint {args.checkpoint} has no tokenizer",
                         "use a base checkpoint saved with its tokenizer")
    model = MultiAdapterModel(base, variants).to(device)
    cfg = model.config
    eos = cfg.eos_token_id if getattr(cfg, "eos_token_id", None) is not None else tok.eos_id
    pad = cfg.pad_token_id if getattr(cfg, "pad_token_id", None) is not None else 0
    start = tok.bos_id if tok.bos_id is not None else eos
    stop_sequences = [tok.encode(s) for s in args.stop if s]
    max_new = 50 if args.max_new_tokens is None else args.max_new_tokens
    every = [tok.encode(prompt) or [start] for _, prompt in rows]  # each row encoded once
    if getattr(base, "architecture", None) != "seq2seq":  # every row fits, before the first is printed
        check_length(model, max(map(len, every)), max_new, names)
    for first in range(0, len(rows), BATCH_ROWS):
        chunk = rows[first:first + BATCH_ROWS]
        encoded = every[first:first + BATCH_ROWS]
        if start is None and any(e == [None] for e in encoded):
            raise LmlabError("an empty prompt needs a BOS or EOS token to start from",
                             "give non-empty prompts")
        width = max(map(len, encoded))
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
        out = generate_variants(model, ids, mask, [v for v, _ in chunk], max_new_tokens=max_new,
                                repetition_penalty=args.repetition_penalty,
                                length_penalty=args.length_penalty, eos_token_id=[] if eos is None else eos,
                                stop_sequences=stop_sequences, seed=args.seed, use_cache=not args.no_cache,
                                **mode)
        per_row = out.shape[0] // len(chunk)
        for j, seq in enumerate(out):
            i = first + j // per_row
            text = continuation(tok, seq[width:].tolist(), eos, args.stop)
            print(json.dumps({"row": i, "variant": rows[i][0], "sample": j % per_row, "text": text},
                             ensure_ascii=False))
    return 0
