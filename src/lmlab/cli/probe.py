"""`lmlab probe`: what a pretrained model knows (fill in a blank; the same word in two contexts)."""

from __future__ import annotations

import json

from lmlab.cli.common import add_group
from lmlab.values import count_flag, path_flag, text_flag

DESCRIPTION = """\
Probe what pretraining taught a model.

  fill-mask   the model's top guesses for a blank written [MASK]: an encoder scores it with its
              MLM head (it reads both sides), a decoder predicts the next token after the text
              before the blank, a T5 encoder-decoder fills its first sentinel.
  similarity  the cosine between the vectors of one word in different contexts, at every layer,
              beside a static embedding (word2vec, SVD or the input embedding table: one vector
              per word, so always 1.0). Lower means the context changed the word more."""

FILL_EXAMPLES = """\
  lmlab probe fill-mask --checkpoint runs/bert --text "Stanford University is located in [MASK], California."
  lmlab probe fill-mask --checkpoint runs/gpt --text "The capital of France is [MASK]" --top-k 10
  lmlab probe fill-mask --checkpoint runs/t5 --text "The film was [MASK] and I loved it." --json"""

SIM_EXAMPLES = """\
  lmlab import --hf ~/models/all-MiniLM-L6-v2 --out ck/minilm
  lmlab probe similarity --checkpoint ck/minilm --word bat \\
      --text "A bat flew out of the cave." --text "He hit the ball with a bat."
  lmlab probe similarity --checkpoint runs/bert --word record --text "I record the record." --json"""


def register(sub) -> None:
    from lmlab.cli.common import add_command

    group, cmds = add_group(sub, "probe", "probe a model: fill-mask, contextual word similarity", DESCRIPTION)
    p = add_command(cmds, "fill-mask", "top-k guesses for a [MASK] blank", DESCRIPTION, FILL_EXAMPLES)
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="lmlab checkpoint, pretraining run directory (its newest checkpoint) or HF model dir")
    p.add_argument("--text", type=text_flag, required=True, help="a sentence with one [MASK]")
    p.add_argument("--top-k", type=count_flag, default=5, metavar="K", help="how many guesses to show")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_fill_mask)
    p = add_command(cmds, "similarity", "the same word in different contexts, per layer", DESCRIPTION,
                    SIM_EXAMPLES)
    p.add_argument("--checkpoint", type=path_flag, required=True, metavar="DIR",
                   help="lmlab checkpoint, pretraining run directory (its newest checkpoint) or HF model dir")
    p.add_argument("--word", type=text_flag, required=True, help="the word to compare (whole word, any case)")
    p.add_argument("--text", type=text_flag, required=True, action="append", metavar="SENTENCE",
                   help="a sentence using the word (repeat; two occurrences in one sentence count too)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_similarity)


def _load(path: str, check=None):
    from lmlab.loading import load_model

    return load_model(path, check=check)


def run_fill_mask(args) -> int:
    from lmlab.probe import check_can_fill_mask, fill_mask

    guesses = fill_mask(_load(args.checkpoint, check_can_fill_mask), args.text, args.top_k)
    if args.json:
        print(json.dumps([{"token": g.token, "text": g.text, "probability": g.probability} for g in guesses],
                         ensure_ascii=False, indent=2))
        return 0
    print(f"{'rank':>4}  {'probability':>11}  token")
    for i, g in enumerate(guesses, 1):
        print(f"{i:>4}  {g.probability:>11.4f}  {g.text!r}")
    return 0


def run_similarity(args) -> int:
    from lmlab.probe import word_similarity

    result = word_similarity(_load(args.checkpoint), args.word, args.text)
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
        return 0
    print(f"word {result['word']!r}: cosine between its vectors in two contexts "
          "(layer 0 = embeddings; static embedding = 1.000)")
    for pair in result["pairs"]:
        print(f"  {pair['a']}\n  {pair['b']}")
        print("    " + "  ".join(f"L{i} {c:.3f}" for i, c in enumerate(pair["cosine_by_layer"]))
              + f"   static {pair['static']:.3f}")
    return 0
