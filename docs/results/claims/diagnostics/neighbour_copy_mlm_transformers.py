import torch
from transformers import BertConfig, BertForMaskedLM
torch.manual_seed(0)
cfg = BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64)
model = BertForMaskedLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
MASK=3
for step in range(301):
    x = torch.randint(10, 64, (32, 32)); x[:, 1::2] = x[:, 0::2]
    sel = torch.rand(x.shape) < 0.15
    out = model(input_ids=x.masked_fill(sel, MASK), labels=x.masked_fill(~sel, -100))
    opt.zero_grad(); out.loss.backward(); opt.step()
    if step % 50 == 0:
        print(step, round(out.loss.item(), 3), round((out.logits[sel].argmax(-1) == x[sel]).float().mean().item(), 3))
