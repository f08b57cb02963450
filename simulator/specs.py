"""The model specification (docs/design.md section 2, "Model file").

:class:`ModelSpec` is a GPT-style decoder, keys named after Megatron-LM arguments; files are read
into it by :mod:`simulator.model_files` (autoplan YAML or a Hugging Face ``config.json``, whose keys
:data:`HF_KEYS` maps). Plans are in :mod:`simulator.plan`, jobs in :mod:`simulator.job`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from hwprofiles.load import build
from hwprofiles.names import Name
from hwprofiles.schema.base import Strict

# Hugging Face config.json keys -> ModelSpec keys (first present key wins).
HF_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads", "multi_query_group_num"),
    "ffn_hidden_size": ("moe_intermediate_size", "intermediate_size", "n_inner", "ffn_dim"),
    "num_experts": ("num_local_experts", "num_experts"),
    "moe_router_topk": ("num_experts_per_tok",),
    "vocab_size": ("vocab_size",),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
}


#: keys other tools spell differently -> ModelSpec's: what an unknown key of a model file was
#: likely meant to be (hwprofiles.load.validation_message's "did you mean")
_KEY_ALIASES = {name: key for key, names in HF_KEYS.items() for name in names if name != key} | {
    "num_kv_heads": "num_query_groups",
    "n_kv_heads": "num_query_groups",
    "kv_heads": "num_query_groups",
    "num_heads": "num_attention_heads",
    "seq_len": "seq_length",
    "max_seq_len": "seq_length",
}


class ModelSpec(Strict):
    """A decoder-only transformer. ``num_query_groups`` is the number of KV heads (GQA/MQA).
    A profile model (hwprofiles.schema.base.Strict): unknown keys, non-finite numbers and booleans
    for numbers are errors; frozen."""

    KEY_ALIASES: ClassVar[dict[str, str]] = _KEY_ALIASES

    name: Name = "model"  # hwprofiles.names: letters, digits, . _ + - /
    # the upper bounds are far above any published transformer (128 layers of hidden size 25,600 in
    # the 1T-parameter GPT of Narayanan et al. 2021, gpt-1t here; 256k-token vocabularies in Gemma 2;
    # 10M-token contexts in Llama 4 Scout) and keep every per-layer loop and integer array of the
    # estimates in range (num_layers: 10**20 overflowed an index)
    num_layers: int = Field(ge=1, le=10_000)
    hidden_size: int = Field(ge=1, le=2**20)
    num_attention_heads: int = Field(ge=1, le=2**16)
    num_query_groups: int | None = Field(default=None, ge=1, le=2**16)
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=2**22)
    vocab_size: int = Field(ge=1, le=2**24)
    seq_length: int = Field(ge=1, le=2**30)
    activation: Literal["gelu", "swiglu"] = "gelu"
    tie_embeddings: bool = True
    position_embedding_type: Literal["learned_absolute", "rope"] = "learned_absolute"
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    # rotary base (Su et al. 2021): 10000 in GPT-NeoX / Llama 2, 500000 in Llama 3 (HF rope_theta)
    rope_theta: float = Field(default=10000.0, gt=0)
    # "flash": fused attention (FlashAttention / torch SDPA; Dao et al. 2022), no s x s scores
    # stored; "materialized": scores, softmax and dropout as separate kernels that keep the
    # s x s tensors (Megatron-LM 2021's fused softmax, Megatron-DeepSpeed without flash)
    attention: Literal["flash", "materialized"] = "flash"
    # mixture of experts (Megatron-LM --num-experts, --moe-router-topk): every layer's MLP is
    # num_experts expert MLPs of ffn_hidden_size (Megatron's --moe-ffn-hidden-size) and a router that
    # sends each token to moe_router_topk of them; None: a dense MLP
    num_experts: int | None = Field(default=None, ge=2, le=2**20)
    moe_router_topk: int = Field(default=2, ge=1)
    # the busiest expert-parallel rank's routed tokens over the mean (1: balanced routing; an
    # auxiliary load-balancing loss keeps it near 1): the rank the others wait for at each all-to-all
    moe_load_imbalance: float = Field(default=1.0, ge=1.0)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be divisible by num_query_groups {self.kv_heads}"
            )
        if self.num_experts is not None and self.moe_router_topk > self.num_experts:
            raise ValueError(f"moe_router_topk {self.moe_router_topk} exceeds num_experts {self.num_experts}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def experts(self) -> int:
        """MLPs per layer: num_experts, or 1 (dense)."""
        return self.num_experts or 1

    @property
    def local_experts(self) -> int:
        """Experts a rank holds: all of them (an expert-parallel rank's share:
        simulator.cost.rank_view.RankModel)."""
        return self.experts

    @property
    def mlp_copies(self) -> int:
        """MLPs each token passes through per layer: the router's top-k, or 1 (dense)."""
        return self.moe_router_topk if self.num_experts else 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def attention_keys(self) -> int:
        """Keys each query attends over: the sequence (all of it, also for a context-parallel
        rank's shorter chunk: simulator.cost.rank_view.RankModel)."""
        return self.seq_length

    @property
    def max_positions(self) -> int:
        """Rows of a learned position embedding: the sequence length."""
        return self.seq_length

    def with_seq_length(self, seq: int | None, source: str = "sequence length") -> ModelSpec:
        """This model at sequence length ``seq`` (None: as it is), held to the field's bounds (a
        SpecError naming ``source``)."""
        if seq is None or seq == self.seq_length:
            return self
        return build(ModelSpec, {**self.model_dump(), "seq_length": seq}, source)
