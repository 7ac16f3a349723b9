"""Shared plumbing for the tokenizer benchmarks: corpus, timing, peak memory, reports.

Every measurement runs in a fresh child process (``run_child``) so that

* peak memory is separable: ``ru_maxrss`` is a process-wide high-water mark, so a trainer that
  ran earlier in the same process would hide the peak of the next one;
* thread settings take effect: Hugging Face ``tokenizers`` sizes its Rayon pool from
  ``RAYON_NUM_THREADS`` when it is first used, so the variable must be set before the import.

The child prints one JSON object on its last stdout line; the parent turns those into a Markdown
table and rewrites only its own section of ``BENCHMARKS.md`` (atomically).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LMLAB_DATA", REPO.parent / "shared" / "data"))
BENCHMARKS_MD = REPO / "BENCHMARKS.md"

#: The pretraining corpus, in a fixed order. Two NLTK Gutenberg files are ISO-8859-1, not UTF-8.
PRETRAIN_DIRS = ("english-mix", "gutenberg", "tinyshakespeare", "wikitext-2")
LATIN1_FILES = frozenset({"gutenberg_chesterton-ball.txt", "gutenberg_shakespeare-caesar.txt"})

#: Held-out English for characters per token: the paragraphs of SQuAD v1.1 dev (Wikipedia
#: articles), which no file of the training corpus contains.
HELD_OUT = Path("squad") / "squad_v1.1_dev_partA.json"

#: Corpus size and vocabulary used by ``--quick`` (the smoke test): seconds, not minutes.
QUICK_MB = 0.05
QUICK_VOCAB = 400

INTRO = """# Benchmarks

Speed and peak memory of lmlab's tokenizers next to the reference libraries (Hugging Face
`tokenizers`, `sentencepiece`, `tiktoken`), measured side by side in one run on the same text.
Each section below is rewritten by the script named in it; see `benchmarks/README.md` for how
to run them and what each column means. Timings depend on the machine and on its load: compare
ratios within one section, not absolute figures across machines.
"""


# --------------------------------------------------------------------------- corpus
def corpus_files(data_dir: Path | None = None) -> list[Path]:
    """The pretraining text files under ``data_dir/pretrain`` in a fixed order."""
    root = Path(data_dir or DATA) / "pretrain"
    files = [f for d in PRETRAIN_DIRS for f in sorted((root / d).glob("*")) if f.is_file()]
    if not files:
        sys.exit(f"error: no corpus files under {root}; set LMLAB_DATA to the shared data directory")
    return files


def read_corpus_file(path: Path) -> str:
    """Decode one file the way its provenance says: latin-1 where stated, else UTF-8 (BOM dropped).

    Windows line ends (the Project Gutenberg files) are normalised to ``\\n``.
    """
    raw = path.read_bytes()
    text = raw.decode("latin-1") if path.name in LATIN1_FILES else raw.decode("utf-8-sig")
    return text.replace("\r\n", "\n")


def _cut(text: str, fraction: float) -> int:
    """Where the leading ``fraction`` of ``text`` ends: after a whole line."""
    keep = int(len(text) * fraction)
    return keep if keep >= len(text) else max(0, text.rfind("\n", 0, keep))


def _lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.strip()]


def load_corpus(max_mb: float | None = None, data_dir: Path | None = None) -> list[str]:
    """Non-empty lines of the pretraining corpus (newline stripped), at most ``max_mb`` MB of UTF-8.

    When capped, the same leading fraction of *every* file is kept, so a 1 MB slice mixes the
    same sources (novels, poetry, Wikipedia, Shakespeare) as the whole corpus.
    """
    texts = [read_corpus_file(f) for f in corpus_files(data_dir)]
    total = sum(len(t.encode("utf-8")) for t in texts)
    fraction = 1.0 if max_mb is None else min(1.0, max_mb * 1e6 / total)
    return [line for text in texts for line in _lines(text[:_cut(text, fraction)])]


def split_corpus(train_mb: float, max_mb: float | None = None,
                 data_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """``(training lines, held-out lines)``: disjoint parts of the pretraining corpus.

    Training takes the leading ``train_mb`` MB (the same leading fraction of every file, as
    :func:`load_corpus`); the held-out part is the rest of every file, capped at ``max_mb`` MB
    in the same way, without any line that also occurs in the training part. Text encoded from
    the held-out part is therefore text no learner trained on.
    """
    texts = [read_corpus_file(f) for f in corpus_files(data_dir)]
    total = sum(len(t.encode("utf-8")) for t in texts)
    fraction = min(1.0, train_mb * 1e6 / total)
    cuts = [_cut(text, fraction) for text in texts]
    train = [line for text, cut in zip(texts, cuts) for line in _lines(text[:cut])]
    rests = [text[cut:] for text, cut in zip(texts, cuts)]
    left = sum(len(r.encode("utf-8")) for r in rests)
    keep = 1.0 if max_mb is None or left == 0 else min(1.0, max_mb * 1e6 / left)
    seen = set(train)
    held = [line for rest in rests for line in _lines(rest[:_cut(rest, keep)]) if line not in seen]
    return train, held


def held_out_lines(data_dir: Path | None = None) -> list[str]:
    """The distinct SQuAD dev paragraphs (:data:`HELD_OUT`): English text no learner trained on."""
    path = Path(data_dir or DATA) / HELD_OUT
    if not path.is_file():
        sys.exit(f"error: no held-out text at {path}; set LMLAB_DATA to the shared data directory")
    data = json.loads(path.read_text(encoding="utf-8"))
    return list(dict.fromkeys(p["context"] for article in data["data"] for p in article["paragraphs"]))


def corpus_mb(lines: Sequence[str]) -> float:
    """Size of ``lines`` in MB (10^6 bytes) of UTF-8, one newline per line included."""
    return sum(len(s.encode("utf-8")) + 1 for s in lines) / 1e6


def sample_lines(lines: Sequence[str], max_chars: int) -> list[str]:
    """Every n-th line, n chosen so that the sample holds about ``max_chars`` characters."""
    total = sum(map(len, lines))
    step = max(1, round(total / max_chars)) if total else 1
    return list(lines[::step])


def write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


# --------------------------------------------------------------------------- measuring
def peak_rss_mb(children: bool = False) -> float:
    """Resident-set high-water mark in MB of this process, or with ``children`` of its largest
    finished child (a worker process); Linux reports ``ru_maxrss`` in KiB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    kib = resource.getrusage(who).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), wall seconds)``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def cpu_timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``(fn(), wall seconds, CPU seconds of this process, all its threads)``."""
    cpu = time.process_time()
    out, wall = timed(fn)
    return out, wall, time.process_time() - cpu


def thread_env(threads: int) -> dict[str, str]:
    """Environment for a child limited to ``threads`` threads in every library we call."""
    env = dict(os.environ)
    env.update({
        "RAYON_NUM_THREADS": str(threads),          # Hugging Face tokenizers (Rust, Rayon)
        "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONHASHSEED": "0",
    })
    return env


def run_child(script: Path, args: Sequence[str], threads: int, timeout: float) -> dict[str, Any]:
    """Run ``script --child ARGS`` in a fresh interpreter; return the JSON its last line holds.

    A child that fails or times out gives ``{"error": "..."}`` instead, so one broken library
    costs a cell in the table, not the whole run.
    """
    cmd = [sys.executable, str(script), "--child", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=thread_env(threads))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [s for s in proc.stdout.splitlines() if s.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:200]}
    return json.loads(lines[-1])


def best_of(repeats: int, measure: Callable[[], dict[str, Any]], key: str,
            lower_is_better: bool) -> dict[str, Any]:
    """Run ``measure`` ``repeats`` times and keep the best result by ``key`` (noise only slows
    things down, so the best run is the closest to the true cost); a failure ends the repeats."""
    best: dict[str, Any] | None = None
    for _ in range(max(1, repeats)):
        r = measure()
        if "error" in r or key not in r:
            return r
        if best is None or (r[key] < best[key] if lower_is_better else r[key] > best[key]):
            best = r
    best["repeats"] = max(1, repeats)
    return best


def child_report(result: dict[str, Any]) -> None:
    """Print a child's result as the JSON line the parent reads."""
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------- reporting
def fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def verdict(ratio: float | None, limit: float, higher_is_better: bool = False) -> str:
    """``met`` / ``missed`` for a ratio against its target (``n/a`` when a side failed)."""
    if ratio is None:
        return "n/a"
    ok = ratio >= limit if higher_is_better else ratio <= limit
    return "met" if ok else "**missed**"


