"""`lmlab demo`."""

from __future__ import annotations

from lmlab.cli.common import add_command


def register(sub) -> None:
    p = add_command(sub, "demo", "run the built-in end-to-end example",
                    "Train a tokenizer on the built-in Shakespeare corpus (public domain) and show what it\n"
                    "learned: vocabulary size, compression in bytes per token, a segmented example.",
                    "  lmlab demo\n  lmlab demo --vocab-size 4000 --out runs/my-demo")
    p.add_argument("--out", default="runs/demo", help="where to write the demo's artifacts")
    p.add_argument("--vocab-size", type=int, default=2000, help="tokenizer vocabulary size")
    p.add_argument("--algo", default="bytelevel", choices=["bpe", "bytelevel", "wordpiece", "unigram"],
                   help="tokenizer algorithm")
    p.set_defaults(func=run)


def run(args) -> int:
    from lmlab.demo import run_demo

    run_demo(args.out, args.vocab_size, args.algo)
    return 0
