"""A torchtitan config module for an autoplan plan (written by ``autoplan emit``; checked against torchtitan 0.3.0).

torchtitan 0.3 takes its job as a Python function returning ``Trainer.Config``
(``torchtitan/config/manager.py``: ``--module <importable module> --config <function>``); TOML job
files are gone. This module's ``autoplan_config`` builds the model (a Llama-style decoder with
the model file's sizes, from torchtitan's own building blocks; with experts, its MoE layer in
every block) and the plan's parallelism, batch and recomputation. Run it with torchtitan_launch.sh, or:

    PYTHONPATH=<this dir> torchrun ... -m torchtitan.train --module torchtitan_config --config autoplan_config

Command-line overrides still apply (``--training.steps 1000``, ``--hf_assets_path <tokenizer dir>``):
torchtitan_launch.sh passes the data, the tokenizer, the length and where checkpoints go. Run
directly, the module trains on torchtitan's bundled ``c4_test`` sample: a smoke test.
The learning rate warms up linearly and decays with a cosine to ``min_lr_factor`` of the peak
(the model's published recipe where autoplan knows one); checkpoints (model, optimizer, data
position) are saved every ``checkpoint.interval`` steps and resumed from; TensorBoard logs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn
from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.quantization.float8 import Float8LinearConverter
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import (
    get_attention_config,
    make_ffn_config,
    make_gqa_config,
    make_moe_config,
    make_routed_experts_config,
    make_router_config,
)
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
from torchtitan.models.llama3.parallelize import parallelize_llama
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock
from torchtitan.models.qwen3.parallelize import parallelize_qwen3
from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

# ---- the plan (autoplan emit writes these values) ----
MODEL: dict[str, Any] = {
    "name": "model",
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 4,
    "head_dim": 16,
    "ffn_hidden_dim": 256,
    "vocab_size": 128,
    "rope_theta": 10000.0,
    "max_seq_len": 64,
    "tie_embeddings": False,
    "num_experts": 0,
    "top_k": 0,
}
PARALLELISM: dict[str, Any] = {}
TRAINING: dict[str, Any] = {}
OPTIMIZER: dict[str, Any] = {"lr": 3e-4}
LR_SCHEDULE: dict[str, Any] = {"warmup_steps": 10, "decay_type": "cosine"}
ACTIVATION_CHECKPOINT = "none"
FLOAT8 = False
# ---- end of the plan ----

NORM_EPS = 1e-5
_INIT = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
_NORM_INIT = {"weight": nn.init.ones_}
_EXPERT_INIT = {name: _INIT["weight"] for name in ("w1_EFD", "w2_EDF", "w3_EFD")}


def mlp() -> dict[str, Any]:
    """A block's MLP: the SwiGLU feed-forward, or with experts torchtitan's MoE layer (E SwiGLU
    experts of the same hidden size; softmax router, top k, renormalized as Mixtral routes; no
    load-balancing bias)."""
    dim, hidden, experts, top_k = MODEL["dim"], MODEL["ffn_hidden_dim"], MODEL["num_experts"], MODEL["top_k"]
    if not experts:
        return {"feed_forward": make_ffn_config(dim=dim, hidden_dim=hidden, w1_param_init=_INIT, w2w3_param_init=_INIT)}
    router = make_router_config(
        dim=dim,
        num_experts=experts,
        gate_param_init=_INIT,
        top_k=top_k,
        score_func="softmax",
        route_norm=True,
    )
    routed = make_routed_experts_config(
        dim=dim,
        hidden_dim=hidden,
        num_experts=experts,
        top_k=top_k,
        param_init=_EXPERT_INIT,
        comm_backend="standard",
    )
    return {"moe": make_moe_config(num_experts=experts, router=router, routed_experts=routed, load_balance_coeff=None)}


def model_spec() -> ModelSpec:
    """A Llama-style decoder (SwiGLU, RMSNorm, RoPE, FlexAttention) with the model file's sizes;
    with experts, torchtitan's Qwen3 decoder classes (their blocks take an MoE layer) without QK norms.
    The Qwen3 decoder's attention names its head size: ``Qwen3Model.Config.get_nparams_and_flops``
    (models/qwen3/model.py), which ``Trainer.__init__`` calls, asserts
    ``self.layers[0].attention.head_dim is not None``, and torchtitan's own Qwen3 MoE flavors pass
    ``head_dim`` to ``make_gqa_config`` (models/qwen3/__init__.py, ``_build_qwen3_moe_layers``); the
    Llama3 decoder counts with ``dim // n_heads`` and is left to derive it (``GQAttention``)."""
    dim, heads, head_dim = MODEL["dim"], MODEL["n_heads"], MODEL["head_dim"]
    moe = bool(MODEL["num_experts"])
    block, decoder = (Qwen3TransformerBlock, Qwen3Model) if moe else (Llama3TransformerBlock, Llama3Model)
    rope = ComplexRoPE.Config(dim=head_dim, max_seq_len=MODEL["max_seq_len"], theta=MODEL["rope_theta"])
    layers = [
        block.Config(
            attention_norm=RMSNorm.Config(normalized_shape=dim, eps=NORM_EPS, param_init=_NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=dim, eps=NORM_EPS, param_init=_NORM_INIT),
            attention=make_gqa_config(
                dim=dim,
                n_heads=heads,
                n_kv_heads=MODEL["n_kv_heads"],
                head_dim=head_dim if moe else None,
                wqkv_param_init=_INIT,
                wo_param_init=_INIT,
                inner_attention=get_attention_config("flex"),
                fuse_qkv=True,
                rope=rope,
            ),
            **mlp(),
        )
        for _ in range(MODEL["n_layers"])
    ]
    vocab = MODEL["vocab_size"]
    model = decoder.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, eps=NORM_EPS, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_INIT),
        layers=layers,
        enable_weight_tying=MODEL["tie_embeddings"],
    )
    if FLOAT8:  # the layers' linears in float8 (torchao, rowwise scaling); the output layer stays bf16
        model = Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled=True).build().convert(model)
    return ModelSpec(
        name="qwen3" if moe else "llama3",
        flavor=MODEL["name"],
        model=model,
        parallelize_fn=parallelize_qwen3 if moe else parallelize_llama,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=None,
        state_dict_adapter=Qwen3StateDictAdapter if moe else Llama3StateDictAdapter,
    )


def autoplan_config() -> Trainer.Config:
    """The plan as torchtitan's ``Trainer.Config``."""
    spec = model_spec()
    checkpointing = {"full": FullAC.Config(), "selective": SelectiveAC.Config(), "none": None}[ACTIVATION_CHECKPOINT]
    return Trainer.Config(
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=MODEL["vocab_size"])),
        optimizer=default_adamw(**OPTIMIZER),
        lr_scheduler=LRSchedulersContainer.Config(**LR_SCHEDULE),
        training=TrainingConfig(**TRAINING),
        parallelism=ParallelismConfig(**PARALLELISM),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4_test"),  # torchtitan_launch.sh names the real one
        checkpoint=CheckpointManager.Config(enable=True, interval=1000, last_save_model_only=False),
        metrics=MetricsProcessor.Config(enable_tensorboard=True, log_freq=10),
        activation_checkpoint=checkpointing,
        compile=CompileConfig(enable=FLOAT8),  # float8's casts and scales fuse into the compiled model
    )
