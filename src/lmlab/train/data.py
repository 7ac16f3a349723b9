"""From ``[data]`` to token shards: resolve paths, train the tokenizer if asked, tokenise text once.

``data.train`` and ``data.val`` name either token-shard directories (``lmlab data prepare``) or
raw text (files, directories of ``*.txt``, glob patterns). Raw text goes through the same
pipeline as ``lmlab data prepare`` (:func:`lmlab.data.prepare_shards`) into ``RUN_DIR/data/``,
with the recipe's tokenizer: an existing tokenizer directory, or a table
``{algo, vocab_size, input, ...}`` trained first into ``RUN_DIR/data/tokenizer``.
``RUN_DIR/data/*.manifest.json`` record what was built from what (paths, sizes, modification
times, tokenizer spec); a later run or ``--resume`` with the same inputs reuses it instead of
tokenising again.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.data.records import input_stat, is_dataset_dir, is_record_file
from lmlab.data.shards import INDEX_FILE, TokenShards, read_index
from lmlab.errors import LmlabError
from lmlab.fileio import read_json, write_json
from lmlab.setting_names import _literal
from lmlab.train.config import DataConfig
from lmlab.values import check_distinct

DEFAULT_DATA = "../shared/data"


@dataclass
class RunData:
    train: TokenShards
    val: TokenShards
    tokenizer: Any
    val_source: str = ""  # where the val text comes from, in words (describe_val)


def expand(entry: str) -> str:
    """Expand ``$LMLAB_DATA`` (default ``../shared/data``, when unset or empty, as an empty
    ``$LMLAB_CACHE_DIR`` is no cache), other variables and ``~``."""
    env = dict(os.environ)
    env["LMLAB_DATA"] = env.get("LMLAB_DATA") or DEFAULT_DATA
    for name in ("LMLAB_DATA",):
        entry = entry.replace("${" + name + "}", env[name]).replace("$" + name, env[name])
    return os.path.expanduser(os.path.expandvars(entry))


def variable_hint(entry: str) -> str:
    """What to check when the path ``entry`` as written (before :func:`expand`) led nowhere: `` (is
    $LMLAB_DATA set?)`` when it names that variable, else "". The one hint of every data path: a
    recipe's, a grid's task files, a tokenizer's."""
    return " (is $LMLAB_DATA set?)" if "LMLAB_DATA" in str(entry) else ""


def expand_input_file(entry: str, what: str = "input file") -> Path:
    """The file that ``entry`` names (:func:`expand`), checked to be a non-empty file
    (:func:`lmlab.fileio.check_input_file`); a missing one names ``$LMLAB_DATA`` when the entry does."""
    from lmlab.fileio import check_input_file

    path = Path(expand(entry))
    if not path.exists():
        raise LmlabError(f"{what} {path} does not exist{variable_hint(entry)}", "check the path")
    return check_input_file(path)


def resolve(entries: list[str], what: str) -> list[Path]:
    """Paths named by ``entries``: shard directories as they are; text directories and globs expanded."""
    out: list[Path] = []
    for entry in entries:
        path = expand(entry)
        if any(c in path for c in "*?["):
            matches = sorted(glob.glob(path))
            if not matches:
                raise LmlabError(f"{what} pattern {entry!r} matches no file{variable_hint(entry)}",
                                 "check the path")
            out.extend(Path(m) for m in matches)
            continue
        p = Path(path)
        if not p.exists():
            raise LmlabError(
                f"{what} {p} does not exist{variable_hint(entry)}",
                "pass token shards from `lmlab data prepare` or text files",
            )
        if p.is_dir() and not (p / INDEX_FILE).is_file() and not is_dataset_dir(p):
            files = sorted(f for f in p.iterdir()
                           if f.is_file() and (f.suffix in (".txt", ".tokens", ".raw") or is_record_file(f)))
            if not files:
                raise LmlabError(
                    f"{what} directory {p} holds neither token shards (index.json) nor text, JSON Lines "
                    "or Parquet files",
                    "create shards with `lmlab data prepare` or point at text files",
                )
            out.extend(files)
        else:
            out.append(p)
    # a file named twice (by two entries, a folder and a file in it, overlapping patterns) would be
    # tokenised twice: its documents counted twice, and split between train and val
    check_distinct(out, what, f"name each file once in {what}", key=os.path.realpath)
    return out


