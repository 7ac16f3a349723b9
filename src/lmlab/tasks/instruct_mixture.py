"""A FLAN-style instruction mixture from labelled tasks (Wei et al. 2022, "Finetuned Language
Models Are Zero-Shot Learners", sec. 2).

Each task is phrased as instructions by several templates that name the answer options, in varied
words (``yes``/``no``, ``true``/``false``, ``similar``/``different``...: a model must read them
from the instruction); the last template of every task is **held out** (never trained on), and one
whole task is **held out**
(never seen in training) to measure zero-shot transfer, FLAN's evaluation. From the GLUE files
under ``$LMLAB_DATA/glue`` (read with lmlab's own task readers):

==========  =================================  ====================  ====================
task        input                              options               splits (train / eval)
==========  =================================  ====================  ====================
sst2        a movie-review sentence            negative, positive    train.tsv / dev.tsv
cola        a sentence                         yes/no, correct/...   train.tsv / dev_in_domain
rte         premise + hypothesis               yes/no, true/false..  train.tsv / dev.tsv
stsb        two sentences                      yes/no, similar/...   train.tsv / dev.tsv
mrpc        two news sentences                 yes/no, same/...      (none) / dev.tsv
==========  =================================  ====================  ====================

MRPC (paraphrase) is for research use only, so it is not in the default task list
(:data:`TASK_NAMES`) and is offered only as a held-out evaluation task, read from
``$LMLAB_DATA`` at run time (``build_mixture(..., held_out_task="mrpc")``). Records are
``{instruction, input, output, options, task, template, label}`` (``label``: the dataset's
own); :func:`build_mixture` writes
``train.jsonl`` / ``dev.jsonl`` (training tasks, training templates; dev from the evaluation
split), ``heldout_templates.jsonl`` (training tasks, held-out templates, evaluation split),
``heldout_task.jsonl`` (the held-out task, every template, evaluation split) and
``mixture.json`` (what was built). The mixture is made at run time from the data and never
committed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab import values
from lmlab.arguments import number_argument
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, write_json

MANIFEST = "mixture.json"


@dataclass(frozen=True)
class TaskSpec:
    files: tuple[str, str]                  # train, evaluation file (relative to glue/<task>)
    options: dict[str, str]                 # label -> answer word
    templates: tuple[str, ...]              # instructions; the last one is held out
    pair: bool = False                      # input = two texts
    threshold: float | None = None          # regression: label = score >= threshold
    words: dict[int, dict[str, str]] = dataclasses.field(default_factory=dict)  # template -> other words
    held_out_only: bool = False             # no training split here: only a held-out task

    def answer_words(self, template: int) -> dict[str, str]:
        """label -> answer word under ``template`` (the words its instruction names)."""
        return self.words.get(template, self.options)


SPECS: dict[str, TaskSpec] = {
    "sst2": TaskSpec(("train.tsv", "dev.tsv"), {"0": "negative", "1": "positive"}, (
        "Is the sentiment of this movie review positive or negative?",
        "Read the review and say whether the reviewer liked the movie. Answer positive or negative.",
        "Classify the opinion expressed in the text as positive or negative.",
        "What is the tone of the following sentence? Options: positive, negative.",
        "Does this sentence express a negative or a positive feeling about the film?",
    )),
    "cola": TaskSpec(("train.tsv", "dev_in_domain.tsv"), {"0": "no", "1": "yes"}, (
        "Is the following sentence grammatically acceptable English? Answer yes or no.",
        "Would a native speaker accept this sentence as grammatical? Options: yes, no.",
        "Check the grammar of the sentence. Is it correct or incorrect?",
        "Is this sentence acceptable or unacceptable as English?",
        "Is this a grammatical English sentence? yes or no?",
    ), words={2: {"0": "incorrect", "1": "correct"}, 3: {"0": "unacceptable", "1": "acceptable"}}),
    "rte": TaskSpec(("train.tsv", "dev.tsv"), {"entailment": "yes", "not_entailment": "no"}, (
        "Does the first sentence imply the second one? Answer yes or no.",
        "Premise and hypothesis follow. Is the hypothesis true or false given the premise?",
        "Read the passage. Can we conclude the last sentence from it? Reply yes or no.",
        "Is the second statement right or wrong, judging by the first?",
        "Given the first text, must the second text be true? yes or no?",
    ), pair=True, words={1: {"entailment": "true", "not_entailment": "false"},
                         3: {"entailment": "right", "not_entailment": "wrong"}}),
    "stsb": TaskSpec(("train.tsv", "dev.tsv"), {"0": "no", "1": "yes"}, (
        "Do these two sentences mean roughly the same thing? Answer yes or no.",
        "Are the two sentences similar or different in meaning?",
        "Read both sentences. Do they say nearly the same? Reply yes or no.",
        "Do the two sentences say the same thing or something different? Answer same or different.",
        "Do the sentences below express similar meanings? yes or no?",
    ), pair=True, threshold=3.0, words={1: {"0": "different", "1": "similar"},
                                        3: {"0": "different", "1": "same"}}),
    "mrpc": TaskSpec(("", "dev.tsv"), {"0": "no", "1": "yes"}, (
        "Is the second sentence a paraphrase of the first? Answer yes or no.",
        "Two sentences from news articles follow. Do they report the same fact? yes or no?",
        "Could one of these sentences replace the other without changing the meaning? Reply yes or no.",
        "Is the meaning of the two sentences equivalent or different?",
        "Do these sentences paraphrase each other? Answer paraphrase or different.",
    ), pair=True, held_out_only=True, words={3: {"0": "different", "1": "equivalent"},
                                             4: {"0": "different", "1": "paraphrase"}}),
}
#: the tasks a mixture trains on by default (MRPC is research-only: held out by name only)
TASK_NAMES = tuple(t for t, spec in SPECS.items() if not spec.held_out_only)


def read_task(data_dir: Path, task: str, split: int) -> list[tuple[str, str]]:
    """``(input text, label)`` of every example of one split (0 train, 1 evaluation)."""
    from lmlab.tasks import make_task

    spec = SPECS[task]
    path = data_dir / "glue" / task / spec.files[split]
    out = []
    for e in make_task(task).read(path):
        text = f"{e.text}\n{e.pair}" if spec.pair else e.text
        label = str(int(float(e.label) >= spec.threshold)) if spec.threshold is not None else str(e.label)
        out.append((text, label))
    return out


def records(task: str, examples: list[tuple[str, str]], templates: list[int]) -> list[dict[str, Any]]:
    """One record per (example, template) with the template chosen round-robin over ``templates``."""
    spec = SPECS[task]
    out = []
    for i, (text, label) in enumerate(examples):
        t = templates[i % len(templates)]
        words = spec.answer_words(t)
        out.append({"instruction": spec.templates[t], "input": text, "output": words[label],
                    "options": sorted(set(words.values())), "task": task, "template": t, "label": label})
    return out


def build_mixture(data_dir: str | os.PathLike, out: str | os.PathLike, held_out_task: str = "sst2",
                  tasks: tuple[str, ...] | None = None, per_task: int | dict[str, int] = 2000,
                  eval_per_task: int = 200, seed: int = 0) -> dict[str, Any]:
    """Write the mixture into the directory ``out`` (replaced only if it is an earlier mixture);
    returns the manifest. ``per_task`` training examples per task (FLAN caps each task so the
    large ones do not swamp the rest; a dict gives each trained task its own cap),
    ``eval_per_task`` per evaluation file and task."""
    tasks = tuple(tasks or TASK_NAMES)
    unknown = [t for t in (*tasks, held_out_task) if t not in SPECS]
    if unknown:
        raise LmlabError(f"no instruction templates for task(s) {unknown}", f"choose from {', '.join(SPECS)}")
    if held_out_task not in tasks:
        tasks = (*tasks, held_out_task)
    trained = [t for t in tasks if t != held_out_task]
    if not trained:
        raise LmlabError("every task is held out: nothing to train on", "name at least two tasks")
    eval_only = [t for t in trained if SPECS[t].held_out_only]
    if eval_only:
        raise LmlabError(f"task(s) {eval_only} can only be held out (research-use data: no training split)",
                         f"drop them from the trained tasks, or hold one out: held_out_task={eval_only[0]!r}")
    caps = per_task if isinstance(per_task, dict) else {t: per_task for t in trained}
    if sorted(caps) != sorted(trained):
        raise LmlabError(f"per_task names {sorted(caps)}, but the trained tasks are {sorted(trained)}",
                         "give one cap for every trained task, or a single number")
    for n, name in [*((caps[t], f"per_task[{t!r}]") for t in trained), (eval_per_task, "eval_per_task")]:
        number_argument(values.Count, n, name)
    data_dir = Path(data_dir)
    files: dict[str, list[dict[str, Any]]] = {k: [] for k in ("train", "dev", "heldout_templates",
                                                              "heldout_task")}
    for task in tasks:
        n_templates = len(SPECS[task].templates)
        seen, unseen = list(range(n_templates - 1)), [n_templates - 1]
        rng = random.Random(f"{seed}:{task}")      # a task's sample does not depend on the other tasks
        evaluation = read_task(data_dir, task, 1)
        rng.shuffle(evaluation)
        evaluation = evaluation[:eval_per_task]
        if task == held_out_task:
            files["heldout_task"] += records(task, evaluation, seen + unseen)
            continue
        train = read_task(data_dir, task, 0)
        rng.shuffle(train)
        files["train"] += records(task, train[:caps[task]], seen)
        files["dev"] += records(task, evaluation[: max(1, eval_per_task // 4)], seen)
        files["heldout_templates"] += records(task, evaluation, unseen)
    random.Random(seed).shuffle(files["train"])
    manifest = {"held_out_task": held_out_task, "trained_tasks": trained,
                "held_out_templates": {t: SPECS[t].templates[-1] for t in trained},
                "per_task": per_task, "eval_per_task": eval_per_task, "seed": seed,
                "counts": {k: len(v) for k, v in files.items()}}
    with atomic_dir(out, marker=MANIFEST, what="mixture") as tmp:
        for name, recs in files.items():
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
        write_json(tmp / MANIFEST, manifest)
    return manifest
