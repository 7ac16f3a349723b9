"""`lmlab data prepare` (placeholder registration; implemented in lmlab.data)."""

from __future__ import annotations

from lmlab.cli.common import add_command, add_group


def register(sub) -> None:
    _, dsub = add_group(sub, "data", "turn text into token shards for training",
                        "Prepare training data. Run `lmlab data COMMAND --help` for details.")
    p = add_command(dsub, "prepare", "tokenize text files into memory-mapped shards",
                    "Tokenize text files into uint16/uint32 token shards plus a JSON index.",
                    "  lmlab data prepare --tokenizer tok/ --input a.txt b.txt --out shards/ --val-fraction 0.01")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--input", nargs="+", required=True, metavar="FILE")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--val-fraction", type=float, default=0.0)
    p.set_defaults(func=run)


def run(args) -> int:
    raise NotImplementedError