def check_val_apart(train_paths: list[Path], val_paths: list[Path]) -> None:
    """``data.val`` may not read what ``data.train`` reads: a file in both, or the train split of
    the shards ``data.train`` names, would score the model on text it trained on."""
    train = {os.path.realpath(p) for p in train_paths}
    for p in val_paths:
        same = os.path.realpath(p) in train
        if same and _is_shards(p) and read_index(p)["splits"].get("val", {}).get("tokens"):
            continue  # the shards' own held-out val split
        if same:
            raise LmlabError(f"data.val {p} is also in data.train: validation would score the model on "
                             "text it trains on",
                             "give data.val other files, or set data.val=[] and hold out "
                             "data.val_fraction of the training documents")


def _is_shards(p: Path) -> bool:
    return p.is_dir() and (p / INDEX_FILE).is_file()


def _kind(paths: list[Path], what: str) -> str:
    shards = [p for p in paths if _is_shards(p)]
    if not shards:
        return "text"
    if len(paths) > 1:
        raise LmlabError(
            f"{what} mixes token shards with other inputs ({', '.join(map(str, paths[:3]))})",
            "give one shards directory, or only text files",
        )
    return "shards"


def _fingerprint(files: list[Path]) -> list[list]:
    return [[str(f.resolve()), *input_stat(f)] for f in files]


@dataclass(frozen=True)
class DataPlan:
    """What :func:`check_data` found in ``[data]``: the paths it names and what they are."""

    train: list[Path]
    val: list[Path]
    train_is_shards: bool
    val_is_shards: bool


def check_data(cfg: DataConfig, where: str = "", seq_len: int = 0) -> DataPlan:
    """Every check of ``[data]`` that needs the config and a look at the files, not their text: the
    paths exist, shards are not mixed with text, a text run has a tokenizer (a directory that exists,
    or a table with a known ``algo``), there is validation data (``data.val``, a ``val_fraction``
    above 0, or the val split of the shards) and it is not text ``data.train`` reads too, and shards
    made with another tokenizer are not paired, and the cache (``data.cache_dir``) may be written.
    The trainer makes them before anything is written or trained (a refused recipe leaves no run
    folder), :func:`prepare_run_data` and the lab's grid planner through here too. ``where``
    prefixes the setting names in the messages (``pretrain.`` in a grid). With ``seq_len`` (the
    run's ``train.seq_len``) a ``val_fraction`` that leaves no training window is refused too
    (:func:`check_train_share`)."""
    from lmlab.data.shards import tokenizer_sha256

    train_paths = resolve(cfg.train, f"{where}data.train")
    val_paths = resolve(cfg.val, f"{where}data.val") if cfg.val else []
    check_val_apart(train_paths, val_paths)
    train_is_shards = _kind(train_paths, f"{where}data.train") == "shards"
    val_is_shards = bool(val_paths) and _kind(val_paths, f"{where}data.val") == "shards"
    check_read_options(cfg, train_paths if not train_is_shards else [],
                       val_paths if not val_is_shards else [], train_is_shards, where)
    tok_dir = None
    if train_is_shards:
        if not val_paths:
            _split_or_fail(train_paths[0], "val", f"{where}data.train shards have an empty val split; "
                           f"set {where}data.val")
        tok_dir = train_paths[0] / "tokenizer"
    else:
        tok_dir = _check_tokenizer_spec(cfg.tokenizer, where)
        if not val_paths and cfg.val_fraction == 0:
            raise LmlabError(
                f"no validation data: {where}data.val is empty and {where}data.val_fraction is 0",
                f"set {where}data.val to text files or shards, or {where}data.val_fraction=0.01",
            )
    if seq_len and not train_is_shards:
        check_train_share(cfg, train_paths, seq_len, where)
    if val_is_shards:
        sha_v = read_index(val_paths[0]).get("tokenizer", {}).get("sha256")
        if train_is_shards:
            sha_t = read_index(train_paths[0]).get("tokenizer", {}).get("sha256")
        else:
            sha_t = tokenizer_sha256(tok_dir) if tok_dir is not None and tok_dir.is_dir() else None
        if sha_t and sha_v and sha_t != sha_v:
            raise _other_tokenizers(train_paths[0] if train_is_shards else tok_dir, val_paths[0],
                                    train_is_shards)
    cache_entry(cfg, where)  # where the tokenizer and shards would be cached: writable, nobody else's
    return DataPlan(train_paths, val_paths, train_is_shards, val_is_shards)


