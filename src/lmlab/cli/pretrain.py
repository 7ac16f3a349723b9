"""`lmlab pretrain`: train a model from a recipe (see docs/training.md)."""

from __future__ import annotations

from lmlab.cli.common import add_command, is_main_process
from lmlab.values import path_flag


def register(sub) -> None:
    p = add_command(
        sub,
        "pretrain",
        "pretrain a model from a TOML recipe",
        "Pretrain a model as a recipe says: tokenizer, packed token shards, objective, AdamW with\n"
        "warmup and decay, periodic evaluation, atomic checkpoints. RUN_DIR receives config.toml,\n"
        "metrics.jsonl, loss.png, summary.json and checkpoints/step_N/ (each loadable with\n"
        "lmlab.loading.load_model). The same command under torchrun trains with DDP.",
        "  lmlab pretrain --config configs/gpt-tiny-clm.toml --out runs/gpt\n"
        "  lmlab pretrain --config configs/gpt-tiny-clm.toml --out runs/gpt \\\n"
        "      --set train.max_steps=100 train.lr=1e-3\n"
        "  lmlab pretrain --out runs/gpt --resume --set train.max_steps=1200    # continue a run\n"
        "  torchrun --nproc_per_node=2 -m lmlab.cli pretrain --config configs/gpt-tiny-clm.toml \\\n"
        "      --out runs/ddp",
    )
    p.add_argument("--config", type=path_flag,
                   help="recipe TOML file (optional with --resume: the run's own config.toml)")
    p.add_argument("--out", type=path_flag, required=True, help="run directory")
    p.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override recipe keys, e.g. train.max_steps=100 data.train=shards/",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from the newest complete checkpoint in --out"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from lmlab.train import pretrain

    summary = pretrain(args.config, args.out, overrides=args.overrides, resume=args.resume)
    if not is_main_process():  # torchrun: rank 0 says it
        return 0
    vtxt = f"; {summary['val']}" if summary.get("val") else ""
    print(
        f"trained {summary['steps']} steps, {summary['tokens']:,} tokens in {summary['seconds']:.0f}s: "
        f"train loss {summary['train_loss']:.4f}{vtxt}; run in {args.out}/"
    )
    if summary.get("checkpoint"):
        print(f"checkpoint: {summary['checkpoint']} "
              f"(generate, export, finetune and probe also accept {args.out})")
    return 0
