"""Can the discriminator detect replacements that are exact unigram draws? The generator's samples
are replaced by tokens drawn from the batch itself (a perfect unigram generator); everything else is
lmlab's electra arm on IMDB (docs/results/claims/diagnostics/electra-imdb.toml, rotary positions).

    python docs/results/claims/diagnostics/electra_unigram_replacements.py [--set KEY=VALUE ...]

Prints the discriminator's AUC (chance 0.5) and the generator's signals every 50 steps."""
import json
import sys
import tempfile

import torch

from lmlab.objectives.electra import Electra
from lmlab.objectives.masking import IGNORE
from lmlab.train import pretrain

original = Electra.corrupt


def unigram_corrupt(self, model, inputs):
    gen_loss, logits, corrupted = original(self, model, inputs)
    selected = inputs["labels"] != IGNORE
    g = torch.Generator().manual_seed(int(inputs["sample_seed"].item()) % (2**31))
    pool = inputs["original_ids"].flatten()
    corrupted = corrupted.clone()
    corrupted[selected] = pool[torch.randint(0, pool.numel(), (int(selected.sum()),), generator=g)]
    return gen_loss, logits, corrupted


Electra.corrupt = unigram_corrupt
overrides = [a for a in sys.argv[1:] if a != "--set"]
out = tempfile.mkdtemp() + "/run"
pretrain("docs/results/claims/diagnostics/electra-imdb.toml", out, overrides=overrides, log=lambda m: None)
for line in open(out + "/metrics.jsonl"):
    r = json.loads(line)
    if r.get("step", 0) % 50 == 0:
        print({k: round(r[k], 3) for k in ("step", "gen_loss", "gen_acc", "gen_acc_guess", "disc_auc", "disc_loss")
               if k in r})
