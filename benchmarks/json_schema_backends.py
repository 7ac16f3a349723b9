"""JSON-schema constrained decoding: time spent computing allowed-token masks, llguidance vs lmlab.

Both backends see exactly the same token sequences: an untrained gpt2-tiny samples ``--rows``
documents of up to ``--tokens`` tokens through the llguidance backend (every llguidance path is
valid for lmlab's engine on this schema: tests/generate/test_grammar_backends.py checks that the
masks agree), then each backend, built fresh (cold caches), replays them step by step as a batch,
the way ``generate`` calls a logits processor. Reported: constraint construction and per-step mask
time for the batch, and the ratio lmlab / llguidance. The model's own time is not counted.

    python benchmarks/json_schema_backends.py                    # vocabulary 4096, 32 rows x 128 tokens
    python benchmarks/json_schema_backends.py --quick --no-write # smoke run, seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

SECTION = "json_schema_backends"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 1, "maximum": 150},
    "mood": {"enum": ["good", "bad"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "mood", "ok"]}


def replay(backend: str, tok, paths, bos: int) -> tuple[float, float]:
    """(construction seconds, mask seconds over all steps) of a fresh ``backend`` constraint."""
    import torch

    from lmlab.generate.json_backend import json_schema_constraint

    t0 = time.perf_counter()
    c = json_schema_constraint(SCHEMA, tok, backend=backend, prompt_len=1, max_new_tokens=100_000)
    build = time.perf_counter() - t0
    scores = torch.zeros(paths.shape[0], tok.vocab_size)
    masks = 0.0
    for t in range(paths.shape[1]):
        seq = torch.cat([torch.full((paths.shape[0], 1), bos), paths[:, :t]], dim=1)
        t0 = time.perf_counter()
        c(seq, scores)
        masks += time.perf_counter() - t0
    return build, masks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny corpus and vocabulary, seconds")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--markdown", type=Path, default=common.BENCHMARKS_MD)
    ap.add_argument("--no-write", action="store_true", help="print the report only")
    args = ap.parse_args()
    if args.quick:
        args.vocab_size, args.rows, args.tokens = common.QUICK_VOCAB, 4, 32

    import torch

    from lmlab.generate import generate
    from lmlab.generate.json_backend import json_schema_constraint
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    start = time.perf_counter()
    import importlib.metadata as md

    machine = f"{common.machine_line()}; llguidance {md.version('llguidance')}; torch {torch.__version__}"
    from lmlab.runtime import set_threads

    set_threads(1)
    lines = common.load_corpus(common.QUICK_MB if args.quick else 1.0)
    tok = train_tokenizer("bytelevel", lines, vocab_size=args.vocab_size)
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id)).eval()
    c = json_schema_constraint(SCHEMA, tok, backend="llguidance", prompt_len=1, max_new_tokens=args.tokens)
    out = generate(model, torch.tensor([[tok.bos_id]]), max_new_tokens=args.tokens, do_sample=True, seed=0,
                   num_return_sequences=args.rows, eos_token_id=c.eos, logits_processors=[c])
    paths = out[:, 1:]
    rows = []
    results = {b: replay(b, tok, paths, tok.bos_id) for b in ("lmlab", "llguidance")}
    steps = paths.shape[1]
    for backend, (build, masks) in results.items():
        ratio = masks / results["llguidance"][1]
        rows.append([backend, f"{build * 1000:.0f}", f"{masks / steps * 1000:.2f}", f"{masks:.2f}",
                     f"{ratio:.2f}x"])
    body = "\n".join([
        "## JSON-schema backends: mask time (`benchmarks/json_schema_backends.py`)", "",
        f"Machine: {machine}. Byte-level BPE, vocabulary {tok.vocab_size}; {args.rows} rows x {steps} steps "
        f"(sampled by an untrained gpt2-tiny through llguidance), replayed through each backend from cold "
        f"caches; one thread. Run took {time.perf_counter() - start:.0f} s.",
        f"Re-run: `python benchmarks/json_schema_backends.py --vocab-size {args.vocab_size} "
        f"--rows {args.rows} --tokens {args.tokens}`", "",
        common.markdown_table(["backend", "build ms", "ms per step (whole batch)", "total s",
                               "time / llguidance"], rows)])
    print(body)
    if not args.no_write:
        print(f"wrote {common.update_section(SECTION, body, args.markdown)}")


if __name__ == "__main__":
    main()
