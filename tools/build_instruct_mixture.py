"""Build the FLAN-style instruction mixture (lmlab.tasks.instruct_mixture) from $LMLAB_DATA/glue.

Each GLUE task becomes instructions with five templates (the last held out); one whole task
(default sst2) is held out for zero-shot evaluation. The mixture is derived data: write it
outside the repository (it is never committed).

    python tools/build_instruct_mixture.py --out /tmp/mixture                 # sst2 held out
    python tools/build_instruct_mixture.py --out /tmp/mixture --held-out rte --per-task 500
    lmlab finetune --checkpoint ck/gpt --task instruct --train /tmp/mixture/train.jsonl \\
        --dev /tmp/mixture/dev.jsonl --out ft/gpt-instruct
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lmlab.errors import LmlabError
from lmlab.tasks.instruct_mixture import SPECS, TASK_NAMES, build_mixture


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("LMLAB_DATA", "../shared/data"), metavar="DIR",
                   help="data directory holding glue/ (default: $LMLAB_DATA)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="directory to write (an earlier mixture is replaced)")
    p.add_argument("--held-out", default="sst2", choices=list(SPECS),
                   help="task kept out of training (mrpc: held out only)")
    p.add_argument("--tasks", nargs="+", default=None, choices=TASK_NAMES, help="tasks to use (default: all)")
    p.add_argument("--per-task", type=int, default=2000, metavar="N", help="training examples per task")
    p.add_argument("--eval-per-task", type=int, default=200, metavar="N",
                   help="evaluation examples per task")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        tasks = tuple(args.tasks) if args.tasks else None
        manifest = build_mixture(args.data, args.out, args.held_out, tasks, args.per_task, args.eval_per_task,
                                 args.seed)
    except LmlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(manifest["counts"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