#: a ``[data]`` setting that only reading some inputs uses: (the inputs, why it does nothing without them)
_READ_OPTIONS = {
    "doc_separator": ("text", "it cuts a text file into documents; each record of a JSON Lines or Parquet "
                      "file is one document, and token shards are cut already"),
    "encoding": ("text", "it decodes text files; JSON Lines are read as UTF-8, Parquet files hold no text "
                 "encoding, and token shards are decoded already"),
    "text_field": ("records", "it names the text field of each record of a JSON Lines or Parquet file; "
                   "text files and token shards have none"),
    "append_eos": ("text or records", "it ends each document with an end-of-sequence token as it is "
                   "tokenised; token shards are tokenised already"),
}


def check_read_options(cfg: DataConfig, train_text: list[Path], val_text: list[Path], train_is_shards: bool,
                       where: str = "") -> None:
    """Refuse a ``[data]`` setting set to other than its default that this run would ignore: how
    text is read (``doc_separator``, ``encoding``) with no text file to read, a record's
    ``text_field`` with no JSON Lines or Parquet file, ``append_eos`` with nothing to tokenise,
    a ``tokenizer`` or ``val_fraction`` with ``data.train`` token shards (their tokenizer and val
    split are used), a ``val_fraction`` beside ``data.val``. ``train_text``/``val_text``: the
    inputs that will be tokenised (not shards)."""
    defaults = DataConfig()
    inputs = [*train_text, *val_text]
    present = {"text": any(not is_record_file(p) for p in inputs),
               "records": any(is_record_file(p) for p in inputs)}
    present["text or records"] = bool(inputs)
    for name, (needs, why) in _READ_OPTIONS.items():
        if getattr(cfg, name) != getattr(defaults, name) and not present[needs]:
            shown = f"{where}data.{name} = {_literal(getattr(cfg, name), 'key')}"
            raise LmlabError(f"{shown} has no effect here: {where}data.train and {where}data.val hold no "
                             f"{needs} files to read ({why})", f"drop {where}data.{name}")
    if train_is_shards:
        for name, why in (("tokenizer", "the shards were made with their own tokenizer, which the run uses"),
                          ("val_fraction", "the shards' own val split is used")):
            if getattr(cfg, name) != getattr(defaults, name):
                raise LmlabError(f"{where}data.{name} has no effect with token shards in {where}data.train "
                                 f"({why})",
                                 f"drop {where}data.{name}, or give text files in {where}data.train")
    elif cfg.val and cfg.val_fraction:
        raise LmlabError(f"{where}data.val_fraction {cfg.val_fraction:g} has no effect with {where}data.val "
                         "given (it holds out training documents only when data.val is empty)",
                         f"drop {where}data.val_fraction, or empty {where}data.val")


