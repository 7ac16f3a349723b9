"""`lmlab generate`: continue a prompt with a saved model (see lmlab.generate)."""

from __future__ import annotations

import json

from lmlab.cli.common import add_command
from lmlab.cli.generate_variants import add_arguments as add_variant_arguments
from lmlab.errors import LmlabError
from lmlab.setting_names import SettingNames
from lmlab.values import (
    LengthPenalty,
    Penalty,
    SamplingTemperature,
    TopP,
    batch_flag,
    count_flag,
    device_flag,
    flag,
    path_flag,
    seed_flag,
    text_flag,
)

# = lmlab.generate.json_backend.GRAMMAR_BACKENDS, written out: importing lmlab.generate loads torch
GRAMMAR_BACKENDS = ("auto", "llguidance", "lmlab")

DESCRIPTION = """\
Continue a text prompt with a saved decoder (GPT-2, Llama), encoder-decoder (T5, BART) or LSTM LM.
The prompt is tokenised with the checkpoint's own tokenizer (tokenizer/ inside the checkpoint, or
--tokenizer); an encoder-decoder reads the prompt as its source text (with the end-of-sequence
token appended) and prints what its decoder writes. Only the new text is printed.
--instruction TEXT renders the prompt with the instruction template that `lmlab finetune --task
instruct` saved with the checkpoint (task.json; else the default template), --prompt being the
instruction's input.

Decoding: sampling at --temperature (default 1.0) with optional --top-k / --top-p;
--temperature 0 is greedy decoding (always the most likely token); --num-beams B > 1 is beam
search (deterministic, so it takes no --temperature/--top-k/--top-p). Generation stops at the
model's end-of-sequence token, at any --stop text, or after --max-new-tokens tokens. The KV cache
is used unless --no-cache (same tokens, slower; for checking).

--num-samples N prints N continuations: independent samples, or the N best beams. With
--format text they are separated by lines of dashes; --format jsonl prints one JSON object per
line: {"sample": i, "text": ...}.

--json-schema FILE constrains decoding so that every output is a JSON document valid against
the schema in FILE (see docs/structured-output.md): each of the N outputs is printed on its own
line, whole, within --max-new-tokens (default 256 here), or nothing is generated: a schema whose
shortest document cannot fit is refused first. --grammar-backend picks the engine. lmlab's own
(object, array, string, number, integer, boolean, null, enum, const, anyOf, required, nesting)
forces the shortest valid completion when the budget runs low. llguidance (pip install
'lmlab[grammar]'; byte-level or character BPE) adds $ref/$defs, pattern, format, oneOf, allOf and
more, but does not force an ending: a document unfinished at --max-new-tokens is an error. auto
(the default) keeps the promise: llguidance where every document the schema allows fits in
--max-new-tokens (a byte-level BPE tokenizer, a bounded schema), else lmlab's engine; a schema
only llguidance supports that cannot be shown to fit is refused, naming the way out. A keyword
the engine does not support is refused with an error naming it.

--variant NAME=DIR (repeatable) with --prompts FILE serves several LoRA, prefix- or prompt-tuned
variants of the --checkpoint base in shared batches: each line of FILE, {"variant": NAME,
"prompt": TEXT}, is continued by its variant, every row as if its variant ran alone (greedy
decoding gives the same tokens), and one JSON line {"row", "variant", "sample", "text"} is
printed per row and sample. --variant NAME without a directory is the base model itself.
See docs/peft.md ("Many variants in one batch")."""

EXAMPLES = """\
  lmlab generate --checkpoint ck/ --prompt "ROMEO:" --max-new-tokens 60 --top-p 0.9 --seed 0
  lmlab generate --checkpoint ck/ --prompt "ROMEO:" --temperature 0            # greedy
  lmlab generate --checkpoint ck/ --prompt "ROMEO:" --num-beams 4 --num-samples 2
  lmlab generate --checkpoint t5ck/ --prompt "translate: a house" --num-beams 3 --stop "."
  lmlab generate --checkpoint ck/ --prompt "Once" --num-samples 5 --seed 1 --format jsonl
  lmlab generate --checkpoint ft/gpt-instruct --instruction "Is this review positive or negative?" \\
      --prompt "a gorgeous film" --temperature 0
  lmlab generate --checkpoint ck/ --json-schema person.json --num-samples 10 --seed 1
  lmlab generate --checkpoint ck/ --json-schema person.json --grammar-backend lmlab
  lmlab generate --checkpoint gpt/ --variant poem=ft/poem --variant plain --prompts rows.jsonl"""


