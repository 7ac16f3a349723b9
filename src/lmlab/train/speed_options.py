"""A pretraining run's speed options: attention kernel, activation checkpointing,
``torch.compile``, and the model FLOPs and device peak behind the MFU column."""

from __future__ import annotations

from lmlab.errors import LmlabError
from lmlab.train.device import peak_tflops


def apply_speed_options(trainer, objective_cls) -> None:
    """Activation checkpointing, torch.compile, and the FLOPs and peak behind the MFU column, for
    the :class:`lmlab.train.loop.Trainer` ``trainer`` once its model is built."""
    cfg, t = trainer.cfg, trainer.cfg.train
    flex = t.attention == "flex" or (t.attention == "auto" and trainer.machine.device.type == "cuda")
    trainer.model.attention_backend = "flex" if flex else "sdpa"
    if flex:
        dropout = getattr(trainer.model_config, "attn_dropout", 0.0)
        trainer.log("attention: packed documents on FlexAttention's block-sparse kernel (train.attention)"
                 + (f"; training uses the dense kernel, since FlexAttention has no attention dropout "
                    f"(model.attn_dropout={dropout}; set it to 0 to train on flex)" if dropout else ""))
    if t.activation_checkpointing:
        from lmlab.models.activation_checkpointing import enable_activation_checkpointing

        n = enable_activation_checkpointing(trainer.model)
        trainer.log(f"activation checkpointing: {n} Transformer block(s) recompute their activations "
                 "in the backward pass" if n else
                 "warning: train.activation_checkpointing found no Transformer block in this model")
    if t.compile:
        import torch._dynamo

        # an MLM head given labels but no label_positions (UniLM) selects the masked rows on the
        # device: a data-dependent shape the graph can hold
        torch._dynamo.config.capture_dynamic_output_shape_ops = True
        trainer.model.compile(backend=t.compile_backend)
        trainer.log(f"compile: torch.compile, backend {t.compile_backend} (the first steps, and the "
                 "first evaluation, include compiling)")
    rows = t.batch_size * t.grad_accum * trainer.info.world_size
    try:
        trainer.step_flops = objective_cls.step_flops(trainer.model_config, t.seq_len, rows,
                                                   cfg.objective.params)
    except LmlabError:
        trainer.step_flops = None
    trainer.peak = peak_tflops(trainer.machine.device, trainer.machine.dtype, t.peak_tflops)
    if trainer.step_flops and trainer.peak:
        trainer.log(f"MFU: {trainer.step_flops:.3g} model FLOPs per step ({cfg.objective.name}'s count) "
                 f"against {trainer.peak:g} TFLOP/s per device")
    elif trainer.step_flops:
        trainer.log(f"MFU: not logged, the peak of this {trainer.machine.device.type} is unknown (set "
                 "train.peak_tflops); the tflops column shows the achieved model TFLOP/s")

