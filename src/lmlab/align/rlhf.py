"""RLHF for small decoders: a reward model, then the policy trained on its own samples.

The recipe of Ziegler et al. 2019 and InstructGPT (Ouyang et al. 2022), with the policy-gradient
step kept simple (REINFORCE with a leave-one-out baseline, "RLOO", Ahmadian et al. 2024, instead of
PPO's clipped updates and value network):

0. **Supervised warm-up** (``sft_steps``, InstructGPT's step 1): the policy learns to write the
   chosen responses (mean negative log-likelihood of their tokens). A model that would never
   sample a response like the preferred ones cannot be taught by rewarding its samples; the
   warmed-up model is the reference of the later phase, as InstructGPT's SFT model is.
1. **Reward model** (:mod:`lmlab.align.reward`): a copy of the starting model with a scalar head,
   trained on the preference pairs with the Bradley-Terry loss through the training engine;
   its pairwise accuracy on the dev pairs is reported before and after.
2. **Policy**: each step, for every prompt of the batch, sample ``samples`` responses from the
   policy (at ``temperature``, at most ``max_new_tokens``, stopping at EOS with ``eos``); score
   each with the reward model and penalise the distance to the frozen reference::

       R(x, y) = r(x, y) − β · (log π(y|x) − log π_ref(y|x))       (a KL estimate per sample)
       A_i = R_i − mean_{j≠i} R_j                                    (the other samples' mean)
       L = −mean(A_i · log π(y_i|x))

   so the policy moves toward responses the reward model prefers, no further from the reference
   than ``β`` allows. The KL logged (``kl``) is the estimator ``k3 = (ρ − 1) − log ρ`` with
   ``ρ = π_ref(y|x) / π(y|x)`` (Schulman 2020, "Approximating KL divergence"): unbiased for
   samples of the policy, like the per-sample log ratio in the penalty, but never negative (the log
   ratio alone is negative whenever the sampled responses happen to be likelier under the
   reference, so its mean over a batch could show a "negative KL").
3. **Dev**: the mean reward of the policy's greedy responses to the dev prompts, the share of dev
   pairs whose greedy response is the chosen one, and DPO's implicit-reward numbers of the policy
   against the reference (margin, win rate, accuracy), as for ``dpo``.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor, nn

from lmlab.align.logprobs import IGNORE, bos_of, decoder_row, end_token, position_limit, response_logprobs
from lmlab.align.loop import (
    DEV_SHOWN,
    AlignResult,
    PairSet,
    Setup,
    dev_numbers,
    frozen_reference,
    shown,
)
from lmlab.align.reward import RewardModel, bradley_terry_loss
from lmlab.errors import LmlabError
from lmlab.models.config import max_length_for
from lmlab.models.facts import facts_of
from lmlab.tasks import collate


def reward_accuracy(rm: RewardModel, pairs: PairSet, batch_size: int) -> dict[str, float]:
    """The reward model's Bradley-Terry loss and pairwise accuracy on ``pairs``."""
    was = rm.training
    rm.eval()
    chosen, rejected = [], []
    with torch.no_grad():
        for k in range(0, len(pairs), batch_size):
            idx = list(range(k, min(k + batch_size, len(pairs))))
            r = rm(collate([pairs.rows[i][0] for i in idx] + [pairs.rows[i][1] for i in idx], pairs.pad,
                           pairs.device))
            chosen.append(r[: len(idx)]), rejected.append(r[len(idx):])
    rm.train(was)
    c, r = torch.cat(chosen), torch.cat(rejected)
    return {"loss": float(bradley_terry_loss(c, r)), "accuracy": float((c > r).float().mean())}


def supervised_warmup(run: Setup, train_set: PairSet) -> None:
    """``sft_steps`` steps of maximum likelihood on the chosen responses (the prompt is not scored)."""
    cfg, model = run.cfg, run.model
    engine = run.engine([model], cfg.lr, cfg.sft_steps)
    run.say(f"supervised warm-up: {cfg.sft_steps} steps on the chosen responses")

    def micro_batch(idx):
        def run_it():
            batch = collate([train_set.rows[i][0] for i in idx], train_set.pad, train_set.device)
            n_tokens = (batch["labels"] != IGNORE).sum()
            return -response_logprobs(model, batch).sum() / n_tokens
        return run_it

    model.train(cfg.dropout)
    run.run_steps(engine, cfg.sft_steps, micro_batch, train_set.lengths(), "supervised warm-up", "sft")
    model.eval()