def register(sub) -> None:
    p = add_command(sub, "generate", "continue a prompt with a saved model", DESCRIPTION, EXAMPLES)
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="an lmlab checkpoint directory (or a Hugging Face model directory)")
    p.add_argument("--prompt", default="", metavar="TEXT",
                   help="text to continue (empty: start from the tokenizer's BOS token, else its EOS)")
    p.add_argument("--instruction", type=text_flag, default=None, metavar="TEXT",
                   help="render the prompt with the checkpoint's instruction template (task.json of "
                        "`lmlab finetune --task instruct`; else the default template): this instruction, "
                        "--prompt as its input")
    p.add_argument("--tokenizer", type=path_flag, metavar="PATH",
                   help="the tokenizer, for a checkpoint saved without one (checked against the model: "
                        "see docs/generate.md)")
    p.add_argument("--max-new-tokens", type=count_flag, default=None, metavar="N",
                   help="tokens to generate at most (default 50; 256 with --json-schema)")
    p.add_argument("--temperature", type=flag(SamplingTemperature), default=None, metavar="T",
                   help="sampling temperature (default 1.0); 0 = greedy decoding")
    p.add_argument("--top-k", type=count_flag, default=None, metavar="K",
                   help="sample only from the K most likely tokens")
    p.add_argument("--top-p", type=flag(TopP), default=None, metavar="P",
                   help="sample only from the smallest set of tokens with probability >= P (nucleus)")
    p.add_argument("--num-beams", type=batch_flag, default=1, metavar="B",
                   help="beam search with B beams (1 = off)")
    p.add_argument("--length-penalty", type=flag(LengthPenalty), default=1.0, metavar="A",
                   help="beam search: finished beams are scored by log p / length**A")
    p.add_argument("--repetition-penalty", type=flag(Penalty), default=1.0, metavar="R",
                   help="CTRL penalty on tokens already present (1.0 = off, 1.2 is common)")
    p.add_argument("--seed", type=seed_flag, default=None, metavar="S", help="seed for reproducible sampling")
    p.add_argument("--num-samples", type=batch_flag, default=1, metavar="N", help="continuations to print")
    p.add_argument("--stop", type=text_flag, action="append", default=[], metavar="TEXT",
                   help="stop when this text is generated (may be repeated); it is not printed")
    p.add_argument("--no-cache", action="store_true", help="re-read the whole sequence every step")
    p.add_argument("--format", choices=("text", "jsonl"), default="text", help="output format")
    p.add_argument("--json-schema", type=path_flag, metavar="FILE", default=None,
                   help="constrain every output to a JSON document valid against this JSON Schema")
    p.add_argument("--grammar-backend", choices=GRAMMAR_BACKENDS, default=None,
                   help="JSON-schema engine: llguidance (extra 'grammar'; no forced ending), lmlab (forces "
                        "an ending), or auto (the default: llguidance where every document fits in "
                        "--max-new-tokens, else lmlab)")
    p.add_argument("--device", type=device_flag, default=None,
                   help="torch device (default: cuda when available, else cpu)")
    add_variant_arguments(p)
    p.set_defaults(func=run)


#: generate()'s counts as this command's flags name them (lmlab.generate.search.check_counts)
FLAG_NAMES = {"max_new_tokens": "--max-new-tokens", "num_beams": "--num-beams",
              "num_return_sequences": "--num-samples", "sample": "a --temperature above 0"}


#: the JSON-schema engine's settings as this command's flags name them
SCHEMA_NAMES = SettingNames("flag", flags={"backend": "--grammar-backend"})


def _decoding_mode(args) -> dict:
    """Translate the CLI options into generate() keyword arguments, checked (one-line errors naming
    the flags) before any model is loaded."""
    from lmlab.generate.search import check_counts

    mode = _mode(args)
    check_counts(max_new_tokens=50 if args.max_new_tokens is None else args.max_new_tokens,
                 do_sample=mode.get("do_sample", False), num_beams=mode["num_beams"],
                 num_return_sequences=mode["num_return_sequences"], names=FLAG_NAMES)
    return mode


