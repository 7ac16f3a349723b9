"""Score a checkpoint with EleutherAI's lm-evaluation-harness (``lmlab evaluate --harness``).

``run_harness(checkpoint, ["hellaswag", "my_tasks/"])`` loads the checkpoint with
:func:`lmlab.loading.load_model`, wraps it as a harness model (:class:`lmlab.icl.harness_lm.LmlabLM`,
no conversion) and runs ``lm_eval.simple_evaluate`` on the tasks: the harness' own task
definitions, prompts, few-shot sampling and metrics, so the numbers are the ones the harness
reports for any model. A task is a harness task, group or tag name, or a local task YAML file or a
folder of them (read with ``TaskManager(include_path=...)``: a task whose data is a local file
needs no network). Results go to a JSON file beside the checkpoint, ``<checkpoint>.harness.json``
by default, written atomically; an existing file is replaced only when asked (``overwrite``), and
only when it is a results file lmlab wrote there (never the checkpoint's or a task's file, never a
file of yours).

Decoders and LSTM LMs are scored directly. Encoders have no next-token distribution and are
refused; encoder-decoders are refused with the way round: export them (``lmlab export --format
hf``) and run ``lm_eval --model hf --model_args pretrained=DIR,backend=seq2seq``.

Needs ``pip install 'lmlab[eval]'``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError
from lmlab.fileio import json_bytes, write_output_file

EXTRA = "eval"
SUFFIX = ".harness.json"
#: what lmlab records in a folder's manifest for a results file it wrote (:mod:`lmlab.ownership`)
RESULTS_KIND = "harness results"


def check_installed() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise LmlabError("the evaluation harness needs the lm-eval package (lm-evaluation-harness)",
                         f"pip install 'lmlab[{EXTRA}]'")


def default_output(checkpoint: str | os.PathLike) -> Path:
    """``runs/gpt/checkpoints/step_600`` -> ``runs/gpt/checkpoints/step_600.harness.json``."""
    p = Path(checkpoint)
    return p.parent / f"{p.resolve().name}{SUFFIX}"


def check_output(out: Path, overwrite: bool, inputs: dict[str, object] | None = None,
                 flag: str = "--out") -> None:
    """Before any work: the results may go to ``out``. Never over one of the ``inputs`` (the
    checkpoint, the task files: :func:`lmlab.ownership.check_output_spares_inputs`), whatever
    ``overwrite`` says; over an existing file only when it is a results file lmlab wrote there and
    nobody changed since (:mod:`lmlab.ownership`: beside a checkpoint too), never a file of yours,
    and then only with ``overwrite``. ``flag``: how ``out`` is named in errors (``the default
    --out`` when it was derived from the checkpoint, :func:`lmlab.ownership.default_flag`)."""
    from lmlab import ownership

    ownership.check_output_spares_inputs(out, inputs or {}, flag)
    if out.is_dir():
        raise LmlabError(f"the results file {out} is a directory", "pass --out with a file name")
    ownership.check_replaceable_file(out, RESULTS_KIND, flag)  # a file lmlab did not write: never
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise LmlabError(f"{out} already exists (results lmlab wrote)",
                         "pass --overwrite to replace it, or --out another file")


def local_task_paths(tasks: str | Sequence[str]) -> list[Path]:
    """The task files and folders among ``tasks`` (what :func:`resolve_tasks` reads from disk)."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    if not any(str(item).strip() for item in items):
        return []
    return [Path(spec).expanduser() for spec in split_tasks(items) if Path(spec).expanduser().exists()]


def split_tasks(tasks: str | Sequence[str]) -> list[str]:
    """``"a,b"`` or ``["a", "b,c"]`` -> ``["a", "b", "c"]`` (:func:`lmlab.values.comma_list`: an
    empty item is refused, as is a task named twice, which would be scored twice)."""
    from lmlab.values import ListProblem, check_distinct, comma_list

    items = [tasks] if isinstance(tasks, str) else list(tasks)
    fix = "pass e.g. --harness hellaswag,arc_easy or --harness my_task.yaml, each task once"
    if not any(str(item).strip() for item in items):
        raise LmlabError("no harness tasks given", "pass e.g. --harness hellaswag or --harness my_task.yaml")
    try:
        out = [part for item in items for part in comma_list(str(item))]
    except ListProblem as e:
        raise LmlabError(f"--harness {','.join(map(str, items))!r} {e}", fix) from None
    check_distinct(out, "--harness", fix)
    return out


