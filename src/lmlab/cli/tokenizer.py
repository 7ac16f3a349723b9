"""`lmlab tokenizer train | encode | inspect`."""

from __future__ import annotations

import json
import sys
import time
from itertools import chain

from lmlab.cli.common import add_command, add_group
from lmlab.errors import LmlabError
from lmlab.fileio import check_input_file, iter_text_lines, require_text
from lmlab.tokenizers import ALGORITHMS
from lmlab.values import (
    TokenIds,
    comma_ints,
    count_flag,
    encoding_flag,
    flag,
    path_flag,
    size_flag,
    text_flag,
)


def register(sub) -> None:
    _, tsub = add_group(
        sub,
        "tokenizer",
        "train, apply and inspect subword tokenizers",
        "Train, apply and inspect subword tokenizers (BPE, byte-level BPE, WordPiece, Unigram).\n"
        "Run `lmlab tokenizer COMMAND --help` for details.",
    )
    _register_train(tsub)
    _register_encode(tsub)
    _register_decode(tsub)
    _register_inspect(tsub)


def _register_train(tsub) -> None:
    """`lmlab tokenizer train`: learn a vocabulary from text files."""
    p = add_command(
        tsub,
        "train",
        "learn a tokenizer from text files",
        "Learn a subword vocabulary from one or more UTF-8 text files and save it as a\n"
        "directory with tokenizer.json (Hugging Face format) and tokenizer_config.json.\n"
        "Files are streamed: memory grows with the number of distinct words, not corpus size.",
        "  lmlab tokenizer train --algo bytelevel --vocab-size 8000 --input a.txt b.txt --out tok/\n"
        "  lmlab tokenizer train --algo bpe --num-merges 8 --input toy.txt --out toy-bpe/\n"
        "  lmlab tokenizer train --algo wordpiece --vocab-size 30000 --lowercase --input wiki.txt --out wp/",
    )
    p.add_argument(
        "--algo",
        required=True,
        choices=list(ALGORITHMS),
        help="bpe: character BPE with end-of-word '_'; bytelevel: GPT-2 style byte BPE; "
        "wordpiece: BERT; unigram: SentencePiece-style unigram LM",
    )
    p.add_argument(
        "--vocab-size", type=count_flag, default=None, help="total vocabulary size, special tokens included"
    )
    p.add_argument(
        "--num-merges", type=size_flag, default=None,
        help="(bpe only) number of merges instead of --vocab-size",
    )
    p.add_argument("--input", type=path_flag, nargs="+", required=True, metavar="FILE",
                   help="training text files")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="output directory (written atomically)")
    p.add_argument(
        "--special-tokens",
        type=text_flag,
        nargs="*",
        default=None,
        metavar="TOK",
        help="special tokens (default: [PAD] [UNK] [CLS] [SEP] [MASK] <s> </s>)",
    )
    p.add_argument("--sentinels", type=size_flag, default=0, help="also add N T5 sentinels <extra_id_0>..")
    p.add_argument("--lowercase", action="store_true", help="(wordpiece) lower-case and strip accents")
    p.add_argument("--score", choices=("gain", "ratio"), default=None,
                   help="(wordpiece) merge score: gain = likelihood gain of the merge (default), "
                        "ratio = count(ab)/(count(a)*count(b)), the textbook score")
    p.add_argument("--encoding", type=encoding_flag, default="utf-8",
                   help="encoding of the input files (e.g. latin-1)")
    p.set_defaults(func=run_train, out_kind=("tokenizer.json", "tokenizer"))