def _mode(args) -> dict:
    sampling_opts = [name for name, v in (("--temperature", args.temperature), ("--top-k", args.top_k),
                                          ("--top-p", args.top_p)) if v is not None]
    if args.num_beams > 1:
        if sampling_opts:
            raise LmlabError(f"beam search is deterministic and takes no {'/'.join(sampling_opts)}",
                             "drop them, or use --num-beams 1 to sample")
        return {"num_beams": args.num_beams, "num_return_sequences": args.num_samples}
    if args.temperature == 0:
        extra = [o for o in sampling_opts if o != "--temperature"]
        if extra:
            raise LmlabError(f"--temperature 0 is greedy decoding, which takes no {'/'.join(extra)}",
                             "drop them, or use a temperature > 0 to sample")
        return {"num_beams": args.num_beams, "num_return_sequences": args.num_samples}
    temperature = 1.0 if args.temperature is None else args.temperature
    return {"num_beams": args.num_beams, "do_sample": True, "temperature": temperature,
            "top_k": args.top_k, "top_p": args.top_p, "num_return_sequences": args.num_samples}


def _load(args):
    from pathlib import Path

    from lmlab.generate.search import check_can_generate
    from lmlab.loading import attach_tokenizer, load_model

    # a classifier is refused before its weights; a --tokenizer is checked to fit
    model = load_model(args.checkpoint, tokenizer=args.tokenizer or None, check=check_can_generate)
    if getattr(model, "tokenizer", None) is None and (Path(args.checkpoint) / "tokenizer.json").is_file():
        model = attach_tokenizer(model, args.checkpoint)  # a Hugging Face model directory's own
    if getattr(model, "tokenizer", None) is None:
        raise LmlabError(f"checkpoint {args.checkpoint} has no tokenizer",
                         "pass --tokenizer DIR (the tokenizer the model was trained with)")
    return model, model.tokenizer


def run(args) -> int:
    import torch

    from lmlab.generate import generate
    from lmlab.generate.search import check_length

    mode = _decoding_mode(args)
    # --variant with --prompt, --json-schema...: refused by lmlab.cli.flag_rules
    from lmlab.runtime import check_device, pick_device

    check_device(args.device or "auto")  # a bad device or OMP_NUM_THREADS: before the model is read
    if args.variant:
        from lmlab.cli.generate_variants import run_variants

        return run_variants(args, mode, _continuation, FLAG_NAMES)
    args.grammar_backend = args.grammar_backend or "auto"
    if args.json_schema:
        schema = _read_schema(args)
    model, tok = _load(args)
    device = pick_device(args.device or "auto")  # and the thread count (lmlab.runtime's one policy)
    model.to(device)
    cfg = model.config
    eos = cfg.eos_token_id if getattr(cfg, "eos_token_id", None) is not None else tok.eos_id
    seq2seq = model.architecture == "seq2seq"
    ids = tok.encode(args.prompt) if args.instruction is None else _instruction_ids(args, tok, eos, seq2seq)
    if seq2seq and eos is not None:
        ids = ids + [eos]
    if not ids:
        start = tok.bos_id if tok.bos_id is not None else eos
        if start is None:
            raise LmlabError("the prompt is empty and the tokenizer has no BOS or EOS token to start from",
                             "give a non-empty --prompt")
        ids = [start]
    stop_sequences = [tok.encode(s) for s in args.stop if s]
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    if args.json_schema:
        return _run_json(args, model, tok, prompt, schema, mode, seq2seq)
    max_new = 50 if args.max_new_tokens is None else args.max_new_tokens
    check_length(model, 1 if seq2seq else len(ids), max_new, FLAG_NAMES)
    out = generate(model, prompt, max_new_tokens=max_new,
                   repetition_penalty=args.repetition_penalty, length_penalty=args.length_penalty,
                   eos_token_id=[] if eos is None else eos,
                   stop_sequences=stop_sequences, seed=args.seed, use_cache=not args.no_cache, **mode)
    start = 1 if seq2seq else len(ids)
    texts = [_continuation(tok, row[start:].tolist(), eos, args.stop) for row in out]
    for i, text in enumerate(texts):
        if args.format == "jsonl":
            print(json.dumps({"sample": i, "text": text}, ensure_ascii=False))
        else:
            if i:
                print("-" * 40)
            print(text)
    return 0