def machine_line() -> str:
    """One line naming the machine, the load and the library versions, for the report."""
    import importlib.metadata as md

    versions = []
    for pkg in ("tokenizers", "sentencepiece", "tiktoken"):
        try:
            versions.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            versions.append(f"{pkg} not installed")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {load} "
            f"at start; Python {platform.python_version()}; {'; '.join(versions)}")


def add_output_options(ap) -> None:
    """``--markdown``, ``--no-write`` and ``--json``: where a model benchmark's results go."""
    ap.add_argument("--markdown", type=Path, default=BENCHMARKS_MD, help="report file")
    ap.add_argument("--no-write", action="store_true", help="print the report only")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results here")


def require_counts(args, defaults: dict[str, int]) -> None:
    """``--steps``-like options: each given one at least 1, else an ``LmlabError`` naming a value
    to pass (``defaults``: option name -> the example)."""
    from lmlab.errors import LmlabError

    for opt, example in defaults.items():
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise LmlabError(f"--{opt} must be at least 1, got {value}",
                             f"pass e.g. --{opt} {example}, or leave it out")


def rerun_command(script: str, argv: Sequence[str] | None) -> str:
    """The command line that repeats a run, for its report: ``--json`` and ``--markdown`` dropped
    in both spellings, ``--json PATH`` and ``--json=PATH`` (where results go does not change what
    is measured)."""
    dropped = ("--json", "--markdown")
    kept: list[str] = []
    skip_next = False
    for arg in (argv if argv is not None else sys.argv[1:]):
        if skip_next:
            skip_next = False
        elif arg in dropped:
            skip_next = True
        elif not arg.startswith(tuple(f"{opt}=" for opt in dropped)):
            kept.append(arg)
    return " ".join([f"python benchmarks/{script}", *kept])


def static_bytes(model, optimizer, grads: bool = False) -> int:
    """Bytes a training row holds between steps: ``model``'s parameters and ``optimizer``'s state
    tensors (AdamW: step, exp_avg, exp_avg_sq), plus the parameters' gradients when ``grads``."""
    import torch

    tensors = [t for p in model.parameters() for t in ((p, p.grad) if grads else (p,)) if t is not None]
    tensors += [t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def update_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> Path:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``path``.

    The file is created with the intro if missing; a section not yet there is appended. Other
    sections are left exactly as they were. The write is atomic.
    """
    from lmlab.fileio import atomic_write_text

    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.is_file() else INTRO
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    atomic_write_text(path, text)
    return path