def train_reward_model(run: Setup, train_set: PairSet, dev_set: PairSet) -> tuple[RewardModel, dict]:
    cfg = run.cfg
    rm = RewardModel(run.model).to(run.machine.device)
    rm.train(cfg.dropout)
    before = reward_accuracy(rm, dev_set, cfg.eval_batch_size)
    engine = run.engine([rm], cfg.reward_lr, cfg.reward_steps)
    run.say(f"reward model: {cfg.reward_steps} Bradley-Terry steps, dev pairwise accuracy "
            f"{before['accuracy']:.4f} before")

    def micro_batch(idx):
        def run_it():
            r = rm(collate([train_set.rows[i][0] for i in idx] + [train_set.rows[i][1] for i in idx],
                           train_set.pad, train_set.device))
            c, rj = r[: len(idx)], r[len(idx):]
            return bradley_terry_loss(c, rj), {"accuracy": float((c > rj).float().mean())}
        return run_it

    run.run_steps(engine, cfg.reward_steps, micro_batch, train_set.lengths(), "reward model", "reward")
    rm.eval()
    for p in rm.parameters():
        p.requires_grad_(False)
    after = reward_accuracy(rm, dev_set, cfg.eval_batch_size)
    run.record({"phase": "reward", "step": cfg.reward_steps, **{f"dev_{k}": v for k, v in after.items()}})
    run.say(f"reward model: dev pairwise accuracy {before['accuracy']:.4f} -> {after['accuracy']:.4f}, "
            f"Bradley-Terry loss {before['loss']:.4f} -> {after['loss']:.4f}")
    return rm, {"before": before, "after": after}


class Sampler:
    """Responses of a decoder to prompts: sampled for training, greedy for evaluation."""

    def __init__(self, model: nn.Module, cfg):
        tok = model.tokenizer
        self.model, self.cfg = model, cfg
        self.head = bos_of(tok)
        self.limit = position_limit(model, cfg.max_length)
        end = end_token(tok, model)
        self.stop = [end] if cfg.eos and end is not None else []
        self.device = next(model.parameters()).device
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.prompt_cache: dict[str, list[int]] = {}

    def prompt(self, text: str) -> list[int]:
        if text not in self.prompt_cache:
            room = self.limit - len(self.head) - self.cfg.max_new_tokens
            ids = self.model.tokenizer.encode(text)
            self.prompt_cache[text] = ids[max(0, len(ids) - room):]
        return self.prompt_cache[text]

    @torch.no_grad()
    def responses(self, text: str, n: int, sample: bool, generator: torch.Generator | None = None
                  ) -> list[list[int]]:
        """``n`` responses to ``text``: sampled (from ``generator``, else the sampler's own) or greedy."""
        from lmlab.generate.search import generate

        ids = torch.tensor([self.head + self.prompt(text)], device=self.device)
        was = self.model.training
        self.model.eval()
        try:
            out = generate(self.model, ids, max_new_tokens=self.cfg.max_new_tokens, do_sample=sample,
                           temperature=self.cfg.temperature, num_return_sequences=n, eos_token_id=self.stop,
                           pad_token_id=self.stop[0] if self.stop else None,
                           generator=generator or self.gen)
        finally:
            self.model.train(was)
        rows = []
        for seq in out[:, ids.shape[1]:].tolist():
            if self.stop and self.stop[0] in seq:
                seq = seq[: seq.index(self.stop[0]) + 1]
            rows.append(seq or [self.stop[0]])
        return rows

    def row(self, text: str, response: list[int]) -> dict:
        return decoder_row(self.head, self.prompt(text), response, self.limit)


def rollout_numbers(rm: RewardModel, sampler: Sampler, pairs: PairSet, batch_size: int) -> dict[str, float]:
    """On the dev prompts: the mean reward of the policy's greedy responses (``reward``) and of one
    sampled response each (``sample_reward``, the quantity the policy phase maximises; the same
    seed at every evaluation), and the share of greedy responses that are the chosen one."""
    tok = sampler.model.tokenizer
    gen = torch.Generator(device=sampler.device).manual_seed(sampler.cfg.seed + 1)
    greedy, sampled, hits = [], [], 0

    def score(chunk, answers) -> Tensor:
        with torch.no_grad():
            return rm(collate([sampler.row(p.prompt, a) for p, a in zip(chunk, answers)], pairs.pad,
                              pairs.device)).float()

    for k in range(0, len(pairs), batch_size):
        chunk = pairs.pairs[k:k + batch_size]
        answers = [sampler.responses(p.prompt, 1, sample=False)[0] for p in chunk]
        hits += sum(tok.decode(a, skip_special_tokens=True).strip() == p.chosen.strip()
                    for a, p in zip(answers, chunk))
        greedy.append(score(chunk, answers))
        sampled.append(score(chunk, [sampler.responses(p.prompt, 1, True, gen)[0] for p in chunk]))
    return {"reward": float(torch.cat(greedy).mean()), "sample_reward": float(torch.cat(sampled).mean()),
            "chosen_rate": hits / len(pairs)}


