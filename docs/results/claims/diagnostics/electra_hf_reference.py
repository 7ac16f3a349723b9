"""Reference: Hugging Face's own ELECTRA (ElectraForMaskedLM generator + ElectraForPreTraining
discriminator, shared embeddings, tied generator head) on the same IMDB windows, batch and schedule
as lmlab's electra arm (claims-imdb, width 128, 2 layers, learned positions): does its discriminator
leave "all original"?

    python docs/results/claims/diagnostics/electra_hf_reference.py STEPS GENERATOR_SIZE [MASK_PROB]

Prints the generator's accuracy on the [MASK]ed targets beside the most-frequent-token guess, and
the discriminator's loss, AUC and accuracy beside "all original", every 50 steps."""
import json
import math
import sys
import tempfile

import torch
from pathlib import Path
from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining
from lmlab.train.config import load_config
from lmlab.train.loop import Trainer
from lmlab.objectives.base import binary_auc
torch.set_num_threads(1); torch.manual_seed(0)
steps = int(sys.argv[1]); gen_size = float(sys.argv[2]); mask_rate = float(sys.argv[3]) if len(sys.argv) > 3 else 0.15
recipe = sys.argv[4] if len(sys.argv) > 4 else "docs/results/claims/diagnostics/electra-imdb.toml"
cfg = load_config(recipe, ["model.positions=learned"])
tr = Trainer(cfg, Path(tempfile.mkdtemp()), False, lambda m: None)
tr.setup()
tok = tr.model.tokenizer
V = tr.model_config.vocab_size
mask_id = tok.token_to_id["[MASK]"]
special = torch.tensor(sorted(tr.objective.special_ids))
D = 128
disc = ElectraForPreTraining(ElectraConfig(vocab_size=V, embedding_size=D, hidden_size=D, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=512, max_position_embeddings=128))
g = int(D * gen_size)
gen = ElectraForMaskedLM(ElectraConfig(vocab_size=V, embedding_size=D, hidden_size=g, num_hidden_layers=2,
                                       num_attention_heads=max(1, g // 32), intermediate_size=4 * g, max_position_embeddings=128))
gen.electra.embeddings = disc.electra.embeddings  # shared token/position embeddings (the paper)
gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
params = list({id(p): p for p in list(disc.parameters()) + list(gen.parameters())}.values())
opt = torch.optim.AdamW(params, lr=2e-3, betas=(0.9, 0.98), weight_decay=0.1)
warm = 30
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1, s / steps)))))
rng = torch.Generator().manual_seed(0)
for step in range(1, steps + 1):
    ids = tr.windows.batch((step - 1) * 32, 32).input_ids
    cand = ~torch.isin(ids, special)
    sel = cand & (torch.rand(ids.shape, generator=rng) < mask_rate)
    masked = ids.clone(); masked[sel & (torch.rand(ids.shape, generator=rng) < 0.85)] = mask_id
    labels = torch.full_like(ids, -100); labels[sel] = ids[sel]
    gout = gen(input_ids=masked, labels=labels)
    with torch.no_grad():
        sampled = torch.multinomial(torch.softmax(gout.logits[sel].float(), -1), 1, generator=rng).squeeze(-1)
    corrupted = ids.clone(); corrupted[sel] = sampled
    y = (corrupted != ids).long()
    dout = disc(input_ids=corrupted)
    logit = dout.logits[cand]; yt = y[cand]
    dloss = torch.nn.functional.binary_cross_entropy_with_logits(logit, yt.float())
    loss = gout.loss + 50 * dloss
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); sched.step()
    if step % 50 == 0:
        shown = masked[sel] == ids[sel]
        pred = gout.logits[sel].argmax(-1)
        hid = ~shown
        acc = float((pred[hid] == ids[sel][hid]).float().mean())
        guess = float(torch.bincount(ids[sel][hid]).max()) / int(hid.sum())
        print(json.dumps({"step": step, "gen_loss": round(float(gout.loss), 3), "gen_acc": round(acc, 3), "gen_guess": round(guess, 3),
                          "disc_loss": round(float(dloss), 3), "disc_auc": round(float(binary_auc(logit.detach(), yt)), 3),
                          "disc_acc": round(float(((logit > 0).long() == yt).float().mean()), 3), "all_orig": round(1 - float(yt.float().mean()), 3)}), flush=True)
