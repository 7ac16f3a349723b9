import sys, csv, torch, random
from lmlab.loading import load_model
def read(p, n=None):
    rows = list(csv.reader(open(p), delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    rows = rows[:n] if n else rows
    return [r[0] for r in rows], [int(r[1]) for r in rows]
tr_x, tr_y = read('/work/shared/data/glue/sst2/train.tsv', 2000)
dv_x, dv_y = read('/work/shared/data/glue/sst2/dev.tsv')
def batchify(model, texts, cls):
    tok = model.tokenizer
    encs = [tok.encode_plus(t, max_length=64, truncation=True, add_special_tokens=cls).ids for t in texts]
    L = max(map(len, encs)); pad = tok.role_id("pad") or 0
    ids = torch.full((len(encs), L), pad); mask = torch.zeros(len(encs), L, dtype=torch.long)
    for i, e in enumerate(encs): ids[i, :len(e)] = torch.tensor(e); mask[i, :len(e)] = 1
    return ids, mask
def run(path, pooling, lr=5e-4, epochs=10, seed=0):
    torch.manual_seed(seed); random.seed(seed)
    model = load_model(path); model.train()
    d = model.config.d_model
    head = torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Linear(d, 2))
    params = [p for n, p in model.named_parameters() if not n.startswith("heads.")] + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    steps = epochs * ((len(tr_x) + 31) // 32); k = 0
    def feats(ids, mask):
        out = model.encode(ids, mask)
        h = out.last_hidden_state if model.architecture == "seq2seq" else out[0]  # T5: the encoder's states
        if pooling == "cls": return h[:, 0]
        m = mask[..., None].float(); return (h * m).sum(1) / m.sum(1)
    best = 0
    for ep in range(epochs):
        order = list(range(len(tr_x))); random.shuffle(order)
        model.train(); head.train()
        for i in range(0, len(order), 32):
            idx = order[i:i + 32]
            ids, mask = batchify(model, [tr_x[j] for j in idx], pooling == "cls")
            lr_now = lr * min(1, (k + 1) / (0.1 * steps)) * max(0.0, (steps - k) / steps); k += 1
            for g in opt.param_groups: g["lr"] = lr_now
            loss = torch.nn.functional.cross_entropy(head(feats(ids, mask)), torch.tensor([tr_y[j] for j in idx]))
            opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
        model.eval(); head.eval(); correct = 0
        with torch.no_grad():
            for i in range(0, len(dv_x), 128):
                ids, mask = batchify(model, dv_x[i:i+128], pooling == "cls")
                correct += int((head(feats(ids, mask)).argmax(-1) == torch.tensor(dv_y[i:i+128])).sum())
        best = max(best, correct / len(dv_x))
    return best
for path in sys.argv[2:]:
    print(path.split('/')[3], sys.argv[1], round(run(path, sys.argv[1]), 4), flush=True)
