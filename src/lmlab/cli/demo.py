"""`lmlab demo`."""

from __future__ import annotations

from lmlab.cli.common import add_command
from lmlab.tokenizers import ALGORITHMS
from lmlab.values import count_flag, device_flag, path_flag, text_flag


def register(sub) -> None:
    p = add_command(
        sub,
        "demo",
        "run the built-in end-to-end example",
        "The whole job on the built-in Shakespeare corpus (public domain), in a few minutes on\n"
        "2 CPU cores: train a byte-level BPE tokenizer and show what it learned, pretrain a tiny\n"
        "GPT-2 with a progress bar (validation loss before and after), then sample from it.",
        "  lmlab demo\n  lmlab demo --steps 500 --out runs/my-demo\n"
        "  lmlab demo --vocab-size 4000 --prompt 'JULIET:'",
    )
    p.add_argument("--out", type=path_flag, default="runs/demo", help="where to write the demo's artifacts")
    p.add_argument("--vocab-size", type=count_flag, default=2000, help="tokenizer vocabulary size")
    p.add_argument(
        "--algo",
        default="bytelevel",
        choices=list(ALGORITHMS),
        help="tokenizer algorithm",
    )
    p.add_argument("--steps", type=count_flag, default=300, help="pretraining steps (8 x 128 tokens each)")
    p.add_argument("--prompt", type=text_flag, default="ROMEO:", help="text the sample continues")
    p.add_argument("--device", type=device_flag, default="auto",
                   help="where to pretrain and sample: auto (a GPU when there is one), cpu, cuda, cuda:1...")
    p.set_defaults(func=run)


def run(args) -> int:
    from lmlab.demo import run_demo
    from lmlab.tokenizers import check_training

    check_training(args.algo, args.vocab_size, None, {}, where="--")  # as --vocab-size, before any work
    run_demo(args.out, args.vocab_size, args.algo, steps=args.steps, prompt=args.prompt, device=args.device)
    return 0
