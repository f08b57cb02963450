"""The README's input files: files of the checkout quoted as they are (a model YAML, GPU and node profiles), and
the two written examples, a cluster file and a Hugging Face config.json, each with ``autoplan simulate`` on it."""

from __future__ import annotations

from collections.abc import Callable

from .docs_runner import REPO, Docs, fence

MY_CLUSTER = """\
# my-cluster.yaml: 32 DGX H100 nodes behind a 2:1 oversubscribed fat-tree
name: my-cluster
nodes: 32
node: dgx-h100            # a built-in node name, or a node file such as hwprofiles/nodes/my-gpu-node.yaml
network:
  topology: fat-tree      # fat-tree | rail-optimized | single-switch
  oversubscription: 2.0
"""


def cluster_example(d: Docs) -> str:
    """a cluster file and autoplan simulate on it"""
    (d.work / "my-cluster.yaml").write_text(MY_CLUSTER)
    shown, out = d.autoplan(
        "simulate",
        "--model",
        "llama2-70b",
        "--cluster",
        "my-cluster.yaml",
        "--global-batch",
        "512",
        "--plan",
        "t=8,p=4,mb=1,zero=1,ckpt=selective,sp=1",
    )
    return fence(MY_CLUSTER, "yaml") + "\n" + fence(shown + "\n" + out)


HF_CONFIG = """\
{
  "model_type": "mistral",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "num_hidden_layers": 32,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "vocab_size": 32000,
  "max_position_embeddings": 32768,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": false
}
"""


def hf_config_example(d: Docs) -> str:
    """a Hugging Face config.json and autoplan simulate on it"""
    (d.work / "config.json").write_text(HF_CONFIG)
    shown, out = d.autoplan(
        "simulate",
        "--model",
        "config.json",
        "--seq-len",
        "4096",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "2",
        "--global-batch",
        "256",
        "--plan",
        "t=2,zero=1",
        "--fidelity",
        "analytic",
    )
    head = "\n".join(out.splitlines()[:8])
    return fence(HF_CONFIG, "json") + "\n" + fence(shown + "\n" + head)


def quoted_file(path: str, lang: str = "yaml") -> Callable[[Docs], str]:
    """A section that shows the checkout's file ``path`` as it is, in a ``lang`` fence."""

    def gen(d: Docs) -> str:
        return fence((REPO / path).read_text(), lang)

    gen.__doc__ = f"the file {path}"
    return gen
