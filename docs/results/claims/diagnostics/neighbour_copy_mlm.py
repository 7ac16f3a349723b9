import sys, torch, torch.nn.functional as F
from lmlab.models import build_model, get_preset
torch.manual_seed(0)
name = sys.argv[1]; pos = sys.argv[2]; lr=float(sys.argv[3])
cfg = get_preset(name, vocab_size=64, dropout=0.0, attn_dropout=0.0, max_positions=64, positions=pos, **eval('dict('+(sys.argv[4] if len(sys.argv)>4 else '')+')'))
model = build_model(cfg, heads=("mlm",))
opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
MASK=3
for step in range(int(sys.argv[5]) if len(sys.argv)>5 else 301):
    x = torch.randint(10, 64, (32, 32))
    x[:, 1::2] = x[:, 0::2]  # pairs: each odd token copies its left neighbour
    sel = torch.rand(x.shape) < 0.15
    inp = x.masked_fill(sel, MASK)
    labels = x.masked_fill(~sel, -100)
    out = model(input_ids=inp, labels=labels)
    opt.zero_grad(); out.loss.backward(); opt.step()
    if step % 100 == 0:
        acc = (out.logits.argmax(-1) == x[sel]).float().mean()
        print(step, round(out.loss.item(), 3), round(acc.item(), 3))
