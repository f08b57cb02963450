"""Plans the exporters are checked on (tests/test_export_*.py): the main job's best plan, Llama 2/3,
interleaved, GPipe, ZeRO 0-3, offload, hybrid sharding, uneven and explicit layer splits and
mixed recomputation (issue 15's matrix), NVIDIA's GPT-3 fp8 recipe, fp8 under FSDP, fp8 parameters,
the zero-bubble schedule, context parallelism and experts (issue 18), context parallelism without
tensor parallelism (Megatron's CUDA_DEVICE_MAX_CONNECTIONS rule) and experts without expert
parallelism (torchtitan's Qwen3 head_dim); issue 34: ZB-H1 over microbatches torch's zero-bubble
rounds do not divide, ZB-V without model parallelism and with fewer than 2p microbatches
(DeepSpeed's DualPipeV), experts in a pipeline without expert parallelism."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from hwprofiles.load import load_cluster
from simulator.job import Job
from simulator.model_files import load_model
from simulator.plan import parse_plan
from simulator.specs import ModelSpec


@dataclass(frozen=True)
class Case:
    model: str
    cluster: str
    nodes: int
    batch: int
    plan: str

    @property
    def id(self) -> str:
        return f"{self.model}:{self.plan}"


CASES = [
    Case("gpt3-175b", "dgx-a100-80gb", 128, 1536, "t=4,p=8,mb=2,zero=1,v=6,schedule=interleaved,sp=1"),  # main job
    Case("gpt3-175b", "dgx-a100-80gb", 128, 1536, "t=4,p=1,mb=3,zero=3,ckpt=selective,sp=1"),  # the audit's ZeRO-3
    Case("gpt3-175b", "dgx-a100-80gb", 96, 1536, "t=8,p=8,mb=1,zero=1,ckpt=full,v=2,schedule=interleaved,sp=1"),
    Case("gpt3-175b", "dgx-a100-80gb", 16, 256, "t=8,p=4,zero=2,layers=20/28/28/20,recompute=4:0/2:2/0:0/0:4"),
    Case(
        "gpt3-175b",
        "dgx-a100-80gb",
        16,
        128,
        "t=8,p=16,mb=1,zero=1,recompute=0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6/0:6",
    ),
    Case("gpt3-175b", "dgx-a100-80gb", 8, 64, "t=8,p=8,mb=1,zero=1,recompute=3:0/3:0/3:0/3:0/6:0/6:0/6:0/6:0"),
    Case("llama2-70b", "dgx-a100-80gb", 12, 96, "t=8,p=6,mb=1,zero=1,ckpt=full,sp=1"),  # 80 layers on 6 stages
    Case("llama2-70b", "dgx-a100-80gb", 8, 64, "t=8,p=4,mb=1,zero=1,layers=19/20/20/21,schedule=gpipe,ckpt=selective"),
    Case("llama2-70b", "dgx-a100-80gb", 4, 32, "t=8,p=1,zero=3,offload=cpu,ckpt=full"),
    Case("llama2-70b", "dgx-a100-80gb", 2, 64, "t=8,p=1,zero=1,offload=cpu,recompute=40:40"),
    Case("llama3-8b", "dgx-h100", 2, 64, "t=2,p=2,mb=2,zero=0,ckpt=selective,schedule=gpipe"),
    Case("llama3-8b", "dgx-h100", 4, 256, "t=1,p=1,mb=2,zero=3,hsdp=8,ckpt=full"),
    Case("llama3-8b", "dgx-h100", 1, 64, "t=1,p=1,mb=1,zero=2,recompute=0:16"),
    Case("gpt3-175b", "dgx-h100", 16, 256, "t=4,p=8,mb=1,zero=1,v=12,schedule=interleaved,sp=1,prec=fp8"),  # NVIDIA fp8
    Case("llama3-8b", "dgx-h100", 2, 64, "t=2,p=1,mb=1,zero=3,ckpt=full,prec=fp8"),  # fp8 under FSDP
    Case("gpt3-175b", "dgx-h100", 16, 256, "t=4,p=8,mb=1,zero=1,v=12,sp=1,prec=fp8,fp8ag=1"),  # fp8 parameters
    Case("llama3-8b", "dgx-h100", 2, 64, "t=2,p=1,mb=1,zero=3,ckpt=full,prec=fp8,fp8ag=1"),  # gathered in fp8
    Case("llama2-7b", "dgx-a100-80gb", 2, 64, "t=2,p=4,mb=1,zero=1,schedule=zbh1"),  # zero bubble
    Case("llama2-7b", "dgx-a100-80gb", 2, 64, "t=2,p=4,mb=1,zero=1,schedule=zbv,ckpt=full"),  # zero bubble in a V
    Case("llama2-7b", "dgx-a100-80gb", 1, 9, "t=2,p=4,mb=1,zero=1,schedule=zbh1"),  # m=9: not a multiple of m // p
    Case("llama2-7b", "dgx-a100-80gb", 1, 64, "t=1,p=4,mb=1,zero=0,schedule=zbv"),  # a V without model parallelism
    Case("llama2-7b", "dgx-a100-80gb", 1, 6, "t=1,p=4,mb=1,zero=1,schedule=zbv"),  # m=3 < 2p: no DualPipeV
    Case("llama3-8b", "dgx-h100", 2, 32, "t=2,cp=2,p=2,mb=1,zero=1,ckpt=selective,sp=1"),  # context parallel
    Case("llama3-8b", "dgx-h100", 2, 32, "t=1,cp=4,p=1,mb=1,zero=3,ckpt=full"),  # cp under FSDP
    Case("llama3-8b", "dgx-h100", 2, 32, "t=2,cp=2,p=1,mb=1,zero=0"),  # cp without sharding
    Case("llama3-8b", "dgx-h100", 1, 32, "t=1,cp=2,p=2,mb=1,zero=1,ckpt=selective"),  # cp without tensor parallelism
    Case("mixtral-8x7b", "dgx-h100", 8, 64, "t=2,p=4,mb=1,zero=1,sp=1"),  # mixture of experts
    Case("mixtral-8x7b", "dgx-h100", 8, 64, "t=2,p=2,ep=4,mb=1,zero=1"),  # expert parallelism
    Case("mixtral-8x7b", "dgx-h100", 8, 64, "t=1,p=1,ep=8,mb=1,zero=3"),  # experts under Megatron-FSDP
    Case("mixtral-8x7b", "dgx-h100", 8, 64, "t=1,p=2,ep=4,mb=1,zero=0,ckpt=full"),  # ep with data-parallel replicas
    Case("mixtral-8x7b", "dgx-h100", 4, 64, "t=1,p=1,mb=1,zero=3,ckpt=full"),  # experts sharded by FSDP, no ep
    Case("mixtral-8x7b", "dgx-h100", 4, 64, "t=1,p=2,mb=1,zero=1,ckpt=full"),  # experts in a pipeline, no ep
    Case("llama2-7b", "dgx-a100-80gb", 1, 64, "t=1,p=1,mb=2,zero=0"),
    Case("llama2-7b", "dgx-a100-80gb", 2, 64, "t=2,p=2,mb=1,zero=1,v=2,schedule=interleaved,layers=7/9/8/8"),
    Case("gpt-1t", "dgx-a100-80gb", 16, 256, "t=8,p=1,mb=1,zero=3,offload=nvme,ckpt=full"),
]


@cache
def job_of(case: Case) -> Job:
    model = load_model(case.model)
    cluster = load_cluster(case.cluster, case.nodes)
    plan, _ = parse_plan(case.plan, model, cluster.num_gpus, case.batch)
    return Job(model, cluster, plan, case.batch)


def small_llama(num_layers: int, num_experts: int | None = None) -> ModelSpec:
    """A small Llama-style decoder (SwiGLU, RMSNorm, RoPE, GQA, untied embeddings) that the tools'
    own code builds and steps on CPU in seconds; with ``num_experts``, a mixture of experts."""
    return ModelSpec(
        name="small",
        num_layers=num_layers,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=96,
        vocab_size=256,
        seq_length=64,
        activation="swiglu",
        tie_embeddings=False,
        position_embedding_type="rope",
        normalization="RMSNorm",
        num_experts=num_experts,
    )
