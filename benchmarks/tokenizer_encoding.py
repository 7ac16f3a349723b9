"""Tokenizer ENCODING throughput (MB/s per thread) and peak memory: lmlab vs HF vs sentencepiece vs tiktoken.

The corpus is split in two disjoint parts (``common.split_corpus``): for each lmlab algorithm a
tokenizer is trained once on the leading ``--train-mb`` of the corpus and saved, and every
encoder encodes the *held-out* rest (at most ``--corpus-mb``; lines that also occur in the
training part are dropped), so the figures are for text no learner trained on. Every encoder
runs in a fresh child process limited to one thread and encodes the same lines, one call per
line (the usual data-loading pattern), after a short warm-up:

* lmlab ``Tokenizer.encode(line)``;
* Hugging Face ``Tokenizer.encode(line)`` and ``encode_batch(lines)`` with ``RAYON_NUM_THREADS=1``,
  loading **lmlab's own exported tokenizer.json**, so both sides use the very same vocabulary and
  segmentation (the ``ids agree`` column checks that they do); if HF cannot load the export, an
  HF-trained tokenizer of the same kind and size stands in (noted in the table);
* sentencepiece (its own model of the same kind and size, trained on the same text;
  ``encode(line)`` and batch ``encode(lines, num_threads=1)``, best of the two);
* tiktoken, byte-level only, built from the same byte-level BPE ranks (tiktoken ships its own
  encodings only as downloads, which this project never does), when tiktoken is installed.

A second table compares bulk encoding on both cores: lmlab's bulk method (an ``encode...``
method taking ``workers``, i.e. ``encode_many``) with ``workers=2`` against HF ``encode_batch``
with ``RAYON_NUM_THREADS=2``, and checks that the bulk ids equal ``encode``'s.

The targets from the issue: lmlab's encoder at least as fast per thread as HF tokenizers (lmlab
MB/s / best single-thread HF MB/s >= 1), and ``encode_many`` on two workers at least 1.5x HF
``encode_batch`` on two threads.

    python benchmarks/tokenizer_encoding.py                    # whole corpus encoded
    python benchmarks/tokenizer_encoding.py --corpus-mb 2 --algos bytelevel
    python benchmarks/tokenizer_encoding.py --quick            # smoke run, seconds
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from peers import PEERS  # noqa: E402

SECTION = "tokenizer_encoding"
ALGOS = list(PEERS)
#: sentencepiece model kind used next to each lmlab algorithm (WordPiece has no spm analogue).
SPM_KIND = {"bpe": "spm-bpe", "bytelevel": "spm-bpe", "unigram": "spm-unigram"}
WARMUP_LINES = 200
BULK_PARAMS = ("workers", "num_workers", "processes", "n_jobs")


# --------------------------------------------------------------------------- child: preparing
def child_prepare(what: str, algo: str, vocab: int, corpus: Path, out: Path) -> dict:
    """Train and save one tokenizer: lmlab's (``out`` dir), HF's stand-in or a sentencepiece model."""
    from lmlab.tokenizers import DEFAULT_SPECIAL_TOKENS

    lines = common.read_lines(corpus)
    if what == "lmlab":
        from lmlab.tokenizers import train_tokenizer

        tok, secs = common.timed(lambda: train_tokenizer(algo, lines, vocab_size=vocab))
        tok.save(out)
    elif what == "hf":
        from peers import train_hf

        tok, secs = common.timed(lambda: train_hf(f"hf-{algo}", lines, vocab, DEFAULT_SPECIAL_TOKENS))
        tok.save(str(out))
    else:
        from peers import train_spm

        proto, secs = common.timed(lambda: train_spm(what, lines, vocab, 1))
        out.write_bytes(proto)
    return {"seconds": secs}


# --------------------------------------------------------------------------- child: encoding
def _throughput(encode_all, lines: list[str], nbytes: int) -> tuple[float, list[list[int]]]:
    """MB/s of ``encode_all(lines)`` after a warm-up on the first lines, and the ids it produced."""
    encode_all(lines[:WARMUP_LINES])
    ids, secs = common.timed(lambda: encode_all(lines))
    return nbytes / 1e6 / secs, ids


def _bulk_method(tok):
    """``(name, parameter)`` of an lmlab method that encodes many texts on several workers, or None."""
    for name in sorted(dir(tok)):
        if not name.startswith("encode") or name.startswith("_"):
            continue
        fn = getattr(tok, name)
        if not callable(fn):
            continue
        params = inspect.signature(fn).parameters
        for p in BULK_PARAMS:
            if p in params:
                return name, p
    return None


def tiktoken_from_hf_json(path: Path):
    """A ``tiktoken.Encoding`` with the byte-level BPE ranks of a tokenizer.json (rank = token id)."""
    import tiktoken

    from lmlab.tokenizers.pretokenize import GPT2_PATTERN, from_byte_symbols

    data = json.loads(path.read_text(encoding="utf-8"))
    specials = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    ranks = {from_byte_symbols(tok): i for tok, i in data["model"]["vocab"].items() if tok not in specials}
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"vocabulary lacks {len(missing)} single bytes; tiktoken needs all 256")
    return tiktoken.Encoding("lmlab-bench", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens=specials)


def child_encode(lib: str, artifact: Path, corpus: Path) -> dict:
    """Encode every line of ``corpus`` with one encoder; report MB/s, peak RSS and a sample of ids."""
    lines = common.read_lines(corpus)
    nbytes = sum(len(s.encode("utf-8")) for s in lines)
    res: dict = {}
    if lib == "lmlab":
        from lmlab.tokenizers import load_tokenizer

        tok = load_tokenizer(artifact)
        res["mbps"], ids = _throughput(lambda xs: [tok.encode(x) for x in xs], lines, nbytes)
    elif lib == "lmlab-bulk":
        from lmlab.tokenizers import load_tokenizer

        tok = load_tokenizer(artifact)
        found = _bulk_method(tok)
        if found is None:
            return {"absent": True}
        name, param = found
        fn = getattr(tok, name)
        res["method"] = name
        res["mbps"], ids = _throughput(lambda xs: fn(xs, **{param: 2}), lines, nbytes)
    elif lib == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(artifact))
        one, ids = _throughput(lambda xs: [tok.encode(x, add_special_tokens=False).ids for x in xs],
                               lines, nbytes)
        batch, _ = _throughput(lambda xs: tok.encode_batch(xs, add_special_tokens=False), lines, nbytes)
        res.update(mbps=max(one, batch), encode_mbps=one, batch_mbps=batch)
    elif lib == "hf-batch":  # run with RAYON_NUM_THREADS=2: encode_batch on both cores
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(artifact))
        res["mbps"], batch = _throughput(lambda xs: tok.encode_batch(xs, add_special_tokens=False),
                                         lines, nbytes)
        ids = [e.ids for e in batch]
    elif lib == "spm":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(artifact))
        one, ids = _throughput(lambda xs: [sp.encode(x) for x in xs], lines, nbytes)
        batch, _ = _throughput(lambda xs: sp.encode(xs, num_threads=1), lines, nbytes)
        res.update(mbps=max(one, batch), encode_mbps=one, batch_mbps=batch)
    elif lib == "tiktoken":
        enc = tiktoken_from_hf_json(artifact)
        one, ids = _throughput(lambda xs: [enc.encode_ordinary(x) for x in xs], lines, nbytes)
        batch, _ = _throughput(lambda xs: enc.encode_ordinary_batch(xs, num_threads=1), lines, nbytes)
        res.update(mbps=max(one, batch), encode_mbps=one, batch_mbps=batch)
    else:
        raise ValueError(f"unknown encoder {lib!r}")
    res["peak_rss_mb"] = common.peak_rss_mb()
    res["tokens"] = sum(len(x) for x in ids)
    res["sample_ids"] = ids[:: max(1, len(ids) // 500)]  # every n-th line's ids, for the agreement check
    return res


# --------------------------------------------------------------------------- parent side
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {common.QUICK_MB} MB of text, vocabulary {common.QUICK_VOCAB}")
    p.add_argument("--corpus-mb", type=float, default=None,
                   help="MB of held-out text to encode (default: all the corpus not trained on)")
    p.add_argument("--train-mb", type=float, default=2.0,
                   help="MB of text the tokenizers are trained on (the leading part of the corpus)")
    p.add_argument("--algos", default=",".join(ALGOS),
                   help=f"comma-separated lmlab algorithms ({','.join(ALGOS)})")
    p.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size of every tokenizer")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per child run")
    p.add_argument("--repeats", type=int, default=1, help="encode this many times, keep the fastest")
    p.add_argument("--markdown", type=Path, default=common.BENCHMARKS_MD, help="report file to update")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in args.algos if a not in PEERS]
    if unknown:
        p.error(f"unknown algorithm(s) {unknown}; choose from {','.join(ALGOS)}")
    if args.quick:
        args.corpus_mb = min(args.corpus_mb or common.QUICK_MB, common.QUICK_MB)
        args.train_mb = args.corpus_mb
        args.vocab_size = common.QUICK_VOCAB
    return args


def _agreement(a: dict, b: dict) -> str:
    """Share of sampled lines on which two encoders gave identical ids."""
    if "sample_ids" not in a or "sample_ids" not in b or len(a["sample_ids"]) != len(b["sample_ids"]):
        return "—"
    same = sum(x == y for x, y in zip(a["sample_ids"], b["sample_ids"]))
    return f"{100 * same / max(1, len(a['sample_ids'])):.0f}%"


def _cell(r: dict | None) -> str:
    if r is None:
        return "—"
    if "error" in r:
        return "failed"
    if r.get("absent"):
        return "not offered"
    return f"{r['mbps']:.2f}"


def run(args: argparse.Namespace) -> str:
    train_lines, lines = common.split_corpus(args.train_mb, args.corpus_mb)

    def run_child(child: list[str], threads: int = 1) -> dict:
        once = lambda: common.run_child(Path(__file__), child, threads, args.timeout)  # noqa: E731
        return once() if child[0] == "prepare" else common.best_of(args.repeats, once, "mbps", False)

    have_tiktoken = _installed("tiktoken")
    rows, bulk_rows, notes, errors = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="lmlab-bench-") as tmp:
        tmp = Path(tmp)
        corpus, train = tmp / "corpus.txt", tmp / "train.txt"
        common.write_lines(corpus, lines)
        common.write_lines(train, train_lines)
        spm_models: dict[str, Path] = {}
        for algo in args.algos:
            vs = str(args.vocab_size)
            lmlab_dir = tmp / f"lmlab-{algo}"
            prep = run_child(["prepare", "lmlab", algo, vs, str(train), str(lmlab_dir)])
            res: dict[str, dict | None] = {}
            if "error" in prep:
                res["lmlab"] = res["lmlab-bulk"] = {"error": f"training failed: {prep['error']}"}
            else:
                res["lmlab"] = run_child(["encode", "lmlab", str(lmlab_dir), str(corpus)])
                res["lmlab-bulk"] = run_child(["encode", "lmlab-bulk", str(lmlab_dir), str(corpus)],
                                              threads=2)
            hf_json, hf_source = lmlab_dir / "tokenizer.json", "lmlab's tokenizer.json"
            res["hf"] = run_child(["encode", "hf", str(hf_json), str(corpus)]) if hf_json.is_file() else None
            if res["hf"] is None or "error" in res["hf"]:
                if res["hf"] is not None:
                    errors.append(f"- HF could not load lmlab's {algo} tokenizer.json: {res['hf']['error']}")
                hf_json, hf_source = tmp / f"hf-{algo}.json", "HF-trained stand-in"
                hf_prep = run_child(["prepare", "hf", algo, vs, str(train), str(hf_json)])
                res["hf"] = (hf_prep if "error" in hf_prep
                             else run_child(["encode", "hf", str(hf_json), str(corpus)]))
            res["hf-batch"] = (res["hf"] if "error" in res["hf"]
                               else run_child(["encode", "hf-batch", str(hf_json), str(corpus)], threads=2))
            res["spm"] = None
            if kind := SPM_KIND.get(algo):
                if kind not in spm_models:
                    spm_models[kind] = tmp / f"{kind}.model"
                    run_child(["prepare", kind, algo, vs, str(train), str(spm_models[kind])])
                res["spm"] = (run_child(["encode", "spm", str(spm_models[kind]), str(corpus)])
                              if spm_models[kind].is_file() else {"error": f"{kind} training failed"})
            res["tiktoken"] = None
            if algo == "bytelevel" and have_tiktoken and "error" not in res["hf"]:
                res["tiktoken"] = run_child(["encode", "tiktoken", str(hf_json), str(corpus)])
                if "error" not in res["tiktoken"]:
                    same = _agreement(res["tiktoken"], res["hf"])
                    notes.append(f"- tiktoken and HF gave the same ids on {same} of the sampled lines.")
            errors += [f"- {name} {algo}: {r['error']}" for name, r in res.items()
                       if r and "error" in r and not (name == "lmlab-bulk" and r is res["lmlab"])
                       and not (name == "hf-batch" and r is res["hf"])]
            rows.append(_row(algo, args.vocab_size, res, hf_source))
            bulk_rows.append(_bulk_row(algo, args.vocab_size, res))
            progress = ", ".join(f"{k} {_cell(v)}" for k, v in res.items())
            print(f"  {algo}: {progress}", file=sys.stderr, flush=True)
    if not have_tiktoken:
        notes.append("- tiktoken is not installed (`pip install tiktoken`): its column is empty.")
    notes.append("- tiktoken's figure uses the byte-level vocabulary of the same row (its own GPT-2 "
                 "encodings are downloads, which this project never makes).")
    table = common.markdown_table(
        ["algorithm", "vocab", "lmlab encode", "HF encode", "HF encode_batch",
         "sentencepiece", "tiktoken", "lmlab / HF", "target", "verdict", "ids agree lmlab=HF",
         "lmlab peak MB", "HF peak MB", "HF vocabulary"], rows)
    bulk_table = common.markdown_table(
        ["algorithm", "vocab", "lmlab bulk, 2 workers", "HF encode_batch, 2 threads", "lmlab / HF", "target",
         "verdict", "bulk ids = encode ids"], bulk_rows)
    mb = sum(len(s.encode("utf-8")) for s in lines) / 1e6
    return "\n".join([
        "## Tokenizer encoding (`benchmarks/tokenizer_encoding.py`)",
        "",
        f"Encoded: {mb:.2f} MB of held-out UTF-8 text ({len(lines):,} non-empty lines, one call per line), "
        f"disjoint from the {common.corpus_mb(train_lines):.2f} MB the tokenizers were trained on (the "
        "leading part of every corpus file trains, the rest is encoded; no encoded line occurs in the "
        "training part)" + (" (`--quick` smoke run: figures mean nothing)" if args.quick else "") + ".",
        f"Throughput in MB/s per thread (1 thread each, `RAYON_NUM_THREADS=1`; best of {args.repeats} "
        f"run(s)). Machine: {common.machine_line()}.",
        "Target: lmlab `encode` at least as fast per thread as HF tokenizers (the faster of HF's `encode` "
        "and single-thread `encode_batch`).",
        "",
        table,
        "",
        "Bulk encoding on both cores: lmlab's `encode_many(lines, workers=2)` against HF "
        "`encode_batch(lines)` with `RAYON_NUM_THREADS=2`, same lines, same vocabulary, MB/s for the "
        "whole call. Target: lmlab at least 1.5x HF.",
        "",
        bulk_table,
        "",
        "Notes:",
        *notes,
        *(["", "Failed runs:", *errors] if errors else []),
    ])


def _row(algo: str, vocab: int, res: dict, hf_source: str) -> list:
    ours, hf = res["lmlab"], res["hf"]
    ok = ours and hf and "error" not in ours and "error" not in hf
    ratio = ours["mbps"] / hf["mbps"] if ok else None
    hf_one = "failed" if not hf or "error" in hf else f"{hf['encode_mbps']:.2f}"
    hf_batch = "failed" if not hf or "error" in hf else f"{hf['batch_mbps']:.2f}"
    agree = _agreement(ours, hf) if ok and hf_source.startswith("lmlab") else "—"
    return [algo, vocab, _cell(ours), hf_one, hf_batch, _cell(res["spm"]), _cell(res["tiktoken"]),
            "—" if ratio is None else f"{ratio:.2f}x", "≥ 1x",
            common.verdict(ratio, 1.0, higher_is_better=True),
            agree, "—" if not ok else f"{ours['peak_rss_mb']:.0f}",
            "—" if not hf or "error" in hf else f"{hf['peak_rss_mb']:.0f}", hf_source]


def _bulk_row(algo: str, vocab: int, res: dict) -> list:
    """lmlab's bulk method on 2 workers against HF encode_batch on 2 threads (target >= 1.5x)."""
    ours, hf, one = res["lmlab-bulk"], res["hf-batch"], res["lmlab"]
    ok = ours and hf and "error" not in ours and "error" not in hf and not ours.get("absent")
    ratio = ours["mbps"] / hf["mbps"] if ok else None
    bulk = _cell(ours)
    if ours and ours.get("method"):
        bulk += f" (`{ours['method']}`)"
    same = _agreement(ours, one) if ok and one and "error" not in one else "—"
    return [algo, vocab, bulk, _cell(hf), "—" if ratio is None else f"{ratio:.2f}x", "≥ 1.5x",
            common.verdict(ratio, 1.5, higher_is_better=True), same]


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        mode, *rest = args.child
        if mode == "prepare":
            what, algo, vocab, corpus, out = rest
            common.child_report(child_prepare(what, algo, int(vocab), Path(corpus), Path(out)))
        else:
            lib, artifact, corpus = rest
            common.child_report(child_encode(lib, Path(artifact), Path(corpus)))
        return 0
    report = run(args)
    print(report)
    if not args.no_write:
        common.update_section(SECTION, report, args.markdown)
        print(f"\nupdated {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