def check_policy(model, cfg, device) -> None:
    """Refuse, before any weight is read or any training, what RLHF cannot run (``model``: a model,
    or a directory's facts, :func:`lmlab.loading.model_facts`): a model that is not a decoder (it
    samples responses), and a policy micro-batch that cannot fit (:mod:`lmlab.budget`):
    ``batch_size x samples`` rows of up to ``max_length`` tokens, trained through the policy (its
    activations) and read by the frozen reference (its logits)."""
    from lmlab import budget

    facts = facts_of(model)
    if facts.architecture != "decoder":
        raise LmlabError("rlhf samples responses from a decoder; this checkpoint is "
                         f"{'an encoder-decoder' if facts.architecture == 'seq2seq' else 'not a decoder'}",
                         "use --method dpo for T5 and BART checkpoints")
    mc = facts.config
    sizes = [getattr(mc, name, None) for name in ("vocab_size", "d_model", "n_layers")]
    if not all(isinstance(n, int) for n in sizes):
        return  # a config that does not say its sizes: the check runs again once the model is loaded
    vocab, width, layers = sizes
    rows, length = cfg.batch_size * cfg.samples, max_length_for(mc, None, cfg.max_length)
    need = budget.activation_bytes(rows * length, vocab, width, layers)  # the policy, trained
    need += budget.tensor_bytes(rows, length, vocab)                      # the reference's logits
    budget.require_fits(need, f"an RLHF micro-batch of {cfg.batch_size:,} prompts x {cfg.samples:,} samples "
                        f"of up to {length:,} tokens", "lower --samples or --batch-size (raise --grad-accum "
                        "to keep the batch), or --max-length", device)


