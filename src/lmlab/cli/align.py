"""`lmlab align`: preference tuning of a pretrained checkpoint (see lmlab.align, docs/align.md)."""

from __future__ import annotations

import json

from lmlab.align.config import Length
from lmlab.cli.common import add_command
from lmlab.values import (
    Fraction,
    LabelSmoothing,
    PositiveWeight,
    batch_flag,
    count_flag,
    device_flag,
    flag,
    grad_clip_flag,
    lr_flag,
    path_flag,
    seed_flag,
    size_flag,
    temperature_flag,
    threads_flag,
    weight_decay_flag,
)

DESCRIPTION = """\
Preference-tune a decoder or encoder-decoder checkpoint on pairs of responses to a prompt, one
preferred to the other, and write the tuned model to --out.

Data: JSON Lines, one {"prompt": ..., "chosen": ..., "rejected": ...} per line (start each
response with the space that separates it from the prompt), or, with --task, a labelled GLUE
file whose right answer is preferred to the wrong one (SST-2: "Review: <sentence>\\nSentiment:",
chosen " positive", rejected " negative").

Methods:
  dpo   Direct Preference Optimization (Rafailov et al. 2023): raise the policy's log-probability
        of the chosen response relative to a frozen copy of the starting model (the reference)
        more than the rejected one's; --beta (default 0.1) keeps it close to the reference.
  rlhf  InstructGPT's recipe for decoders: an optional supervised warm-up on the chosen
        responses (--sft-steps), a reward model trained on the pairs (Bradley-Terry), then the
        policy trained on its own samples to raise that reward (REINFORCE with a leave-one-out
        baseline and a KL penalty to the reference weighted by --beta).

The dev pairs are scored at step 0 (the reference itself: margin 0, win rate 0), during training
and at the end: the implicit reward margin beta*[(log pi(c) - log pi_ref(c)) - (log pi(r) -
log pi_ref(r))], the win rate (pairs with a positive margin), the policy's accuracy (chosen
likelier than rejected) and, for rlhf, the reward of sampled responses. --out receives the model
(load_model-able, with its tokenizer), eval.json, metrics.jsonl and align.json."""

EXAMPLES = """\
  lmlab align --method dpo --checkpoint runs/gpt/checkpoints/step_600 --train prefs/train.jsonl \\
      --dev prefs/dev.jsonl --out aligned/gpt --beta 0.1 --lr 5e-5 --epochs 1
  lmlab align --method dpo --task sst2 --checkpoint runs/gpt-imdb --train glue/sst2/train.tsv \\
      --dev glue/sst2/dev.tsv --out aligned/sst2 --max-train-examples 8000 --lr 5e-4
  lmlab align --method rlhf --task sst2 --checkpoint runs/gpt-imdb --train glue/sst2/train.tsv \\
      --dev glue/sst2/dev.tsv --out aligned/sst2-rlhf --max-train-examples 8000 --lr 5e-4 \\
      --sft-steps 400 --reward-steps 300 --reward-lr 5e-4 --max-steps 200 --max-new-tokens 1 --beta 1"""


