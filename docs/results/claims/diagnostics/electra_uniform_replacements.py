import torch, json
from lmlab.objectives.electra import Electra
from lmlab.objectives.masking import IGNORE
from lmlab.train import pretrain
orig = Electra.corrupt
def uniform(self, model, inputs):
    gen_loss, logits, corrupted = orig(self, model, inputs)
    selected = inputs["labels"] != IGNORE
    g = torch.Generator().manual_seed(int(inputs["sample_seed"].item()) % (2**31))
    corrupted = corrupted.clone()
    corrupted[selected] = torch.randint(10, self.vocab_size, (int(selected.sum()),), generator=g)
    return gen_loss, logits, corrupted
Electra.corrupt = uniform
said = []
s = pretrain("/work/main/configs/electra-tiny.toml", "/tmp/el_uniform", overrides=["train.max_steps=150", "train.eval_every=75", "train.threads=1"], log=said.append)
print("\n".join(l for l in said if l.startswith("step")))