def check_train_share(cfg: DataConfig, train_paths: list[Path], seq_len: int, where: str = "") -> None:
    """Refuse, before a tokenizer is trained, a ``data.val_fraction`` that holds out so much of the
    ``data.train`` text that what is left holds, on average, fewer tokens than one training window
    of ``seq_len`` (:func:`lmlab.data.packing.fewer_than_a_window`), counted generously: a token
    covers at least one byte of the files (plus one end-of-sequence token per document with
    ``append_eos``). Compressed inputs (``.gz``, ``.zst``, Parquet) give no such bound: not checked."""
    from lmlab.data.packing import fewer_than_a_window

    if cfg.val or not cfg.val_fraction:
        return
    if any(is_record_file(p) and not str(p).lower().endswith(".jsonl") for p in train_paths):
        return
    most = sum(input_stat(p)[0] for p in train_paths) * (2 if cfg.append_eos else 1)
    left = int(most * (1 - cfg.val_fraction))
    if fewer_than_a_window(left, seq_len):
        raise LmlabError(f"{where}data.val_fraction {cfg.val_fraction} leaves on average at most {left:,} "
                         f"tokens of the {where}data.train text ({most:,} bytes) for training, fewer than "
                         f"one window of train.seq_len={seq_len}",
                         f"lower {where}data.val_fraction (e.g. 0.01) or give {where}data.val files")


def _other_tokenizers(train: Path, val: Path, train_is_shards: bool = True) -> LmlabError:
    what = f"train shards {train}" if train_is_shards else f"tokenizer {train}"
    return LmlabError(f"{what} and val shards {val} were made with different tokenizers",
                      "prepare both with the same tokenizer")


def _check_tokenizer_spec(spec, where: str = "") -> Path | None:
    """The tokenizer directory ``data.tokenizer`` names (None for a table, trained by the run), or a
    one-line error: none given, a directory that does not exist, a table without a known ``algo``."""
    if isinstance(spec, str):
        if not spec:
            raise LmlabError(
                f"{where}data.train is text but no {where}data.tokenizer is given",
                f"set {where}data.tokenizer to a tokenizer directory or a table {{algo, vocab_size}}",
            )
        p = Path(expand(spec))
        if not p.exists():
            raise LmlabError(
                f"{where}data.tokenizer {p} does not exist{variable_hint(spec)}",
                "train one with `lmlab tokenizer train` or give a table {algo, vocab_size}",
            )
        return p
    if not spec.get("algo"):
        raise LmlabError(f"{where}data.tokenizer table needs algo",
                         'e.g. tokenizer = {algo = "bytelevel", vocab_size = 4096}')
    from lmlab.tokenizers import tokenizer_class

    try:
        tokenizer_class(spec["algo"])
    except LmlabError as e:
        raise LmlabError(f"{where}data.tokenizer: {e.problem}", e.fix) from None
    inputs = spec.get("input")
    if inputs:
        resolve([inputs] if isinstance(inputs, str) else inputs, f"{where}data.tokenizer.input")
    return None