def register(sub) -> None:
    p = add_command(sub, "align", "preference-tune a checkpoint (DPO, RLHF)", DESCRIPTION, EXAMPLES)
    p.add_argument("--method", choices=("dpo", "rlhf"), default="dpo", help="dpo or rlhf")
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="pretrained decoder or encoder-decoder (or a pretraining run directory)")
    p.add_argument("--train", type=path_flag, required=True, metavar="FILE",
                   help="training pairs (JSON Lines) or task file")
    p.add_argument("--dev", type=path_flag, required=True, metavar="FILE",
                   help="held-out pairs, scored during training")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="directory for the tuned model")
    p.add_argument("--task", choices=("sst2", "cola", "rte", "mrpc"), default=None,
                   help="read --train/--dev as this task's labelled files: the right answer is preferred")
    p.add_argument("--tokenizer", type=path_flag, metavar="PATH",
                   help="tokenizer to use instead of the checkpoint's own")
    g = p.add_argument_group("preference")
    g.add_argument("--beta", type=flag(PositiveWeight), default=0.1,
                   help="dpo: how far from the reference (larger = closer); rlhf: weight of the KL penalty")
    g.add_argument("--loss", choices=("sigmoid", "ipo"), default="sigmoid", help="dpo: DPO's loss or IPO's")
    g.add_argument("--label-smoothing", type=flag(LabelSmoothing), default=0.0,
                   help="dpo sigmoid: assumed share of flipped preferences (conservative DPO)")
    g.add_argument("--max-length", type=flag(Length), default=256, metavar="N",
                   help="tokens per prompt + response")
    g.add_argument("--eos", action="store_true", help="end decoder responses with the EOS token")
    g.add_argument("--dropout", action="store_true", help="keep the policy's dropout on while training")
    r = p.add_argument_group("rlhf")
    r.add_argument("--sft-steps", type=size_flag, default=0, metavar="N",
                   help="supervised steps on the chosen responses first (InstructGPT's step 1)")
    r.add_argument("--reward-steps", type=count_flag, default=200, metavar="N",
                   help="reward-model training steps")
    r.add_argument("--reward-lr", type=lr_flag, default=1e-4, help="reward-model learning rate")
    r.add_argument("--samples", type=batch_flag, default=4, metavar="N",
                   help="responses sampled per prompt (their mean reward is the baseline)")
    r.add_argument("--max-new-tokens", type=count_flag, default=8, metavar="N",
                   help="longest sampled response")
    r.add_argument("--temperature", type=temperature_flag, default=1.0, help="sampling temperature")
    t = p.add_argument_group("training")
    t.add_argument("--lr", type=lr_flag, default=5e-5, help="peak learning rate")
    t.add_argument("--batch-size", type=batch_flag, default=16, metavar="N",
                   help="pairs (rlhf: prompts) per micro-batch")
    t.add_argument("--grad-accum", type=count_flag, default=1, metavar="N",
                   help="micro-batches per optimizer step")
    t.add_argument("--eval-batch-size", type=batch_flag, default=32, metavar="N",
                   help="pairs per batch when scoring --dev")
    t.add_argument("--epochs", type=count_flag, default=1, metavar="N", help="passes over --train")
    t.add_argument("--max-steps", type=count_flag, default=None, metavar="N",
                   help="optimizer steps (overrides --epochs)")
    t.add_argument("--eval-every", type=count_flag, default=None, metavar="N",
                   help="evaluate on --dev every N steps (default: 10 times per run)")
    t.add_argument("--warmup-ratio", type=flag(Fraction), default=0.1, help="share of steps spent warming up")
    t.add_argument("--weight-decay", type=weight_decay_flag, default=0.0,
                   help="AdamW's decoupled weight decay")
    t.add_argument("--grad-clip", type=grad_clip_flag, default=1.0, help="max gradient norm (0 = off)")
    t.add_argument("--seed", type=seed_flag, default=0, help="seed of the shuffling, dropout and sampling")
    for which in ("train", "eval"):
        t.add_argument(f"--max-{which}-examples", type=count_flag, default=None, metavar="N",
                       help="use the first N pairs only")
    t.add_argument("--device", type=device_flag, default="auto", help="auto, cpu, cuda, cuda:1...")
    t.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: bf16 autocast on a CUDA GPU with bfloat16, fp32 elsewhere")
    t.add_argument("--threads", type=threads_flag, default=None, metavar="N", help="torch CPU threads")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--on-bad-line", choices=("error", "skip"), default="error",
                   help="a malformed data line stops the run (error) or is reported and left out (skip)")
    p.set_defaults(func=run, out_kind=("align.json", "aligned model"))


HPARAMS = ("method", "task", "beta", "loss", "label_smoothing", "max_length", "eos", "dropout",
           "sft_steps", "reward_steps", "reward_lr", "samples", "max_new_tokens", "temperature", "lr",
           "batch_size", "grad_accum", "eval_batch_size", "epochs", "max_steps", "eval_every", "warmup_ratio",
           "weight_decay", "grad_clip", "seed", "max_train_examples", "max_eval_examples", "device",
           "precision", "threads", "on_bad_line")


def run(args) -> int:
    from lmlab.align import align

    hparams = {k: getattr(args, k) for k in HPARAMS}
    result = align(args.checkpoint, args.train, args.dev, args.out, tokenizer=args.tokenizer,
                   progress=not args.no_progress, **hparams)
    print(json.dumps({"start": result.start, "dev": result.metrics}, indent=2))
    return 0
