import csv
import os
import sys

import torch
from lmlab.loading import load_model
torch.manual_seed(0)
def read(p, n=None):
    rows = list(csv.reader(open(p), delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    rows = rows[:n] if n else rows
    return [r[0] for r in rows], torch.tensor([int(r[1]) for r in rows])
tr_x, tr_y = read(os.path.join(os.environ.get('LMLAB_DATA', '../shared/data'), 'glue/sst2/train.tsv'), 2000)
dv_x, dv_y = read(os.path.join(os.environ.get('LMLAB_DATA', '../shared/data'), 'glue/sst2/dev.tsv'))
def feats(model, texts):
    tok = model.tokenizer; out_cls, out_mean = [], []
    model.eval()
    with torch.no_grad():
        for t in texts:
            enc = tok.encode_plus(t, max_length=64, truncation=True)
            ids = torch.tensor([enc.ids])
            if model.architecture == "seq2seq":  # the encoder's states; no [CLS]: its first token
                h = model.encode(ids, torch.ones_like(ids)).last_hidden_state[0]
                out_cls.append(h[0]); out_mean.append(h.mean(0))
            elif model.architecture == "encoder":
                h = model.encode(ids, torch.ones_like(ids))[0][0]
                out_cls.append(h[0]); out_mean.append(h.mean(0))
            else:
                h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
                out_cls.append(h[-1]); out_mean.append(h.mean(0))
    return torch.stack(out_cls), torch.stack(out_mean)
def probe(Xtr, ytr, Xdv, ydv):
    mu, sd = Xtr.mean(0), Xtr.std(0) + 1e-6
    Xtr, Xdv = (Xtr - mu) / sd, (Xdv - mu) / sd
    best = 0
    for wd in (1e-3, 1e-2, 1e-1):
        W = torch.zeros(Xtr.shape[1], 2, requires_grad=True); b = torch.zeros(2, requires_grad=True)
        opt = torch.optim.LBFGS([W, b], max_iter=200)
        def closure():
            opt.zero_grad(); l = torch.nn.functional.cross_entropy(Xtr @ W + b, ytr) + wd * (W ** 2).sum(); l.backward(); return l
        opt.step(closure)
        best = max(best, float(((Xdv @ W + b).argmax(-1) == ydv).float().mean()))
    return best
for path in sys.argv[1:]:
    m = load_model(path)
    c1, m1 = feats(m, tr_x); c2, m2 = feats(m, dv_x)
    print(path.split('/')[-3] if 'checkpoints' in path else path, "cls/last", round(probe(c1, tr_y, c2, dv_y), 4), "mean", round(probe(m1, tr_y, m2, dv_y), 4), flush=True)