def prepare_run_data(
    cfg: DataConfig, run_dir: Path, log: Callable[[str], None], build: bool = True
) -> RunData:
    """Open (building first when ``build``) the train and val token shards of a run (checked first
    by :func:`check_data`)."""
    plan = check_data(cfg)
    train_paths, val_paths = plan.train, list(plan.val)
    data_dir = _data_dir(cfg, run_dir)
    tok_spec = cfg.tokenizer
    tokenizer = None
    tok_dir: Path | None = None
    val_is_shards = plan.val_is_shards

    if plan.train_is_shards:
        train = TokenShards(train_paths[0], "train")
        tok_dir = train.directory / "tokenizer"
    else:
        tok_dir = _tokenizer_dir(tok_spec, train_paths, data_dir, cfg, log, build)
        split_val = not val_paths
        out = _prepare_text(
            train_paths, data_dir / "train", tok_dir, cfg, cfg.val_fraction if split_val else 0.0, log, build
        )
        train = TokenShards(out, "train")
        if split_val:
            val_paths, val_is_shards = [out], True

    if not val_paths:
        val = _split_or_fail(
            train.directory, "val", "data.train shards have an empty val split; set data.val"
        )
    elif val_is_shards:
        index = read_index(val_paths[0])
        split = "val" if index["splits"].get("val", {}).get("tokens") else "train"
        val = TokenShards(val_paths[0], split)
    else:
        out = _prepare_text(val_paths, data_dir / "val", tok_dir, cfg, 0.0, log, build, {"train": "val"})
        val = TokenShards(out, "train")  # a folder of validation text: all of it in its one split

    sha_t = train.index.get("tokenizer", {}).get("sha256")
    sha_v = val.index.get("tokenizer", {}).get("sha256")
    if sha_t and sha_v and sha_t != sha_v:  # a tokenizer trained by this run (check_data had none yet)
        raise _other_tokenizers(train.directory, val.directory)
    tokenizer = train.tokenizer()
    return RunData(train, val, tokenizer, describe_val(cfg, plan.train_is_shards))


def describe_val(cfg: DataConfig, train_is_shards: bool = False) -> str:
    """Where a run's validation text comes from, in words for its log: held out of the training
    data, or named files (whose domain the reader can then judge)."""
    if cfg.val:
        names = [Path(expand(v)).name or v for v in cfg.val[:3]]
        return "data.val " + ", ".join(names) + (f" and {len(cfg.val) - 3} more" if len(cfg.val) > 3 else "")
    if train_is_shards:
        return "the val split of the data.train shards"
    return (f"{cfg.val_fraction * 100:g}% of the data.train documents, held out (picked by a hash of "
            "their text, never trained on)")


def _data_dir(cfg: DataConfig, run_dir: Path) -> Path:
    """``RUN_DIR/data``, or a shared cache entry keyed by the [data] table (see DataConfig)."""
    return cache_entry(cfg) or run_dir / "data"


def cache_entry(cfg: DataConfig, where: str = "") -> Path | None:
    """The shared cache entry of the [data] table (``data.cache_dir`` or ``$LMLAB_CACHE_DIR``, then
    ``data-<hash of the table>``), None when no cache is set. Refused in one line naming the setting,
    before any tokenizer is trained, when it cannot be written or lies inside another lmlab output
    (:func:`lmlab.ownership.check_destination`, the rule of every output); ``where`` prefixes the
    setting's name (``pretrain.`` in a grid)."""
    import hashlib
    import json

    cache = cfg.cache_dir or os.environ.get("LMLAB_CACHE_DIR", "")
    if not cache:
        return None
    # the tokens do not depend on where they are cached, on the workers, or on how many a run reads
    spec = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("cache_dir", "workers", "max_tokens")}
    key = hashlib.sha256(json.dumps(_jsonable(spec), sort_keys=True).encode()).hexdigest()[:16]
    entry = Path(expand(cache)) / f"data-{key}"
    from lmlab import ownership

    # before any tokenizer is trained, and naming the setting, not --out
    flag = f"{where}data.cache_dir" if cfg.cache_dir else "$LMLAB_CACHE_DIR"
    if entry.is_dir():  # a complete entry is only read (a shared, read-only cache is fine)...
        ownership.check_not_inside_output(entry, flag, fills=True)  # ...never one inside another output
    else:
        ownership.check_destination(entry, flag, fills=True)
    return entry


def _split_or_fail(directory: Path, split: str, message: str) -> TokenShards:
    index = read_index(directory)
    if not index["splits"].get(split, {}).get("tokens"):
        raise LmlabError(message, "or re-run `lmlab data prepare` with --val-fraction")
    return TokenShards(directory, split)


