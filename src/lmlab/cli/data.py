"""`lmlab data prepare`: tokenize text files into memory-mapped token shards (see lmlab.data)."""

from __future__ import annotations

from lmlab import values
from lmlab.cli.common import add_command, add_group
from lmlab.values import (
    encoding_flag,
    fraction_flag,
    path_flag,
    seed_flag,
    text_flag,
    workers_flag,
)

DESCRIPTION = """\
Tokenize text files into flat token shards for training: uint16 ids when the vocabulary has at
most 65,536 tokens, else uint32, cut into train_000.bin, train_001.bin, ... and val_000.bin, ...
Next to them: train_docs.npy / val_docs.npy (int64 start offset of every document, so packing can
keep attention inside documents), index.json (dtype, vocabulary size, tokenizer hash, per-split
documents, tokens and UTF-8 bytes for bits-per-byte) and tokenizer/ (a copy of the tokenizer).

Each file is split into documents (blank-line separated paragraphs by default); a seeded hash of
each document's text sends it to val with probability --val-fraction, so runs are reproducible and
the output does not depend on --workers. The output directory is written atomically: a failed run
leaves no directory, or the previous one untouched. Read the result with
lmlab.data.TokenShards(DIR, split="train")."""

EXAMPLES = """\
  lmlab data prepare --tokenizer tok/ --input a.txt b.txt --out shards/ --val-fraction 0.01
  lmlab data prepare --tokenizer tok/ --input books/*.txt --out shards/ --val-fraction 0.05 --encoding latin-1
  lmlab data prepare --tokenizer tok/ --input lines.txt --out shards/ --val-fraction 0.1 \\
      --doc-separator line --append-eos"""


def register(sub) -> None:
    from lmlab.data.options import DEFAULT_SHARD_TOKENS, DOC_SEPARATORS, default_workers

    _, dsub = add_group(sub, "data", "turn text into token shards for training",
                        "Prepare training data. Run `lmlab data COMMAND --help` for details.")
    p = add_command(dsub, "prepare", "tokenize text files into memory-mapped shards", DESCRIPTION, EXAMPLES)
    p.add_argument("--tokenizer", type=path_flag, required=True, metavar="PATH",
                   help="tokenizer directory (from `lmlab tokenizer train`), tokenizer.json or vocab.txt")
    p.add_argument("--input", type=path_flag, nargs="+", required=True, metavar="FILE",
                   help="text, JSON Lines (.jsonl, .jsonl.gz, .jsonl.zst) or Parquet files, or datasets "
                        "save_to_disk folders, to tokenize")
    p.add_argument("--text-field", type=text_flag, default="text", metavar="NAME",
                   help="JSON Lines / Parquet: the field (column) that holds each record's text")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="output directory (created atomically; an existing shards directory is replaced)")
    p.add_argument("--val-fraction", type=fraction_flag, default=0.0, metavar="F",
                   help="fraction of documents sent to the val split, in [0, 1)")
    p.add_argument("--workers", type=workers_flag, default=default_workers(), metavar="N",
                   help="tokenizer processes, each loading the tokenizer once (min(2, CPUs) by default)")
    p.add_argument("--encoding", type=encoding_flag, default="utf-8",
                   help="encoding of the input files (e.g. latin-1)")
    p.add_argument("--shard-tokens", type=values.flag(values.ShardTokens), default=DEFAULT_SHARD_TOKENS,
                   metavar="N", help="maximum tokens per shard file (at least 2**20 = 1,048,576)")
    p.add_argument("--doc-separator", choices=DOC_SEPARATORS, default="blank-line",
                   help="what makes a document: blank-line separated paragraphs, each non-blank line, "
                        "or each whole file")
    p.add_argument("--seed", type=seed_flag, default=0,
                   help="seed of the hash that assigns documents to train/val")
    p.add_argument("--append-eos", action="store_true",
                   help="append the tokenizer's end-of-sequence token to every document")
    p.set_defaults(func=run, out_kind=("index.json", "token-shards"))


def run(args) -> int:
    from lmlab.data.prepare import prepare_shards

    summary = prepare_shards(args.tokenizer, args.input, args.out, val_fraction=args.val_fraction,
                             workers=args.workers, encoding=args.encoding, shard_tokens=args.shard_tokens,
                             doc_separator=args.doc_separator, seed=args.seed, append_eos=args.append_eos,
                             text_field=args.text_field)
    print(summary.report())
    return 0
