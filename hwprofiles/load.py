"""Load GPU, node and cluster profiles by built-in name, by path, or from a mapping.

Every failure (missing file, malformed YAML, unknown key, wrong type, unknown profile
name, a bad ``--nodes`` or ``--gpus-per-node``) raises :class:`SpecError` (an :class:`InputError`)
with one line naming the file and the key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hwprofiles.errors import SpecError
from hwprofiles.names import NAME_MAX
from hwprofiles.schema import ClusterSpec, GpuProfile, NodeProfile

ROOT = Path(__file__).resolve().parent
GPU_DIR, NODE_DIR, CLUSTER_DIR = ROOT / "gpus", ROOT / "nodes", ROOT / "clusters"


def is_file(path: str | Path) -> bool:
    """Path.is_file() that answers False, not OSError, for a name the OS refuses (too long, ...)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a key given twice (plain YAML keeps the
    last value and says nothing); ``<<`` merge keys may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.MarkedYAMLError(
                    problem=f"key {key!r} given twice (first on line {first_line[key]})",
                    problem_mark=key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> Any:
    """The data of a YAML text (a SafeLoader: data only, no objects), parsed once per text: a
    benchmark that builds a thousand jobs from the command line reads the same profiles each time."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML (or JSON) file; a missing or malformed file, or a mapping with a key given
    twice, is a SpecError."""
    p = Path(path)
    if not is_file(p):
        raise SpecError(f"{p}: no such file")
    try:
        return copy.deepcopy(_parsed(p.read_text()))  # a copy: callers may change what they read
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{p}:{where} malformed YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read: {e}") from None


def validation_message(
    source: str, err: ValidationError, model: type[BaseModel] | None = None, keys: Mapping[str, str] | None = None
) -> str:
    """One line for every pydantic error: the source, then each error's dotted key, what was
    expected and what was given, unknown keys first (with a typo, "num_layer", the missing key it
    was meant to be is a consequence) and, knowing the ``model``, what an unknown key may have meant.
    ``keys``: how the input file names a field, where it is not by the field's name (a Hugging Face
    config's ``key 'num_hidden_layers'`` for ``num_layers``)."""
    errors = sorted(err.errors(), key=lambda x: x.get("type") != "extra_forbidden")
    return f"{source}: " + "; ".join(_error_text(x, model, keys or {}) for x in errors)


def _error_text(error: Any, model: type[BaseModel] | None, keys: Mapping[str, str]) -> str:
    """One pydantic error as ``key 'a.b': what was expected (got ...)``."""
    loc = tuple(str(x) for x in error.get("loc", ()))
    key = ".".join(loc) or "(top level)"
    named = keys.get(key, f"key '{key}'")
    if error.get("type") == "extra_forbidden":
        return f"{named}: unknown key{_meant(loc, model)}"
    given = error.get("input")
    shown = (
        ""
        if error.get("type") == "missing" or isinstance(given, (dict, list, BaseModel))
        else f" (got {_shortened(repr(given))})"
    )
    return f"{named}: {error.get('msg', 'invalid value')}{shown}"


def _meant(loc: tuple[str, ...], model: type[BaseModel] | None) -> str:
    """`` (did you mean 'x'?)`` for the unknown key at ``loc`` of ``model``: a key of its mapping
    that the model's ``KEY_ALIASES`` names for it, else one spelt alike; or nothing."""
    target = _model_at(model, loc[:-1]) if model is not None and loc else None
    if target is None:
        return ""
    aliases: Mapping[str, str] = getattr(target, "KEY_ALIASES", {})
    alias = aliases.get(loc[-1])
    return f" (did you mean '{alias}'?)" if alias else did_you_mean(loc[-1], list(target.model_fields))


def _model_at(model: type[BaseModel], path: tuple[str, ...]) -> type[BaseModel] | None:
    """The pydantic model of the mapping at ``path`` inside ``model`` (None where it is not one)."""
    for part in path:
        field = model.model_fields.get(part)
        found = _submodel(field.annotation) if field is not None else None
        if found is None:
            return None
        model = found
    return model


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model in a field's type (``Link | None``, ``str | GpuProfile``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_submodel, typing.get_args(annotation))), None)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice ``word`` most likely meant (the same but for
    case, else the closest spelling: difflib), or nothing."""
    same = [c for c in choices if c.lower() == word.lower()]
    close = same or difflib.get_close_matches(word, choices, n=1, cutoff=0.7)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _shortened(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters (a value of 10 kB makes no readable message)."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def build(model: type[BaseModel], data: Any, source: str, keys: Mapping[str, str] | None = None) -> Any:
    """Validate ``data`` into ``model``; errors become a one-line SpecError naming ``source`` and
    each key as the input names it (``keys``: validation_message)."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError(validation_message(source, e, model, keys)) from None


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
    known = _names(directory)
    raise SpecError(f"unknown {what} '{ref}'{did_you_mean(ref, known)} (built-in: {', '.join(known)}; or give a path)")


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
    return build(ClusterSpec, {"name": _node_cluster_name(node, nodes or 1), "nodes": nodes or 1, "node": node}, source)


def _node_cluster_name(node: NodeProfile, nodes: int) -> str:
    """The name of a cluster made of ``nodes`` copies of ``node``: ``<node>-x<nodes>``, the node's
    name cut where the whole would pass the name rule's length (a node named with 199 characters,
    which the rule allows, made a cluster name of 202 that it refused, blaming the node file)."""
    suffix = f"-x{nodes}"
    return node.name[: NAME_MAX - len(suffix)] + suffix


def with_nodes(cluster: ClusterSpec, nodes: int) -> ClusterSpec:
    """``cluster`` with ``nodes`` nodes, renamed where its name counts them (a node's cluster,
    :func:`_node_cluster_name`; a cluster file's name is kept), checked as a cluster file of that
    size is (a node without NICs makes no cluster of several): SpecError otherwise. It holds
    ``cluster``'s very node (and GPU) and network objects, equal to the checked ones."""
    counted = _node_cluster_name(cluster.node, cluster.nodes)
    name = cluster.name
    if name == counted or name.startswith(f"{counted}-"):  # also <node>-x<N>-<G>gpn (--gpus-per-node)
        name = _node_cluster_name(cluster.node, nodes) + name[len(counted) :]
    data = {**cluster.model_dump(), "nodes": nodes, "name": name}
    sized = build(ClusterSpec, data, f"cluster {cluster.name} on {nodes} nodes")
    # what the estimators cache per node, GPU or network by identity (simulator.cost.block_times,
    # simulator.analytic.pipeline.p2p_seconds) serves every size: a network does not depend on the size
    return sized.model_copy(update={"node": cluster.node, "network": cluster.network})


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
    cluster_names, node_names = _names(CLUSTER_DIR), _names(NODE_DIR)
    raise SpecError(
        f"unknown cluster '{ref}'{did_you_mean(ref, cluster_names + node_names)} "
        f"(clusters: {', '.join(cluster_names)}; nodes: {', '.join(node_names)}; or give a path)"
    )
