"""Load GPU, node and cluster profiles by built-in name, by path, or from a mapping.

Every failure (missing file, malformed YAML, unknown key, wrong type, unknown profile
name, a bad ``--nodes`` or ``--gpus-per-node``) raises :class:`SpecError` (an :class:`InputError`)
with one line naming the file and the key.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hwprofiles.errors import SpecError
from hwprofiles.schema import ClusterSpec, GpuProfile, NodeProfile

ROOT = Path(__file__).resolve().parent
GPU_DIR, NODE_DIR, CLUSTER_DIR = ROOT / "gpus", ROOT / "nodes", ROOT / "clusters"


def is_file(path: str | Path) -> bool:
    """Path.is_file() that answers False, not OSError, for a name the OS refuses (too long, ...)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML (or JSON) file; a missing or malformed file is a SpecError."""
    p = Path(path)
    if not is_file(p):
        raise SpecError(f"{p}: no such file")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{p}:{where} malformed YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read: {e}") from None


def validation_message(source: str, err: ValidationError) -> str:
    """One line for the first pydantic error: source, dotted key, what was expected, what was given."""
    errors = err.errors()
    # an unknown key first: with a typo ("num_layer") the missing key it was meant to be is a
    # consequence, and the message should name the key actually written in the file
    first = next((x for x in errors if x.get("type") == "extra_forbidden"), errors[0])
    key = ".".join(str(x) for x in first.get("loc", ())) or "(top level)"
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown key"
    given = first.get("input")
    shown = (
        ""
        if first.get("type") in ("missing", "extra_forbidden") or isinstance(given, (dict, list, BaseModel))
        else f" (got {given!r})"
    )
    more = f" [+{err.error_count() - 1} more]" if err.error_count() > 1 else ""
    return f"{source}: key '{key}': {msg}{shown}{more}"


def build(model: type[BaseModel], data: Any, source: str) -> Any:
    """Validate ``data`` into ``model``; errors become a one-line SpecError naming ``source``."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError(validation_message(source, e)) from None


def _names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def builtin_nodes() -> list[str]:
    """Names of the built-in node profiles (hwprofiles/nodes)."""
    return _names(NODE_DIR)


def _locate(ref: str, directory: Path, what: str) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or is_file(p):
        return p
    cand = directory / f"{ref}.yaml"
    if is_file(cand):
        return cand
    raise SpecError(f"unknown {what} '{ref}' (built-in: {', '.join(_names(directory))}; or give a path)")


@functools.lru_cache(maxsize=64)
def load_gpu(ref: str) -> GpuProfile:
    path = _locate(ref, GPU_DIR, "GPU profile")
    return build(GpuProfile, read_yaml(path), str(path))


def node_from_mapping(data: Any, source: str) -> NodeProfile:
    node = build(NodeProfile, data, source)
    if isinstance(node.gpu, str):
        try:
            gpu = load_gpu(node.gpu)
        except SpecError as e:
            raise SpecError(f"{source}: key 'gpu': {e}") from None
        node = node.model_copy(update={"gpu": gpu})
    return node


@functools.lru_cache(maxsize=64)
def load_node(ref: str) -> NodeProfile:
    path = _locate(ref, NODE_DIR, "node profile")
    return node_from_mapping(read_yaml(path), str(path))


def cluster_from_mapping(data: Any, source: str, nodes: int | None = None) -> ClusterSpec:
    if not isinstance(data, Mapping):
        raise SpecError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    data = dict(data)
    node = data.get("node")
    if isinstance(node, str):
        try:
            data["node"] = load_node(node)
        except SpecError as e:
            raise SpecError(f"{source}: key 'node': {e}") from None
    elif isinstance(node, Mapping):
        data["node"] = node_from_mapping(node, f"{source} (node)")
    if nodes is not None:
        data["nodes"] = nodes
    cluster = build(ClusterSpec, data, source)
    return cluster


def _cluster_of_node(node: NodeProfile, nodes: int | None, source: str) -> ClusterSpec:
    """``nodes`` (default 1) copies of ``node`` on one fat-tree, validated like a cluster file."""
    return build(ClusterSpec, {"name": f"{node.name}-x{nodes or 1}", "nodes": nodes or 1, "node": node}, source)


def load_cluster(ref: str, nodes: int | None = None, gpus_per_node: int | None = None) -> ClusterSpec:
    """``ref`` is a cluster file path, a built-in cluster name, or a node name/path.

    A node becomes a cluster of ``nodes`` (default 1) such nodes on one fat-tree.
    ``nodes`` overrides the node count of a cluster file; ``gpus_per_node`` uses only that
    many GPUs of each node (e.g. 2 ranks of the 4-rank localhost-cpu node), at most all.
    """
    if nodes is not None and (not isinstance(nodes, int) or nodes < 1):
        raise SpecError(f"--nodes: expected a positive integer, got {nodes!r}")
    cluster = _load_cluster(ref, nodes)
    if gpus_per_node is None or gpus_per_node == cluster.gpus_per_node:
        return cluster
    if not isinstance(gpus_per_node, int) or not 1 <= gpus_per_node <= cluster.gpus_per_node:
        raise SpecError(
            f"--gpus-per-node: expected 1 to {cluster.gpus_per_node} (the node's GPUs), got {gpus_per_node!r}"
        )
    node = cluster.node.model_copy(update={"gpus_per_node": gpus_per_node})
    return cluster.model_copy(update={"node": node, "name": f"{cluster.name}-{gpus_per_node}gpn"})


def _load_cluster(ref: str, nodes: int | None) -> ClusterSpec:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json") or is_file(p):
        data = read_yaml(p)
        if isinstance(data, Mapping) and "gpus_per_node" in data:  # a node file given as cluster
            node = node_from_mapping(data, str(p))
            return _cluster_of_node(node, nodes, str(p))
        return cluster_from_mapping(data, str(p), nodes)
    if is_file(CLUSTER_DIR / f"{ref}.yaml"):
        path = CLUSTER_DIR / f"{ref}.yaml"
        return cluster_from_mapping(read_yaml(path), str(path), nodes)
    if is_file(NODE_DIR / f"{ref}.yaml"):
        node = load_node(ref)
        return _cluster_of_node(node, nodes, str(NODE_DIR / f"{ref}.yaml"))
    raise SpecError(
        f"unknown cluster '{ref}' (clusters: {', '.join(_names(CLUSTER_DIR))}; "
        f"nodes: {', '.join(_names(NODE_DIR))}; or give a path)"
    )