def kl_estimate(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per sample, ``k3 = (ρ − 1) − log ρ`` with ``ρ = π_ref / π`` (sequence log-probabilities):
    an estimate of KL(π ‖ π_ref) from samples of π that is never negative (``e^x ≥ 1 + x``). The
    log ratio is clamped to ±30 so that a response the reference finds far likelier cannot
    overflow float64."""
    log_ratio = (ref_logp.double() - logp.double()).clamp(-30.0, 30.0)
    return (torch.expm1(log_ratio) - log_ratio).clamp_min(0.0)


class PolicySteps:
    """What the fit loop runs in the policy phase: each micro-batch samples ``samples`` responses per
    prompt, scores them with the reward model and the frozen reference, and returns the RLOO loss;
    the dev evaluation adds the greedy and sampled rewards to DPO's numbers."""

    def __init__(self, run: Setup, reference: nn.Module, rm: RewardModel, dev_set: PairSet,
                 prompts: list[str], total: int):
        cfg = run.cfg
        self.run, self.reference, self.rm, self.dev_set, self.prompts, self.total = \
            run, reference, rm, dev_set, prompts, total
        self.sampler = Sampler(run.model, cfg)
        self.dev_ref = dev_set.all_logprobs(reference, cfg.eval_batch_size, run.machine.autocast)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.order: list[int] = []
        self.progress = None

    def evaluate(self, step: int) -> dict[str, float]:
        run, cfg = self.run, self.run.cfg
        policy = self.dev_set.all_logprobs(run.model, cfg.eval_batch_size, run.machine.autocast)
        numbers = {**dev_numbers(policy, self.dev_ref, cfg),
                   **rollout_numbers(self.rm, self.sampler, self.dev_set, cfg.eval_batch_size)}
        run.record({"phase": "policy", "step": step, **{f"dev_{k}": v for k, v in numbers.items()}})
        return numbers

    def evaluate_during(self, step: int) -> dict[str, float]:
        """:meth:`evaluate`, said beside the progress display, the policy back in training mode."""
        final = self.final = self.evaluate(step)
        self.progress.write(f"step {step}: dev greedy reward {final['reward']:.4f}, sampled reward "
                            f"{final['sample_reward']:.4f}, chosen rate "
                            f"{final['chosen_rate']:.4f}, {shown(final, DEV_SHOWN)}")
        self.run.model.train(self.run.cfg.dropout)
        return final

    def rollouts(self, batch_prompts: list[str]):
        """Sample, score and return the function the engine runs for one micro-batch of prompts."""
        cfg, sampler = self.run.cfg, self.sampler
        rows = [sampler.row(text, resp) for text in batch_prompts
                for resp in sampler.responses(text, cfg.samples, sample=True)]
        batch = collate(rows, self.dev_set.pad, self.dev_set.device)
        with torch.no_grad():
            reward = self.rm(batch).float()
            ref_lp = response_logprobs(self.reference, batch).float()
        return lambda: self.loss(batch, reward, ref_lp, len(batch_prompts))

    def loss(self, batch: dict, reward: Tensor, ref_lp: Tensor, n_prompts: int):
        cfg = self.run.cfg
        logp = response_logprobs(self.run.model, batch)
        kl = logp.detach().float() - ref_lp
        ret = (reward - cfg.beta * kl).view(n_prompts, cfg.samples)
        baseline = (ret.sum(1, keepdim=True) - ret) / (cfg.samples - 1)
        advantage = (ret - baseline).view(-1)
        loss = -(advantage * logp.float()).mean()
        kl_logged = float(kl_estimate(logp.detach(), ref_lp).mean())  # k3: never negative
        return loss, {"reward": float(reward.mean()), "kl": kl_logged}

    def micro_batches(self, step: int) -> list:
        cfg, micro = self.run.cfg, []
        for _ in range(cfg.grad_accum):
            if len(self.order) < cfg.batch_size:
                self.order += torch.randperm(len(self.prompts), generator=self.gen).tolist()
            chunk, self.order = self.order[: cfg.batch_size], self.order[cfg.batch_size:]
            micro.append(self.rollouts([self.prompts[i] for i in chunk]))
        return micro

    def after_step(self, step: int, done, seconds: float) -> dict:
        self.progress.update(step, [f"reward {done.metrics['reward']:.4f}", f"kl {done.metrics['kl']:.4f}"],
                             reward=f"{done.metrics['reward']:.3f}")
        self.run.log_train(step, self.total, done, phase="policy")
        return {}


def rlhf(run: Setup) -> AlignResult:
    cfg, model, say = run.cfg, run.model, run.say
    check_policy(model, cfg, run.machine.device)  # a directory's facts were checked in setup; a model is here
    t0 = time.perf_counter()
    train_set, dev_set = PairSet(run.train, model, cfg), PairSet(run.dev, model, cfg)
    prompts = sorted({p.prompt for p in run.train})
    total = cfg.max_steps if cfg.max_steps is not None else \
        cfg.epochs * math.ceil(len(prompts) / (cfg.batch_size * cfg.grad_accum))
    say(f"align: RLHF, {len(train_set)} train / {len(dev_set)} dev pairs ({len(prompts)} train prompts), "
        f"reward model {cfg.reward_steps} steps, then {total} policy steps of "
        f"{cfg.batch_size * cfg.grad_accum} prompts x {cfg.samples} samples, KL weight beta {cfg.beta}, "
        f"device {run.machine.device}")
    if cfg.sft_steps:
        supervised_warmup(run, train_set)
    reference = frozen_reference(model)                 # the policy phase's start (after any warm-up)
    rm, rm_numbers = train_reward_model(run, train_set, dev_set)
    steps = PolicySteps(run, reference, rm, dev_set, prompts, total)
    start = steps.final = steps.evaluate(0)
    say(f"policy step 0 (the reference itself): greedy reward {start['reward']:.4f}, sampled reward "
        f"{start['sample_reward']:.4f}, chosen rate "
        f"{start['chosen_rate']:.4f}, {shown(start, DEV_SHOWN)}")
    engine = run.engine([model], cfg.lr, total)
    steps.progress = run.progress(total, "align rlhf")
    model.train(cfg.dropout)
    run.fit(engine, total, steps.micro_batches, steps.after_step, steps.evaluate_during)
    steps.progress.close()
    model.eval()
    final = steps.final
    summary = {"method": "rlhf", "steps": total, "train_pairs": len(train_set), "dev_pairs": len(dev_set),
               "reward_model": rm_numbers, "start": start, "dev": final,
               "elapsed_s": time.perf_counter() - t0, "config": cfg.to_dict()}
    run.write(model, final, summary)
    return AlignResult(final, start, model, run.out, total, run.history, reference,
                       {"reward_model": rm, "reward_numbers": rm_numbers})
