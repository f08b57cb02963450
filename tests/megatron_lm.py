"""Megatron-LM's own ``parse_args`` + ``validate_args`` on an argument list, on CPU (for
tests/test_export_megatron.py, with MEGATRON_LM_PATH set to a Megatron-LM source checkout).

``validate_megatron(argv, world_size, env, snapshot=None, ...) -> argparse.Namespace`` runs, in a
subprocess (the checkout's own ``megatron.core`` cannot share a process with the installed
megatron-core; ``parse_args`` reads the process's sys.argv and environment), the checkout's
``megatron.training.arguments.parse_args`` (sys.argv replaced) and ``validate_args``, then the
microbatch calculator (where the global-batch divisibility is checked), the interleaved
schedule's microbatch check (``schedules.py``, reproduced), ``core_transformer_config_from_args``
(where a pipeline layout is checked) and the layers each pipeline rank builds
(``get_num_layers_to_build``). A rejection raises ``MegatronArgsError`` with Megatron's own message.
Checked against Megatron-LM main at d98e8a6 (2026-08-22).

CPU shims used by the worker (nothing else is stubbed):
  1. ``typing.override`` <- ``typing_extensions.override`` on Python < 3.12 (snapshot
     requires >=3.12; megatron/training/models/gpt.py:5 imports it).
  2. ``triton`` import stub (CPU torch has no triton; imported at module level by
     megatron/core/transformer/moe/ops/paged_stash.py:4 via megatron.core -> distributed ->
     pipeline_parallel). torch's own triton probe is cached to False first.
  3. ``megatron.training.arguments.get_device_arch_version`` -> returns ``gpu_arch``
     (default 9 = Hopper). Real one calls torch.cuda.get_device_properties
     (megatron/training/utils/common_utils.py:527-529); used by validate_args at
     arguments.py:1454 (t>1 or cp>1), 1484 (Megatron-FSDP), 1524 (GTP weight shards).
  4. ``torch.cuda.get_device_capability`` -> (gpu_arch, 0); only used at arguments.py:1379
     (--moe-grouped-gemm).
  5. optional ``te_version``: fakes the Transformer-Engine version that
     megatron.core.utils.is_te_min_version sees (without TE it is 0.0.0, so every
     "requires TE >= x" assertion fails on CPU).
  Pass ``gpu_arch=None`` to disable 3+4 and see the raw CPU failure
  (AssertionError 'Torch not compiled with CUDA enabled').
"""

from __future__ import annotations

import argparse
import enum
import io
import json
import os
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout

DEFAULT_SNAPSHOT = "/tmp/megatron-lm"

# Env vars validate_args reads; dropped from the inherited environment before `env` is applied.
ENV_READ_BY_VALIDATE = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "NVTE_CPU_OFFLOAD_V1",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NCCL_GRAPH_REGISTER",
    "CUDA_GRAPHS_USE_NODE_PRIORITY",
    "NCCL_PROTO",
)

# pretrain_gpt.py:525-528 passes args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}.
PRETRAIN_GPT_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}


class MegatronArgsError(Exception):
    """Megatron rejected the arguments. str(e) is Megatron's own message.

    Attributes: stage ('parse'|'validate'|'microbatches'|'schedule'|'tokenizer'|
    'transformer_config'|'layers'|'import'), exc_type, where ('file:line' of the raising frame), cpu_only (True when
    the failure is only because there is no CUDA/TE on this machine), stubs_hit.
    """

    def __init__(self, message, stage, exc_type, where=None, cpu_only=False, stubs_hit=()):
        super().__init__(message)
        self.message, self.stage, self.exc_type = message, stage, exc_type
        self.where, self.cpu_only, self.stubs_hit = where, cpu_only, list(stubs_hit)

    def __str__(self):
        return self.message