def _instruction_ids(args, tok, eos, seq2seq: bool) -> list[int]:
    """The ids of ``--instruction`` (and ``--prompt`` as its input) in the checkpoint's template,
    as instruction tuning wrote them (BOS first for a decoder whose BOS is no EOS)."""
    from pathlib import Path

    from lmlab.fileio import read_json
    from lmlab.tasks.instruct import DEFAULT_TEMPLATE, check_template, render_prompt

    if not args.instruction.strip():
        raise LmlabError("--instruction is empty", "give the instruction text")
    template = DEFAULT_TEMPLATE
    task_file = Path(args.checkpoint) / "task.json"
    if task_file.is_file():
        state = read_json(task_file, "task file")
        if state.get("task") != "instruct":
            raise LmlabError(f"{args.checkpoint} was fine-tuned for task {state.get('task')!r}, which has no "
                             "instruction template", "drop --instruction and pass the text as --prompt")
        template = check_template(state.get("options", {}).get("template") or DEFAULT_TEMPLATE)
    ids = tok.encode(render_prompt(template, args.instruction, args.prompt))
    bos = tok.bos_id
    return ids if seq2seq or bos is None or bos == eos else [bos] + ids


def _continuation(tok, new_ids: list[int], eos: int | None, stops: list[str]) -> str:
    """Text of the generated ids, cut before the end-of-sequence token and before any stop text."""
    if eos is not None and eos in new_ids:
        new_ids = new_ids[:new_ids.index(eos)]
    text = tok.decode(new_ids, skip_special_tokens=True)
    for s in stops:
        if s and s in text:
            text = text[:text.index(s)]
    return text


def _read_schema(args):
    """The JSON Schema of --json-schema, with the options it cannot be combined with refused."""
    from lmlab.fileio import read_json
    from lmlab.generate.json_backend import check_json_schema

    if args.num_beams > 1:
        raise LmlabError("--json-schema works with sampling or greedy decoding, not beam search",
                         "drop --num-beams")
    schema = read_json(args.json_schema, "JSON Schema file",
                       "make it one JSON object (a JSON Schema) in UTF-8; the error says where it breaks")
    # unsupported keywords: before the model is loaded
    check_json_schema(schema, args.grammar_backend, SCHEMA_NAMES)
    return schema


def _run_json(args, model, tok, prompt, schema, mode: dict, seq2seq: bool) -> int:
    """Constrained decoding: print N documents, each valid against the schema, one per line."""
    from lmlab.generate import generate
    from lmlab.generate.json_backend import json_schema_constraint
    from lmlab.generate.search import check_length
    cfg = model.config
    max_new = args.max_new_tokens
    if max_new is None:
        max_new = 256
        if getattr(cfg, "positions", None) == "learned" and not seq2seq:
            max_new = max(1, min(max_new, cfg.max_positions - prompt.shape[1]))
    check_length(model, 1 if seq2seq else prompt.shape[1], max_new, FLAG_NAMES)
    eos = getattr(cfg, "eos_token_id", None)
    eos = tok.eos_id if eos is None else eos
    constraint = json_schema_constraint(schema, tok, backend=args.grammar_backend, max_new_tokens=max_new,
                                        prompt_len=1 if seq2seq else prompt.shape[1], eos_token_id=eos,
                                        names=SCHEMA_NAMES)
    out = generate(model, prompt, max_new_tokens=max_new, repetition_penalty=args.repetition_penalty,
                   eos_token_id=constraint.eos, seed=args.seed, use_cache=not args.no_cache,
                   logits_processors=[constraint], **mode)
    start = 1 if seq2seq else prompt.shape[1]
    texts = [constraint.text(row[start:].tolist()) for row in out]     # all finished, or an error
    for i, text in enumerate(texts):
        try:
            json.loads(text)
        except ValueError:
            raise LmlabError(f"internal error: constrained output {text!r} is not valid JSON",
                             "please report it with the schema and the checkpoint") from None
        print(json.dumps({"sample": i, "text": text}, ensure_ascii=False) if args.format == "jsonl" else text)
    return 0
