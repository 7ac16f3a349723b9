"""`lmlab align`: preference tuning of a pretrained checkpoint (see lmlab.align, docs/align.md)."""

from __future__ import annotations

import json

from lmlab.cli.common import add_command
from lmlab.config.align import TASKS, AlignConfig
from lmlab.config.flags import (
    MACHINE_FLAGS,
    add_config_flags,
    add_section_flags,
    rule_settings,
    section_settings,
)
from lmlab.values import path_flag

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
(load_model-able, with its tokenizer), eval.json, metrics.jsonl and align.json.

Stopping and resuming (dpo): a DPO run keeps its state beside --out (.OUT.resume/, saved after
every evaluation or every --save-every steps); Ctrl-C or SIGTERM ends it after the step in flight,
its state saved, and the same command with --resume continues exactly where it stopped (the
result equals the uninterrupted run's). A resume with other settings or files is refused.

Settings from a file: --config F.toml reads its [align] table (any setting below, by its field
name: beta, lr, max_steps...); flags given on the command line win over the file, and
--set align.KEY=VALUE wins over both (docs/align.md)."""

EXAMPLES = """\
  lmlab align --method dpo --checkpoint runs/gpt/checkpoints/step_600 --train prefs/train.jsonl \\
      --dev prefs/dev.jsonl --out aligned/gpt --beta 0.1 --lr 5e-5 --epochs 1
  lmlab align --method dpo --task sst2 --checkpoint runs/gpt-imdb --train glue/sst2/train.tsv \\
      --dev glue/sst2/dev.tsv --out aligned/sst2 --max-train-examples 8000 --lr 5e-4
  lmlab align --method rlhf --task sst2 --checkpoint runs/gpt-imdb --train glue/sst2/train.tsv \\
      --dev glue/sst2/dev.tsv --out aligned/sst2-rlhf --max-train-examples 8000 --lr 5e-4 \\
      --sft-steps 400 --reward-steps 300 --reward-lr 5e-4 --max-steps 200 --max-new-tokens 1 --beta 1
  lmlab align --checkpoint runs/gpt --train prefs/train.jsonl --dev prefs/dev.jsonl --out aligned/gpt \\
      --config dpo.toml --set align.beta=0.2
  lmlab align ... --out aligned/gpt --resume      # continue an interrupted DPO run"""


#: AlignConfig field -> its flag's help (and argparse settings); type, range, choices and default come
#: from the field itself (lmlab.config.flags)
RUN_FLAGS: dict[str, str | dict] = {
    "method": "dpo: Direct Preference Optimization; rlhf: reward model, then policy gradient",
    "task": {"help": "read --train/--dev as this task's labelled files: the right answer is preferred",
             "choices": TASKS},
}
PREFERENCE_FLAGS: dict[str, str | dict] = {
    "beta": {"help": "dpo: how far from the reference (larger = closer); rlhf: weight of the KL penalty",
             "metavar": "B"},
    "loss": "dpo: DPO's loss or IPO's",
    "label_smoothing": {"help": "dpo sigmoid: assumed share of flipped preferences (conservative DPO)",
                        "metavar": "F"},
    "max_length": {"help": "tokens per prompt + response", "metavar": "N"},
    "eos": {"action": "store_true", "help": "end decoder responses with the EOS token"},
    "dropout": {"action": "store_true", "help": "keep the policy's dropout on while training"},
}
RLHF_FLAGS: dict[str, str | dict] = {
    "sft_steps": {"help": "supervised steps on the chosen responses first (InstructGPT's step 1)",
                  "metavar": "N"},
    "reward_steps": {"help": "reward-model training steps", "metavar": "N"},
    "reward_lr": {"help": "reward-model learning rate", "metavar": "LR"},
    "samples": {"help": "responses sampled per prompt (their mean reward is the baseline)", "metavar": "N"},
    "max_new_tokens": {"help": "longest sampled response", "metavar": "N"},
    "temperature": {"help": "sampling temperature", "metavar": "T"},
}
TRAINING_FLAGS: dict[str, str | dict] = {
    "lr": {"help": "peak learning rate", "metavar": "LR"},
    "batch_size": {"help": "pairs (rlhf: prompts) per micro-batch", "metavar": "N"},
    "grad_accum": {"help": "micro-batches per optimizer step", "metavar": "N"},
    "eval_batch_size": {"help": "pairs per batch when scoring --dev", "metavar": "N"},
    "epochs": {"help": "passes over --train", "metavar": "N"},
    "max_steps": {"help": "optimizer steps (overrides --epochs)", "metavar": "N"},
    "eval_every": {"help": "evaluate on --dev every N steps (default: 10 times per run)", "metavar": "N"},
    "save_every": {"help": "dpo: write the resume state every N steps (default: after each evaluation)",
                   "metavar": "N"},
    "warmup_ratio": {"help": "share of steps spent warming up", "metavar": "F"},
    "weight_decay": {"help": "AdamW's decoupled weight decay", "metavar": "W"},
    "grad_clip": {"help": "max gradient norm (0 = off)", "metavar": "NORM"},
    "seed": {"help": "seed of the shuffling, dropout and sampling", "metavar": "N"},
    "max_train_examples": {"help": "use the first N pairs only", "metavar": "N"},
    "max_eval_examples": {"help": "use the first N pairs only", "metavar": "N"},
    **MACHINE_FLAGS,
    "on_bad_line": "a malformed data line stops the run (error) or is reported and left out (skip)",
}
#: AlignConfig fields without a flag of their own, and why
NO_FLAG = {
    "betas": "AdamW's betas rarely change; set them in --config or --set",
    "log_every": "how often a metrics row is written; set it in --config or --set",
}


def register(sub) -> None:
    p = add_command(sub, "align", "preference-tune a checkpoint (DPO, RLHF)", DESCRIPTION, EXAMPLES)
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="pretrained decoder or encoder-decoder (or a pretraining run directory)")
    p.add_argument("--train", type=path_flag, required=True, metavar="FILE",
                   help="training pairs (JSON Lines) or task file")
    p.add_argument("--dev", type=path_flag, required=True, metavar="FILE",
                   help="held-out pairs, scored during training")
    p.add_argument("--out", type=path_flag, required=True, metavar="DIR",
                   help="directory for the tuned model")
    p.add_argument("--tokenizer", type=path_flag, metavar="PATH",
                   help="the tokenizer, for a checkpoint saved without one (checked against the model: "
                        "see docs/generate.md)")
    p.add_argument("--resume", action="store_true",
                   help="dpo: continue the interrupted run that was writing --out (stopped by Ctrl-C, "
                        "SIGTERM or a crash), exactly where its last resume state left it")
    add_config_flags(p, "align", "[align] beta = 0.2")
    add_section_flags(p, AlignConfig, RUN_FLAGS)
    add_section_flags(p.add_argument_group("preference"), AlignConfig, PREFERENCE_FLAGS)
    add_section_flags(p.add_argument_group("rlhf"), AlignConfig, RLHF_FLAGS)
    add_section_flags(p.add_argument_group("training"), AlignConfig, TRAINING_FLAGS)
    p.set_defaults(func=run, out_kind=("align.json", "aligned model"),
                   rule_settings=rule_settings(AlignConfig, "align"))


def run(args) -> int:
    hparams = section_settings(AlignConfig, "align", args)  # every value checked before any model is read
    from lmlab.align import align

    result = align(args.checkpoint, args.train, args.dev, args.out, tokenizer=args.tokenizer,
                   resume=args.resume, **hparams)
    print(json.dumps({"start": result.start, "dev": result.metrics}, indent=2))
    return 0