def _snapshot_path(snapshot):
    return os.path.abspath(snapshot or os.environ.get("MEGATRON_LM_PATH") or DEFAULT_SNAPSHOT)


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------
def validate_megatron(
    argv,
    world_size,
    env=None,
    snapshot=None,
    *,
    rank=0,
    gpu_arch=9,
    te_version=None,
    args_defaults=None,
    microbatches=True,
    schedule_check=True,
    build_config=True,
    build_tokenizer=True,
    no_te_fusions=True,
    python=None,
    timeout=600,
):
    """Validate `argv` (list of pretrain_gpt.py args, no script name) for `world_size` ranks.

    env: env vars the launcher would export (e.g. {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}).
    args_defaults: dict passed as validate_args(defaults=...); {} by default (use
    PRETRAIN_GPT_DEFAULTS to mimic pretrain_gpt.py exactly).
    gpu_arch: value the stubbed get_device_arch_version returns (9 Hopper, 10 Blackwell: no
    CUDA_DEVICE_MAX_CONNECTIONS requirement); None = no stub (raw CPU failure).
    te_version: fake Transformer-Engine version for is_te_min_version (None = 0.0.0 on CPU).
    no_te_fusions: build the snapshot TransformerConfig with apply_rope_fusion=False when TE is
    not importable (the returned namespace keeps the user's value).
    Returns an argparse.Namespace of the validated args (torch dtypes restored; enums as
    their names; probe extras in ns._probe). Raises MegatronArgsError.
    """
    payload = dict(
        argv=list(map(str, argv)),
        world_size=int(world_size),
        env=dict(env or {}),
        snapshot=_snapshot_path(snapshot),
        rank=rank,
        gpu_arch=gpu_arch,
        te_version=te_version,
        args_defaults=dict(args_defaults or {}),
        microbatches=microbatches,
        schedule_check=schedule_check,
        build_config=build_config,
        build_tokenizer=build_tokenizer,
        no_te_fusions=no_te_fusions,
    )
    child_env = {k: v for k, v in os.environ.items() if k not in ENV_READ_BY_VALIDATE}
    child_env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [python or sys.executable, os.path.abspath(__file__), "--worker"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=child_env,
        timeout=timeout,
    )
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("@@RESULT ")), None)
    if line is None:
        raise RuntimeError(f"probe worker failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(line[len("@@RESULT ") :])
    if not res["ok"]:
        raise MegatronArgsError(
            res["message"],
            res["stage"],
            res["type"],
            res.get("where"),
            res.get("cpu_only", False),
            res.get("stubs_hit", ()),
        )
    import torch

    ns = argparse.Namespace()
    for k, v in res["args"].items():
        if k in res["dtype_fields"] and isinstance(v, str) and v.startswith("torch."):
            v = getattr(torch, v.split(".", 1)[1])
        setattr(ns, k, v)
    ns._probe = res["probe"]
    return ns


# --------------------------------------------------------------------------------------------
# megatron-core 0.16.1 side (no snapshot involved)
# --------------------------------------------------------------------------------------------
def layers_per_stage(cfg):
    """Decoder layers per [pp_rank][vp_stage] as Megatron's model builder would build them.

    Uses whichever megatron.core `cfg` comes from: get_num_layers_to_build(config, vp_stage,
    pp_rank) (transformer_block.py) for the legacy split -- its asserts (num_layers % p, per-rank
    layers % vpp) are where an invalid split that validate_args/TransformerConfig let through
    finally fails -- and layout.layout[pp][vp].count(decoder) for --pipeline-model-parallel-layout
    (its own get_num_layers_to_build ignores vp_stage unless parallel_state is initialised).
    """
    import importlib

    core = type(cfg).__module__.split(".transformer.")[0]
    tb = importlib.import_module(core + ".transformer.transformer_block")
    LayerType = importlib.import_module(core + ".transformer.enums").LayerType
    p = cfg.pipeline_model_parallel_size
    v = cfg.virtual_pipeline_model_parallel_size or 1
    lay = cfg.pipeline_model_parallel_layout
    if lay is not None and not isinstance(lay, str):
        return [[lay.layout[r][s].count(LayerType.decoder) for s in range(v)] for r in range(p)]
    vp = (lambda s: s) if cfg.virtual_pipeline_model_parallel_size else (lambda s: None)
    return [[tb.get_num_layers_to_build(cfg, vp_stage=vp(s), pp_rank=r) for s in range(v)] for r in range(p)]


# --------------------------------------------------------------------------------------------
# Worker side (runs with the snapshot on sys.path)
# --------------------------------------------------------------------------------------------
def _install_shims(stubs_hit):
    import importlib.abc
    import importlib.machinery
    import types
    import typing

    if not hasattr(typing, "override"):  # snapshot requires Python >= 3.12
        import typing_extensions

        typing.override = typing_extensions.override
        stubs_hit.append("typing.override")

    import torch
    import torch.utils._triton as tt

    tt.has_triton_package()  # cache False before the stub exists
    # import the torch modules that probe triton *before* the stub exists
    import torch._dynamo
    import torch._functorch.aot_autograd
    import torch.utils.flop_counter  # noqa: F401  (isinstance(x, triton JITFunction))

    try:
        import triton  # noqa: F401

        return
    except ImportError:
        pass

    class _Dummy:
        def __init__(self, name):
            self._n = name

        def __call__(self, *a, **k):
            if len(a) == 1 and callable(a[0]) and not k:
                return a[0]  # @triton.jit / @triton.autotune(...)(fn)
            return _Dummy(self._n + "()")

        def __getattr__(self, k):
            if k.startswith("__"):
                raise AttributeError(k)
            return _Dummy(self._n + "." + k)

        def __getitem__(self, k):
            return self

    class _StubModule(types.ModuleType):
        def __getattr__(self, k):
            if k.startswith("__"):
                raise AttributeError(k)
            return _Dummy(self.__name__ + "." + k)

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "triton" or name.startswith("triton."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            m = _StubModule(spec.name)
            m.__path__ = []
            m.__version__ = "0.0.0"
            return m

        def exec_module(self, m):
            if "triton" not in stubs_hit:
                stubs_hit.append("triton")

    sys.meta_path.append(_Finder())


def _have_te():
    try:
        import transformer_engine  # noqa: F401

        return True
    except Exception:
        return False


def _jsonable(v):
    import torch

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def _where(exc, snapshot):
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if f.filename.startswith(snapshot)] or frames
    if not inside:
        return None
    f = inside[-1]
    return f"{os.path.relpath(f.filename, snapshot) if f.filename.startswith(snapshot) else f.filename}:{f.lineno}"


def _worker(payload):
    stubs_hit = []
    snapshot = payload["snapshot"]
    result = {"stubs_hit": stubs_hit}
    stage = "import"
    log = io.StringIO()
    try:
        for k in ENV_READ_BY_VALIDATE:
            os.environ.pop(k, None)
        os.environ.update({k: str(v) for k, v in payload["env"].items()})
        os.environ["WORLD_SIZE"] = str(payload["world_size"])
        os.environ["RANK"] = str(payload["rank"])

        _install_shims(stubs_hit)
        sys.path.insert(0, snapshot)
        import megatron.core
        import torch

        assert os.path.abspath(megatron.core.__file__).startswith(snapshot), (
            f"megatron.core resolved to {megatron.core.__file__}, not the snapshot"
        )
        from megatron.training import arguments as A

        gpu_arch = payload["gpu_arch"]
        if gpu_arch is not None:

            def _arch():
                if "get_device_arch_version" not in stubs_hit:
                    stubs_hit.append("get_device_arch_version")
                return gpu_arch

            def _cap(*a, **k):
                if "torch.cuda.get_device_capability" not in stubs_hit:
                    stubs_hit.append("torch.cuda.get_device_capability")
                return (gpu_arch, 0)

            A.get_device_arch_version = _arch
            torch.cuda.get_device_capability = _cap
        if payload["te_version"]:
            import megatron.core.utils as cu
            from packaging.version import Version

            cu._te_version = Version(payload["te_version"])
            stubs_hit.append(f"te_version={payload['te_version']}")

        stage = "parse"
        sys.argv = ["pretrain_gpt.py"] + payload["argv"]
        err = io.StringIO()
        try:
            with redirect_stderr(err), redirect_stdout(log):
                args = A.parse_args(extra_args_provider=None, ignore_unknown_args=False)
        except SystemExit as e:  # argparse error -> exit(2) with message on stderr
            msg = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            raise ValueError(msg[-1] if msg else f"argparse exit {e.code}") from None

        stage = "validate"
        with redirect_stdout(log):
            args = A.validate_args(args, payload["args_defaults"])

        probe = {"snapshot": snapshot, "stubs_hit": stubs_hit}
        cf = os.path.join(snapshot, ".snapshot_commit")
        if os.path.exists(cf):
            with open(cf) as f:
                probe["snapshot_commit"] = f.read().strip()

        if payload["microbatches"]:
            stage = "microbatches"
            # Same call as megatron/training/global_vars.py:148-157 (set_global_variables).
            from megatron.core import num_microbatches_calculator as nmc

            with redirect_stdout(log):
                nmc.init_num_microbatches_calculator(
                    rank=args.rank,
                    global_batch_size=args.global_batch_size,
                    micro_batch_size=args.micro_batch_size,
                    data_parallel_size=args.data_parallel_size * args.gtp_weight_remat_size,
                    decrease_batch_size_if_needed=args.decrease_batch_size_if_needed,
                    step_batch_size_schedule=args.step_batch_size_schedule,
                    seq_length=args.seq_length,
                )
            probe["num_microbatches"] = nmc.get_num_microbatches()
            nmc.destroy_num_microbatches_calculator()

        if payload["schedule_check"] and args.virtual_pipeline_model_parallel_size and "num_microbatches" in probe:
            stage = "schedule"
            # Verbatim logic + messages of megatron/core/pipeline_parallel/schedules.py:1160-1179
            # (forward_backward_pipelining_with_interleaving; runs at the first train step).
            M = probe["num_microbatches"]
            P = args.pipeline_model_parallel_size
            N = args.microbatch_group_size_per_vp_stage or P  # model_parallel_config default
            if N > M or N < P:
                raise ValueError(
                    "The number of contiguous micro-batches in a virtual pipeline stage"
                    f"should range in [PP={P} , M={M}]"
                )
            r = M % N
            if 0 < r < P:
                raise RuntimeError(
                    "The remainder of M (the total micro-batches) divided by N (number of "
                    "contiguous micro-batches in a virtual pipeline stage) should be 0, "
                    "or larger than or equal to the pipeline-parallel size, but it is "
                    f"{r}. Otherwise, it introduces dependency bubbles in the pipeline "
                    "and reduces throughput."
                )

        if payload["build_tokenizer"] and args.tokenizer_type == "NullTokenizer" and args.vocab_size:
            stage = "tokenizer"
            from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

            with redirect_stdout(log):
                tok = build_tokenizer(args)  # sets args.padded_vocab_size
            probe["tokenizer_vocab_size"] = tok.vocab_size

        if payload["build_config"]:
            stage = "transformer_config"
            from megatron.training.argument_utils import core_transformer_config_from_args

            cargs = args
            if payload.get("no_te_fusions", True) and args.apply_rope_fusion and not _have_te():
                # TransformerConfig raises 'apply_rope_fusion is not available. Please install
                # TE >= 1.4.' when TE's fused RoPE kernels cannot be imported (CPU-only failure).
                cargs = argparse.Namespace(**vars(args))
                cargs.apply_rope_fusion = False
                stubs_hit.append("apply_rope_fusion->False(no TE)")
            with redirect_stdout(log):
                cfg = core_transformer_config_from_args(cargs)
            probe["snapshot_transformer_config"] = type(cfg).__name__
            stage = "layers"  # what the model builder would do next (get_num_layers_to_build)
            probe["layers_per_stage"] = layers_per_stage(cfg)

        dtype_fields = [k for k, v in vars(args).items() if isinstance(v, torch.dtype)]
        result.update(
            ok=True, args={k: _jsonable(v) for k, v in vars(args).items()}, dtype_fields=dtype_fields, probe=probe
        )
    except BaseException as e:
        msg = str(e) if str(e) else repr(e)
        where = _where(e, snapshot)
        if stage == "schedule":
            where = "megatron/core/pipeline_parallel/schedules.py:1160-1179 (replicated)"
        result.update(
            ok=False,
            stage=stage,
            type=type(e).__name__,
            message=msg,
            where=where,
            cpu_only=(
                "not compiled with CUDA" in msg
                or "No CUDA GPUs" in msg
                or "Transformer Engine >=" in msg
                or "TE >=" in msg
            ),
        )
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        res = _worker(json.load(sys.stdin))
        sys.stdout.write("\n@@RESULT " + json.dumps(res) + "\n")
        sys.stdout.flush()
        os._exit(0)  # skip atexit handlers of the snapshot