def resolve_tasks(tasks: str | Sequence[str]):
    """``(task names, TaskManager)``: local YAML files and folders become include paths and the
    tasks defined in them; names are checked against the harness' index (one-line errors)."""
    from lm_eval.tasks import TaskManager

    specs = split_tasks(tasks)
    local = {spec: Path(spec).expanduser() for spec in specs
             if Path(spec).expanduser().exists() or spec.endswith((".yaml", ".yml")) or os.sep in spec}
    for spec, path in local.items():
        if not path.exists():
            raise LmlabError(f"task file {spec} does not exist", "pass a task YAML file, a folder of them, "
                             "or a harness task name (lm_eval ls tasks)")
    folders = sorted({str((p if p.is_dir() else p.parent).resolve()) for p in local.values()})
    manager = TaskManager(include_path=folders or None, include_defaults=len(local) < len(specs))
    names: list[str] = []
    for spec in specs:
        if spec not in local:
            if spec not in manager.all_tasks:
                raise LmlabError(f"unknown harness task {spec!r}",
                                 "see `lm_eval ls tasks`, or pass a task YAML file or a folder of them")
            found = [spec]
        else:
            path = local[spec].resolve()
            found = [name for name, entry in manager.task_index.items() if entry.yaml_path is not None
                     and (entry.yaml_path.resolve() == path or path in entry.yaml_path.resolve().parents)]
            if not found:
                raise LmlabError(f"{spec} defines no harness task", "give the YAML a `task: NAME` entry")
        names += [name for name in sorted(found) if name not in names]
    return names, manager


ALLOW_CODE_FIX = "pass --allow-code (allow_code=True) to run it, only for task files you trust"


def check_task_code(names: list[str], manager, allow_code: bool = False) -> None:
    """Refuse local task files that would run Python code (``!function``: doc processing, metrics,
    a task class), unless ``allow_code``: the error names the Python file that would have run.
    Everything ``names`` reaches is read (included YAMLs, a group's tasks, a tag's); the harness'
    own task files are installed code and are not refused."""
    if allow_code:
        return
    found = next(iter(_task_functions(names, manager)), None)
    if found is not None:
        yaml_file, spec = found
        raise LmlabError(f"task file {yaml_file} runs Python code: its `!function {spec}` would run "
                         f"{_function_source(yaml_file, spec)}", ALLOW_CODE_FIX)


def _task_functions(names: list[str], manager):
    """``(task YAML, function spec)`` of every ``!function`` in the local task files that loading
    ``names`` reads, in the order they are reached."""
    import lm_eval.tasks

    builtin = Path(lm_eval.tasks.__file__).parent.resolve()
    index = manager.task_index
    todo, seen = list(names), set()
    while todo:
        name = todo.pop(0)
        entry = index.get(name) if isinstance(name, str) else None
        if name in seen or entry is None:
            continue
        seen.add(name)
        if entry.kind.name == "TAG":
            todo += sorted(entry.tags)
        path = entry.yaml_path.resolve() if entry.yaml_path is not None else None
        if path is None or builtin in path.parents:  # the harness' own tasks: only what they name
            todo += _task_names(entry.cfg or {})
            continue
        for yaml_file, cfg in _yaml_with_includes(path):
            todo += _task_names(cfg)
            yield from ((yaml_file, spec) for spec in _function_specs(cfg))


class _Function(str):
    """The text of a ``!function`` tag, kept apart from plain strings."""


@functools.cache
def _code_finder():
    """A YAML loader that reads a task file as the harness does but keeps ``!function`` tags as
    :class:`_Function` text (nothing imported) and any other tag as its plain data."""
    import yaml

    class CodeFinder(yaml.SafeLoader):
        pass

    def plain(loader, suffix, node):
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node)
        return loader.construct_mapping(node)

    CodeFinder.add_constructor("!function", lambda loader, node: _Function(loader.construct_scalar(node)))
    CodeFinder.add_multi_constructor("", plain)
    return CodeFinder


def _yaml_with_includes(path: Path, seen: set[Path] | None = None):
    """``(file, its parsed YAML)`` for ``path`` and every file it includes (``include:``)."""
    seen = set() if seen is None else seen
    if path in seen or not path.is_file():
        return
    seen.add(path)
    import yaml

    try:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=_code_finder())  # noqa: S506 - no code runs
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise LmlabError(f"task file {path} is not valid YAML ({type(e).__name__})",
                         "fix the file") from None
    yield path, cfg
    includes = cfg.get("include") if isinstance(cfg, dict) else None
    for inc in [includes] if isinstance(includes, str) else includes if isinstance(includes, list) else []:
        if isinstance(inc, str):
            yield from _yaml_with_includes((path.parent / inc).resolve(), seen)