def _tokenizer_dir(
    spec, train_paths: list[Path], data_dir: Path, cfg: DataConfig, log: Callable[[str], None], build: bool
) -> Path:
    if isinstance(spec, str):  # checked by check_data
        return Path(expand(spec))
    spec = dict(spec)
    algo = spec.pop("algo")  # checked by check_data
    vocab_size = spec.pop("vocab_size", None)
    inputs = spec.pop("input", None)
    files = (
        resolve([inputs] if isinstance(inputs, str) else inputs, "data.tokenizer.input")
        if inputs
        else train_paths
    )
    out = data_dir / "tokenizer"
    manifest = {
        "algo": algo,
        "vocab_size": vocab_size,
        "options": spec,
        "inputs": _fingerprint(files),
        "encoding": cfg.encoding,
    }
    if _manifest_matches(out, manifest):
        return out
    if not build:
        raise LmlabError(f"tokenizer {out} is missing", "run without --resume to build it")
    from lmlab.data.prepare import iter_documents
    from lmlab.fileio import iter_text_lines, require_text
    from lmlab.tokenizers import train_tokenizer

    def texts():
        for f in files:
            if is_record_file(f):  # the records' text, not the JSON around it
                yield from require_text(iter_documents(f, text_field=cfg.text_field), f)
            else:
                yield from require_text(iter_text_lines(f, cfg.encoding), f)

    log(f"training a {algo} tokenizer (vocab_size={vocab_size}) on {len(files)} file(s)")
    try:
        tok = train_tokenizer(algo, texts(), vocab_size=vocab_size, warn=log, **spec)
    except TypeError as e:
        raise LmlabError(
            f"data.tokenizer has an option the {algo} trainer does not take ({e})",
            "use algo, vocab_size, input and the trainer's options",
        ) from None
    tok.save(out)
    write_json(_manifest_path(out), manifest)
    return out


def _manifest_path(directory: Path) -> Path:
    return directory.with_name(directory.name + ".manifest.json")


def _manifest_matches(directory: Path, manifest: dict) -> bool:
    path = _manifest_path(directory)
    if not path.is_file() or not directory.is_dir():
        return False
    try:
        return read_json(path) == _jsonable(manifest)
    except LmlabError:
        return False


def _jsonable(obj):
    import json

    return json.loads(json.dumps(obj))


def _prepare_text(
    files: list[Path],
    out: Path,
    tok_dir: Path,
    cfg: DataConfig,
    val_fraction: float,
    log: Callable[[str], None],
    build: bool,
    split_names: dict[str, str] | None = None,
) -> Path:
    """Tokenise ``files`` into ``out`` unless it already holds them; ``split_names`` renames the
    splits in the lines logged (a folder of validation text keeps it in its "train" split)."""
    from lmlab.data.prepare import prepare_shards
    from lmlab.data.shards import tokenizer_sha256

    manifest = {
        "inputs": _fingerprint(files),
        "tokenizer": tokenizer_sha256(tok_dir),
        "val_fraction": val_fraction,
        "doc_separator": cfg.doc_separator,
        "encoding": cfg.encoding,
        "append_eos": cfg.append_eos,
    }
    if any(is_record_file(f) for f in files):
        manifest["text_field"] = cfg.text_field
    if _manifest_matches(out, manifest) and (out / INDEX_FILE).is_file():
        return out
    if not build:
        raise LmlabError(f"token shards {out} are missing or stale", "run without --resume to rebuild them")
    names = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    log(f"tokenising {len(files)} file(s) into {out}: {names}")
    summary = prepare_shards(
        tok_dir,
        [str(f) for f in files],
        out,
        val_fraction=val_fraction,
        workers=cfg.workers,
        encoding=cfg.encoding,
        doc_separator=cfg.doc_separator,
        append_eos=cfg.append_eos,
        progress=False,
        text_field=cfg.text_field,
        val_fraction_key="data.val_fraction",
    )
    for line in summary.report(split_names).splitlines():
        log(line)
    write_json(_manifest_path(out), manifest)
    return out