def _register_encode(tsub) -> None:
    """`lmlab tokenizer encode`: tokens and ids of a text or of every line of a file."""
    p = add_command(
        tsub,
        "encode",
        "segment text with a trained tokenizer",
        "Print the tokens and ids of a text, or the ids of every line of a file.",
        '  lmlab tokenizer encode --tokenizer tok/ --text "Hello world"\n'
        "  lmlab tokenizer encode --tokenizer tok/ --input notes.txt --format ids > ids.txt",
    )
    p.add_argument(
        "--tokenizer", type=path_flag, required=True, metavar="PATH",
        help="tokenizer directory, tokenizer.json or vocab.txt",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to encode")
    src.add_argument("--input", type=path_flag, metavar="FILE", help="encode each line of FILE")
    p.add_argument(
        "--format",
        choices=["pretty", "ids", "tokens", "json"],
        default=None,
        help="output: pretty (tokens and ids, default for --text), ids (one line per input line, "
        "default for --input), tokens, or json",
    )
    p.add_argument(
        "--add-special-tokens", action="store_true", help="wrap with the template, e.g. [CLS] ... [SEP]"
    )
    p.set_defaults(func=run_encode)


def _register_decode(tsub) -> None:
    """`lmlab tokenizer decode`: token ids back to text."""
    p = add_command(
        tsub,
        "decode",
        "turn token ids back into text",
        "Decode a whitespace-separated list of token ids with a trained tokenizer.",
        "  lmlab tokenizer decode --tokenizer tok/ --ids 464 2068 7586\n"
        "  lmlab tokenizer decode --tokenizer tok/ --ids 2 17 3 --skip-special-tokens",
    )
    p.add_argument(
        "--tokenizer", type=path_flag, required=True, metavar="PATH",
        help="tokenizer directory, tokenizer.json or vocab.txt",
    )
    p.add_argument("--ids", type=flag(TokenIds, comma_ints), nargs="+", required=True,
                   help="token ids, separated by spaces or commas")
    p.add_argument("--skip-special-tokens", action="store_true", help="leave out special tokens like [CLS]")
    p.set_defaults(func=run_decode)


def _register_inspect(tsub) -> None:
    """`lmlab tokenizer inspect`: what a tokenizer contains."""
    p = add_command(
        tsub,
        "inspect",
        "show what a tokenizer contains",
        "Summarise a tokenizer: algorithm, vocabulary size, special tokens, sample entries.",
        "  lmlab tokenizer inspect tok/\n  lmlab tokenizer inspect path/to/vocab.txt",
    )
    p.add_argument("path", type=path_flag, metavar="PATH",
                   help="tokenizer directory, tokenizer.json or vocab.txt")
    p.add_argument(
        "--sample",
        type=text_flag,
        default="The quick brown fox jumps over the lazy dog.",
        help="text to segment as an example",
    )
    p.set_defaults(func=run_inspect)


def run_train(args) -> int:
    from lmlab.tokenizers import DEFAULT_SPECIAL_TOKENS, check_training, sentinel_tokens, train_tokenizer

    files = [check_input_file(f) for f in args.input]
    if args.vocab_size is None and not (args.algo == "bpe" and args.num_merges is not None):
        raise LmlabError(
            "--vocab-size is required", "pass e.g. --vocab-size 8000 (or --num-merges K with --algo bpe)"
        )
    # flags of one algorithm (--num-merges, --score, --lowercase): refused with others by lmlab.cli.flag_rules
    specials = list(DEFAULT_SPECIAL_TOKENS if args.special_tokens is None else args.special_tokens)
    specials += sentinel_tokens(args.sentinels, "--sentinels")  # their count checked first (lmlab.budget)
    options = {}
    if args.num_merges is not None:
        options["num_merges"] = args.num_merges
    if args.algo == "wordpiece":
        options["lowercase"] = args.lowercase
        if args.score is not None:
            options["score"] = args.score
    check_training(args.algo, args.vocab_size, specials, options, where="--")  # as flags, before any work
    texts = chain.from_iterable(require_text(iter_text_lines(f, args.encoding), f) for f in files)
    t0 = time.perf_counter()
    tok = train_tokenizer(
        args.algo,
        texts,
        vocab_size=args.vocab_size,
        special_tokens=specials,
        progress=sys.stderr.isatty(),
        **options,
    )
    elapsed = time.perf_counter() - t0
    out = tok.save(args.out)
    print(f"trained {args.algo} tokenizer: {tok.vocab_size} tokens in {elapsed:.1f}s -> {out}/")
    return 0


def run_encode(args) -> int:
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    if args.text is not None:
        fmt = args.format or "pretty"
        lines = [args.text]
    else:
        fmt = args.format or "ids"
        lines = [line.rstrip("\r\n") for line in iter_text_lines(args.input)]
    for text in lines:
        enc = tok.encode_plus(text, add_special_tokens=args.add_special_tokens)
        if fmt == "ids":
            print(" ".join(map(str, enc.ids)))
        elif fmt == "tokens":
            print(" ".join(enc.tokens))
        elif fmt == "json":
            print(
                json.dumps(
                    {"text": text, "tokens": enc.tokens, "ids": enc.ids, "offsets": enc.offsets},
                    ensure_ascii=False,
                )
            )
        else:
            print(f"{len(enc.ids)} tokens")
            print("tokens: " + " ".join(repr(t) for t in enc.tokens))
            print("ids:    " + " ".join(map(str, enc.ids)))
    return 0


def run_decode(args) -> int:
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    ids = [i for group in args.ids for i in group]  # each argument: one id or comma-separated ids
    print(tok.decode(ids, skip_special_tokens=args.skip_special_tokens))
    return 0


def run_inspect(args) -> int:
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(args.path)
    print(f"algorithm:      {tok.algo}")
    print(f"vocabulary:     {tok.vocab_size} tokens")
    print(f"special tokens: {' '.join(tok.special_tokens) or '(none)'}")
    print(f"roles:          {', '.join(f'{r}={t}' for r, t in tok.roles.items()) or '(none)'}")
    plain = [t for t in tok.vocab if t not in tok.special_tokens]
    print(f"first entries:  {' '.join(repr(t) for t in plain[:12])}")
    print(f"last entries:   {' '.join(repr(t) for t in plain[-12:])}")
    longest = sorted(plain, key=len, reverse=True)[:8]
    print(f"longest:        {' '.join(repr(t) for t in longest)}")
    toks = tok.tokenize(args.sample)
    print(f"example:        {args.sample!r}")
    print(f"  -> {len(toks)} tokens: {' '.join(repr(t) for t in toks)}")
    return 0