def _walk(value):
    """Every value inside a parsed YAML document, depth first, each container once (YAML aliases
    may repeat one, or make it hold itself)."""
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        if isinstance(v, (dict, list)):
            if id(v) in seen:
                continue
            seen.add(id(v))
            todo += list(v.values()) if isinstance(v, dict) else v
        yield v


def _function_specs(cfg) -> list[str]:
    return [str(v) for v in _walk(cfg) if isinstance(v, _Function)]


def _task_names(cfg) -> list[str]:
    """The task, group and tag names a (group) config refers to: ``task: [name, {task: name}...]``."""
    out = []
    for v in _walk(cfg):
        task = v.get("task") if isinstance(v, dict) else None
        items = task if isinstance(task, list) else [task]
        out += [t for t in items if isinstance(t, str)]
    return out


def _function_source(yaml_file: Path, spec: str) -> str:
    """The Python file the harness runs for ``!function utils.process_docs`` in ``yaml_file``: the
    file beside the YAML when there is one, else the module it would import."""
    module = spec.rpartition(".")[0]
    beside = (yaml_file.parent / f"{module.replace('.', '/')}.py").resolve()
    return str(beside) if beside.is_file() or not module else f"the Python module {module!r}"


def check_tasks_load(names: list[str], manager) -> dict:
    """Build the tasks (their datasets included) once before the model is loaded: a task YAML
    the harness cannot build (no dataset_path, a bad field) is a one-line error, not its traceback.
    Returns the harness's ``{name: task}``."""
    try:
        return manager.load(names).get("tasks", {})
    except Exception as e:  # noqa: BLE001 - whatever the harness or datasets raise for a bad task
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LmlabError(f"the harness could not load the task(s) {', '.join(names)}: {type(e).__name__}: "
                         f"{first}", "check the task YAML (dataset_path, splits, doc_to_text...) "
                         "or the task name") from None


def check_tasks_fewshot(tasks: dict, num_fewshot: int | None) -> None:
    """``--num-fewshot K`` against the documents each task draws its few-shot examples from (its
    fewshot/training/validation split, else its test split), by the ICL rule
    (:func:`lmlab.icl.evaluate.check_fewshot`); the harness would stop on its first prompt with
    'Sample larger than population'."""
    from lmlab.icl.evaluate import check_fewshot, check_fewshot_count

    if num_fewshot is None:  # each task's own setting
        return
    check_fewshot_count(num_fewshot, "run_harness's num_fewshot")
    for name, task in tasks.items():
        if not num_fewshot or not hasattr(task, "fewshot_docs"):
            continue
        try:
            documents = len(task.fewshot_docs())
        except Exception:  # noqa: BLE001 - a pool the harness builds lazily: its own checks apply
            continue
        cfg = getattr(task, "fewshot_cfg", None)
        same = cfg is not None and getattr(cfg, "split", None) is not None and \
            cfg.split == getattr(task.config, "test_split", None)
        check_fewshot(num_fewshot, documents, f"task {name!r}", leaves_out_query=same)


def check_scores_next_tokens(model) -> None:
    """Only a model with next-token probabilities (a decoder or LSTM LM, first head ``lm``).
    ``model``: a model, or a directory's facts (:func:`lmlab.loading.model_facts`)."""
    from lmlab.models.facts import facts_of
    from lmlab.models.heads import require_head

    facts = facts_of(model)
    kind, family = facts.architecture, facts.family
    if kind == "seq2seq":
        raise LmlabError(f"lmlab evaluate --harness scores decoders, and {family} is an encoder-decoder",
                         "export it (lmlab export --format hf --out DIR) and run lm_eval --model hf "
                         "--model_args pretrained=DIR,backend=seq2seq")
    if kind not in ("decoder", "rnn") or family == "elmo":
        raise LmlabError(f"a {family} model has no next-token probabilities for the harness to score",
                         "evaluate a decoder (gpt2, llama...) or an LSTM LM")
    require_head(facts, "lm", "lmlab evaluate --harness", "score the pretrained checkpoint")


