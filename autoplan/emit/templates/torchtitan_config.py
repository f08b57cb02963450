"""A torchtitan config module for an autoplan plan (written by ``autoplan emit``; checked against torchtitan 0.3.0).

torchtitan 0.3 takes its job as a Python function returning ``Trainer.Config``
(``torchtitan/config/manager.py``: ``--module <importable module> --config <function>``); TOML job
files are gone. This module's ``autoplan_config`` builds the model (a Llama-style decoder with
the model file's sizes, from torchtitan's own building blocks) and the plan's parallelism,
batch and recomputation. Run it with torchtitan_launch.sh, or:

    PYTHONPATH=<this dir> torchrun ... -m torchtitan.train --module torchtitan_config --config autoplan_config

Command-line overrides still apply (``--training.steps 1000``, ``--hf_assets_path <tokenizer dir>``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.quantization.float8 import Float8LinearConverter
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
from torchtitan.models.llama3.parallelize import parallelize_llama
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

# ---- the plan (autoplan emit writes these values) ----
MODEL: dict[str, Any] = {
    "name": "model",
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 4,
    "ffn_hidden_dim": 256,
    "vocab_size": 128,
    "rope_theta": 10000.0,
    "max_seq_len": 64,
    "tie_embeddings": False,
}
PARALLELISM: dict[str, Any] = {}
TRAINING: dict[str, Any] = {}
OPTIMIZER: dict[str, Any] = {"lr": 3e-4}
ACTIVATION_CHECKPOINT = "none"
FLOAT8 = False
# ---- end of the plan ----

NORM_EPS = 1e-5
_INIT = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
_NORM_INIT = {"weight": nn.init.ones_}


def model_spec() -> ModelSpec:
    """A Llama-style decoder (SwiGLU, RMSNorm, RoPE, FlexAttention) with the model file's sizes."""
    dim, heads = MODEL["dim"], MODEL["n_heads"]
    rope = ComplexRoPE.Config(dim=dim // heads, max_seq_len=MODEL["max_seq_len"], theta=MODEL["rope_theta"])
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=dim, eps=NORM_EPS, param_init=_NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=dim, eps=NORM_EPS, param_init=_NORM_INIT),
            attention=make_gqa_config(
                dim=dim,
                n_heads=heads,
                n_kv_heads=MODEL["n_kv_heads"],
                wqkv_param_init=_INIT,
                wo_param_init=_INIT,
                inner_attention=get_attention_config("flex"),
                fuse_qkv=True,
                rope=rope,
            ),
            feed_forward=make_ffn_config(
                dim=dim, hidden_dim=MODEL["ffn_hidden_dim"], w1_param_init=_INIT, w2w3_param_init=_INIT
            ),
        )
        for _ in range(MODEL["n_layers"])
    ]
    vocab = MODEL["vocab_size"]
    model = Llama3Model.Config(
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
        name="llama3",
        flavor=MODEL["name"],
        model=model,
        parallelize_fn=parallelize_llama,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=None,
        state_dict_adapter=Llama3StateDictAdapter,
    )


def autoplan_config() -> Trainer.Config:
    """The plan as torchtitan's ``Trainer.Config``."""
    spec = model_spec()
    checkpointing = {"full": FullAC.Config(), "selective": SelectiveAC.Config(), "none": None}[ACTIVATION_CHECKPOINT]
    return Trainer.Config(
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=MODEL["vocab_size"])),
        optimizer=default_adamw(**OPTIMIZER),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=10, decay_type="cosine"),
        training=TrainingConfig(**TRAINING),
        parallelism=ParallelismConfig(**PARALLELISM),
        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4_test"),
        activation_checkpoint=checkpointing,
        compile=CompileConfig(enable=FLOAT8),  # float8's casts and scales fuse into the compiled model
    )