def check_model(model) -> None:
    """:func:`check_scores_next_tokens`, and the loaded model has its tokenizer."""
    check_scores_next_tokens(model)
    if getattr(model, "tokenizer", None) is None:
        raise LmlabError("the checkpoint has no tokenizer", "evaluate a checkpoint saved with its tokenizer")


def run_harness(checkpoint: str | os.PathLike, tasks: str | Sequence[str], *,
                out: str | os.PathLike | None = None, overwrite: bool = False, num_fewshot: int | None = None,
                limit: int | None = None, batch_size: int = 16, device: str = "auto", seed: int = 0,
                log_samples: bool = False, allow_code: bool = False,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the harness ``tasks`` on ``checkpoint`` and write the results to ``out`` (default:
    :func:`default_output`). Returns what was written, plus the per-example ``samples`` (written
    too with ``log_samples``) and the file's ``path``. A local task file that brings Python code
    (``!function``) is refused unless ``allow_code`` (:func:`check_task_code`)."""
    from lmlab import values
    from lmlab.arguments import number_argument, optional_number, path_argument
    from lmlab.train.checkpoint import run_checkpoint

    checkpoint = run_checkpoint(path_argument(checkpoint, "run_harness's checkpoint"))  # a run: its newest
    if out is not None:
        out = path_argument(out, "run_harness's out")
    number_argument(values.BatchSize, batch_size, "run_harness's batch_size")
    optional_number(values.Count, limit, "run_harness's limit")
    number_argument(values.Seed, seed, "run_harness's seed")
    check_installed()
    import lm_eval

    from lmlab.icl.harness_lm import LmlabLM
    from lmlab.loading import load_model, model_facts
    from lmlab.runtime import check_device, pick_device

    check_device(device)  # before the tasks and the model are read
    check_tasks_fewshot({}, num_fewshot)  # K itself, before the tasks are read
    from lmlab.ownership import default_flag

    out_path = Path(out) if out is not None else default_output(checkpoint)
    flag = "--out" if out is not None else default_flag("--out")  # never an --out the user did not give
    # all before the model is loaded
    check_output(out_path, overwrite, {"--checkpoint": checkpoint, "--harness": local_task_paths(tasks)},
                 flag)
    names, manager = resolve_tasks(tasks)
    check_task_code(names, manager, allow_code)  # before the harness imports any of it
    facts = model_facts(checkpoint)  # the kind of model, before the tasks' data and the weights are read
    if facts is not None:
        check_scores_next_tokens(facts)
    with quiet_harness():
        loaded = check_tasks_load(names, manager)
    check_tasks_fewshot(loaded, num_fewshot)  # the documents each task draws its examples from
    model = load_model(checkpoint)
    check_model(model)
    model = model.to(pick_device(device))
    say = log or (lambda msg: None)
    say(f"harness: {', '.join(names)} on {checkpoint} ({model.config.family}, "
        f"{model.num_parameters():,} parameters)")
    with quiet_harness():
        results = lm_eval.simple_evaluate(
            model=LmlabLM(model, model.tokenizer, batch_size=batch_size), tasks=names,
            num_fewshot=num_fewshot, limit=limit, task_manager=manager, log_samples=True, random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)
    from lm_eval.utils import handle_non_serializable

    record = {"checkpoint": str(Path(checkpoint).resolve()), "tasks": names, "num_fewshot": num_fewshot,
              "limit": limit, "seed": seed, "lm_eval_version": importlib.metadata.version("lm_eval")}
    for key in ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                "n-samples"):
        if key in results:
            record[key] = results[key]
    record["baseline"] = chance_levels(record, results.get("samples") or {}, loaded)
    if log_samples:
        record["samples"] = results["samples"]
    record = json.loads(json.dumps(record, default=handle_non_serializable))
    write_output_file(out_path, json_bytes(record), RESULTS_KIND, flag)
    say(f"harness: {headline(record)}; written to {out_path}")
    for line in chance_warnings(record):
        say(f"warning: {line}")
    return {**record, "samples": results["samples"], "path": str(out_path)}


#: the metrics of a multiple-choice task whose trivial baseline is chance (the argmax over the choices)
CHANCE_METRICS = ("acc", "acc_norm")
CHANCE = "chance, a uniform guess among each question's choices"


def chance_levels(record: dict[str, Any], samples: dict[str, list], tasks: dict) -> dict[str, Any]:
    """Each multiple-choice task's trivial baseline, chance: the mean over its documents of 1 / the
    number of choices, for its ``acc`` and ``acc_norm`` results (``{task: {"answer", "results"}}``,
    keyed as ``results``). A task of another kind (perplexity, generation) has no such baseline and
    is left out rather than given an invented one."""
    out: dict[str, Any] = {}
    for name, metrics in (record.get("results") or {}).items():
        if ((record.get("configs") or {}).get(name) or {}).get("output_type") != "multiple_choice":
            continue
        counts = [n for n in (_choices(tasks.get(name), s) for s in samples.get(name) or []) if n]
        shown = {m: sum(1 / n for n in counts) / len(counts) for m in metrics
                 if m.split(",")[0] in CHANCE_METRICS} if counts else {}
        if shown:
            out[name] = {"answer": CHANCE, "results": shown}
    return out


def _choices(task, sample: dict) -> int:
    """The number of choices of one scored document (its task's ``doc_to_choice``, else its requests)."""
    try:
        return len(task.doc_to_choice(sample["doc"]))
    except Exception:  # noqa: BLE001 - a task object the harness built otherwise: one request per choice
        return len(sample.get("arguments") or [])


def chance_warnings(record: dict[str, Any]) -> list[str]:
    """``lmlab_mc acc 0.3333 is at the trivial baseline (chance ...: 0.3333): ...`` for each task
    result at (or below) chance (within :data:`lmlab.tasks.baseline.MARGIN`)."""
    from lmlab.tasks.baseline import at_baseline_text

    lines = []
    for task, base in (record.get("baseline") or {}).items():
        metrics = (record.get("results") or {}).get(task) or {}
        for metric, value in base["results"].items():
            short = metric.split(",")[0]
            scored = {short: metrics[metric]} if metric in metrics else {}
            text = at_baseline_text(scored, (base["answer"], {short: value}), short)
            if text:
                lines.append(f"{task} {text}: the model does no better than guessing")
    return lines


def headline(record: dict[str, Any]) -> str:
    """The results in one line: each task's metrics (``acc 0.2500``), its chance level where it has
    one (``chance 0.3333``, :func:`chance_levels`) and how many documents it scored."""
    parts = []
    for task, metrics in (record.get("results") or {}).items():
        chance = ((record.get("baseline") or {}).get(task) or {}).get("results") or {}
        shown = [f"{name.split(',')[0]} {value:.4f}"
                 + (f" (chance {chance[name]:.4f})" if name in chance else "")
                 for name, value in metrics.items()
                 if isinstance(value, (int, float)) and not isinstance(value, bool) and "_stderr" not in name
                 and name != "sample_len"]
        n = (record.get("n-samples") or {}).get(task, {}).get("effective")
        parts.append(f"{task} " + ", ".join(shown) + (f" ({n} documents)" if n is not None else ""))
    return "; ".join(parts) or "no results"


# --------------------------------------------------------------------------- a quiet harness


def _git_hash_quietly() -> str | None:
    """What ``lm_eval`` records as the git hash of the current folder, without git's ``fatal: not a
    git repository`` on the terminal when there is none."""
    import subprocess

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


@contextlib.contextmanager
def quiet_harness():
    """Run the harness without its chatter: its log messages below errors, the progress bars of
    the harness and of ``datasets``, its Python warnings, and git's complaint outside a repository
    (``lm_eval`` asks git for the current folder's commit). What it wrote is shown if it fails."""
    import io
    import logging
    import warnings

    import lm_eval.evaluator

    loggers = [logging.getLogger(name) for name in ("lm_eval", "lm-eval", "datasets")]
    levels = [lg.level for lg in loggers]
    bars = _datasets_bars(False)
    captured = io.StringIO()
    git = getattr(lm_eval.evaluator, "get_git_commit_hash", None)
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        if git is not None:
            lm_eval.evaluator.get_git_commit_hash = _git_hash_quietly
        with warnings.catch_warnings(), contextlib.redirect_stderr(captured):
            warnings.simplefilter("ignore")
            yield
    except LmlabError:
        raise  # one line says it all
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        if git is not None:
            lm_eval.evaluator.get_git_commit_hash = git
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        _datasets_bars(bars)


def _datasets_bars(enabled: bool) -> bool:
    """Turn the ``datasets`` library's progress bars on or off; returns whether they were on."""
    try:
        from datasets.utils import logging as datasets_logging
    except ImportError:
        return False
    was = datasets_logging.is_progress_bar_enabled()
    (datasets_logging.enable_progress_bar if enabled else datasets_logging.disable_progress_bar)()
    return was
