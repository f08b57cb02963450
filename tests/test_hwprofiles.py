"""hwprofiles: shipped profiles, schema rules, loaders (names, paths, node-as-cluster, --nodes)."""

from __future__ import annotations

import pytest
import yaml
from conftest import NODE_MAPPING

from hwprofiles import InputError, load_cluster, load_gpu, load_node
from hwprofiles.load import GPU_DIR, NODE_DIR, cluster_from_mapping, node_from_mapping, with_nodes
from hwprofiles.schema import GpuProfile, Link, NodeProfile
from hwprofiles.units import GiB

# docs/design.md section 2: profiles that must ship (the CPU profile / localhost-cpu node are checked
# by the verification tests of whoever adds them)
REQUIRED_GPUS = ["v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"]
REQUIRED_NODES = ["dgx2-v100", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "pcie-a100-80gb"]

NODE = NODE_MAPPING


def write_yaml(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("name", sorted(p.stem for p in GPU_DIR.glob("*.yaml")))
def test_every_shipped_gpu_profile_loads(name):
    g = load_gpu(name)
    assert g.name == name
    floor = 1e10 if g.name == "cpu" else 1e12  # one CPU core (measured) vs any accelerator
    assert g.peak_flops() > floor and 0 < g.usable_memory_bytes < g.memory_GiB * GiB


@pytest.mark.parametrize("name", sorted(p.stem for p in NODE_DIR.glob("*.yaml")))
def test_every_shipped_node_profile_loads(name):
    n = load_node(name)
    assert n.name == name and isinstance(n.gpu, GpuProfile)


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpu_profiles_exist(name):
    assert (GPU_DIR / f"{name}.yaml").is_file()


@pytest.mark.parametrize("name", REQUIRED_NODES)
def test_required_node_profiles_exist(name):
    assert (NODE_DIR / f"{name}.yaml").is_file()


def test_design_doc_node_facts():
    assert load_node("dgx2-v100").gpus_per_node == 16
    assert load_node("dgx2-v100").nics_per_node == 8
    assert load_node("dgx-a100-80gb").gpu.name == "a100-sxm4-80gb"
    assert load_node("pcie-a100-80gb").intra_node.kind == "pcie"


def test_a100_numbers():
    g = load_gpu("a100-sxm4-80gb")
    assert g.peak_flops("fp16") == 312e12 and g.peak_flops() == 312e12
    # (80 * (1 - fragmentation) - reserved) GiB
    expected = (80 * (1 - g.allocator_fragmentation) - g.memory_reserved_GiB) * GiB
    assert g.usable_memory_bytes == pytest.approx(expected)


def test_link_units():
    assert Link(bandwidth_Gbps=200).bytes_per_s == pytest.approx(25e9)  # bits -> bytes
    assert Link(bandwidth_GBps=300, efficiency=0.5).bytes_per_s == pytest.approx(150e9)
    assert Link(bandwidth_GBps=1, latency_us=5).latency_s == pytest.approx(5e-6)
    with pytest.raises(ValueError):
        Link(bandwidth_GBps=1, bandwidth_Gbps=8)
    with pytest.raises(ValueError):
        Link(latency_us=1)


# ------------------------------------------------------------------------- loaders


def test_cluster_from_node_name():
    c = load_cluster("dgx-a100-80gb")
    assert c.nodes == 1 and c.num_gpus == 8 and c.gpu.name == "a100-sxm4-80gb"
    c = load_cluster("dgx-h100", nodes=16)
    assert c.nodes == 16 and c.num_gpus == 128 and c.gpus_per_node == 8 and c.network.topology == "fat-tree"


def test_cluster_file_and_nodes_override(tmp_path):
    path = write_yaml(
        tmp_path / "c.yaml",
        {
            "name": "sel",
            "nodes": 4,
            "node": "dgx-a100-80gb",
            "network": {"topology": "rail-optimized", "oversubscription": 2.0},
        },
    )
    c = load_cluster(path)
    assert (c.name, c.nodes, c.num_gpus, c.network.topology) == ("sel", 4, 32, "rail-optimized")
    c = load_cluster(path, nodes=16)
    assert c.nodes == 16 and c.num_gpus == 128 and c.network.oversubscription == 2.0


def test_cluster_file_with_inline_node(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"name": "inline", "nodes": 2, "node": dict(NODE, gpus_per_node=4)})
    c = load_cluster(path)
    assert c.num_gpus == 8 and c.gpu.name == "a100-sxm4-80gb"


def test_node_file_given_as_cluster(tmp_path):
    path = write_yaml(tmp_path / "n.yaml", NODE)
    c = load_cluster(path, nodes=3)
    assert c.nodes == 3 and c.node.name == "test-node" and c.num_gpus == 24
    assert load_cluster(path).nodes == 1


def test_inline_gpu_profile(tmp_path):
    gpu = yaml.safe_load((GPU_DIR / "a100-sxm4-80gb.yaml").read_text())
    node = node_from_mapping(dict(NODE, gpu=dict(gpu, name="my-gpu")), "inline")
    assert node.gpu.name == "my-gpu"


@pytest.mark.parametrize("nodes", [0, -2])
def test_nodes_must_be_positive(nodes):
    with pytest.raises(InputError, match="--nodes"):
        load_cluster("dgx-a100-80gb", nodes=nodes)


def test_unknown_names():
    with pytest.raises(InputError, match=r"unknown cluster 'nope'.*dgx-a100-80gb"):
        load_cluster("nope")
    with pytest.raises(InputError, match="unknown GPU profile 'nope'"):
        load_gpu("nope")
    with pytest.raises(InputError, match="unknown node profile 'nope'"):
        load_node("nope")


def test_names_the_os_refuses_are_unknown_names():
    with pytest.raises(InputError, match="unknown cluster"):
        load_cluster("n" * 300)  # ENAMETOOLONG, not an OSError
    with pytest.raises(InputError, match="no such file"):
        load_cluster("n" * 300 + ".yaml")
    with pytest.raises(InputError, match="unknown GPU profile"):
        load_gpu("bad\0name")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(InputError, match=r"no-such\.yaml: no such file"):
        load_cluster(str(tmp_path / "no-such.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: [1, 2\n")
    with pytest.raises(InputError, match=r"bad\.yaml:.*malformed YAML"):
        load_cluster(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(InputError, match=r"bad\.yaml: expected a mapping"):
        load_cluster(str(bad))


def test_unknown_key_is_named(tmp_path):
    path = write_yaml(tmp_path / "n.yaml", dict(NODE, gpus_per_nod=8))
    with pytest.raises(InputError, match=r"n\.yaml: key 'gpus_per_nod': unknown key"):
        load_node(path)
    # a typo of a required key names the key written, not (only) the one that is missing
    data = dict(NODE)
    data["gpus_per_nod"] = data.pop("gpus_per_node")
    path = write_yaml(tmp_path / "typo.yaml", data)
    with pytest.raises(InputError, match=r"key 'gpus_per_nod': unknown key"):
        load_node(path)


def test_wrong_type_and_negative_values(tmp_path):
    with pytest.raises(InputError, match=r"key 'gpus_per_node'.*'eight'"):
        node_from_mapping(dict(NODE, gpus_per_node="eight"), "n.yaml")
    with pytest.raises(InputError, match=r"key 'host_memory_GiB'.*greater than 0"):
        node_from_mapping(dict(NODE, host_memory_GiB=-1), "n.yaml")
    with pytest.raises(InputError, match=r"key 'intra_node.bandwidth_GBps'"):
        node_from_mapping(dict(NODE, intra_node={"bandwidth_GBps": -300}), "n.yaml")
    with pytest.raises(InputError, match=r"c.yaml: key 'nodes'"):
        cluster_from_mapping({"name": "c", "nodes": 0, "node": "dgx-a100-80gb"}, "c.yaml")


def test_per_collective_fits(tmp_path):
    """``collectives`` takes the four calibrated collectives only; intra_figures gives a fitted
    collective its own figures and any other the intra_node link's."""
    fits = {"reduce_scatter": {"bandwidth_GBps": 0.4, "latency_us": 700}}
    node = node_from_mapping(dict(NODE, collectives=fits), "n.yaml")
    assert node.intra_figures("reduce_scatter") == pytest.approx((0.4e9, 700e-6))
    assert node.intra_figures("all_reduce") == (node.intra_node.bytes_per_s, node.intra_node.latency_s)
    with pytest.raises(InputError, match=r"key 'collectives.broadcast.*should be 'all_reduce'"):
        node_from_mapping(dict(NODE, collectives={"broadcast": {"bandwidth_GBps": 1, "latency_us": 1}}), "n.yaml")
    with pytest.raises(InputError, match=r"key 'collectives.all_reduce.bandwidth_GBps'"):
        node_from_mapping(dict(NODE, collectives={"all_reduce": {"bandwidth_GBps": 0, "latency_us": 1}}), "n.yaml")


def test_fittable_collectives_are_priced_collectives():
    """Every collective a profile may carry a fit for is one the simulator prices by that name
    (a misspelt key would load and never be used)."""
    import typing

    from hwprofiles.algorithms import Collective
    from hwprofiles.schema import CollectiveName

    assert set(typing.get_args(CollectiveName)) <= {c.value for c in Collective}
    assert set(typing.get_args(CollectiveName)) == set(Collective) - {Collective.BROADCAST}


def test_nics_needed_by_nics_per_node():
    with pytest.raises(InputError, match="nic"):
        node_from_mapping({k: v for k, v in NODE.items() if k != "nic"}, "n.yaml")


def test_unknown_gpu_or_node_reference_names_the_file_and_key(tmp_path):
    path = write_yaml(tmp_path / "n.yaml", dict(NODE, gpu="no-such-gpu"))
    with pytest.raises(InputError, match=r"n\.yaml: key 'gpu': unknown GPU profile 'no-such-gpu'"):
        load_cluster(path)
    path = write_yaml(tmp_path / "c.yaml", {"name": "c", "nodes": 2, "node": "no-such-node"})
    with pytest.raises(InputError, match=r"c\.yaml: key 'node': unknown node profile 'no-such-node'"):
        load_cluster(path)


def test_resized_cluster_keeps_its_node_object():
    """with_nodes (every size of ``plan --nodes A:B``) gives the cluster a fresh load of that size
    gives, holding the very node and GPU objects it was made from: what the estimators cache per
    GPU by identity (simulator.cost.block_work.block_work) then serves every size."""
    one = load_cluster("dgx-a100-80gb", nodes=16)
    sized = with_nodes(one, 24)
    assert sized == load_cluster("dgx-a100-80gb", nodes=24)
    assert (sized.name, sized.nodes, sized.num_gpus) == ("dgx-a100-80gb-x24", 24, 192)
    assert sized.node is one.node and sized.gpu is one.gpu


def test_multi_node_cluster_needs_nics(tmp_path):
    lonely = dict(NODE, nics_per_node=0)
    del lonely["nic"]
    path = write_yaml(tmp_path / "n.yaml", lonely)
    assert load_cluster(path).nodes == 1  # one node: fine
    with pytest.raises(InputError, match=r"n\.yaml: key 'node'.*no NICs"):
        load_cluster(path, nodes=2)
    with pytest.raises(InputError, match=r"c\.yaml.*no NICs"):
        cluster_from_mapping({"name": "c", "nodes": 2, "node": lonely}, "c.yaml")
    with pytest.raises(InputError, match=r"on 2 nodes.*no NICs"):  # a sweep's size is checked as a file of it
        with_nodes(load_cluster(path), 2)


def test_error_messages_are_one_line():
    with pytest.raises(InputError) as e:
        node_from_mapping(dict(NODE, name=["multi\nline"], gpus_per_node=0, nics_per_node=-1), "n.yaml")
    assert "\n" not in str(e.value) and str(e.value).startswith("n.yaml: key '")
    assert "\n" not in str(InputError("a\nb\n  c"))


def test_schema_forbids_extra_keys_everywhere():
    with pytest.raises(ValueError):
        NodeProfile.model_validate(dict(NODE, intra_node={"bandwidth_GBps": 1, "bandwith": 2}))


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_numbers_must_be_finite(tmp_path, value):
    """An infinite or NaN figure (YAML's .inf, .nan) is refused at load with its key: let through,
    an infinite oversubscription crashed the DES and an infinite latency gave a NaN step time."""
    data = {
        "name": "c",
        "nodes": 2,
        "node": "dgx-a100-80gb",
        "network": {"topology": "fat-tree", "oversubscription": value},
    }
    with pytest.raises(InputError, match=r"network\.oversubscription.*finite"):
        cluster_from_mapping(data, "c.yaml")
    from simulator.specs import ModelSpec

    with pytest.raises(ValueError, match="finite"):
        ModelSpec(name="m", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100, rope_theta=value)


def test_a_boolean_is_not_a_number():
    """YAML's true is not a count: pydantic's lax mode read `nodes: true` as one node and
    `num_layers: true` as a one-layer model; a boolean field still takes one."""
    from simulator.specs import ModelSpec

    with pytest.raises(InputError, match=r"key 'nodes': expected an integer, not true or false"):
        cluster_from_mapping({"name": "c", "nodes": True, "node": "dgx-a100-80gb"}, "c.yaml")
    shape = {"name": "m", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "seq_length": 64}
    with pytest.raises(ValueError, match="expected an integer, not true or false"):
        ModelSpec(num_layers=True, **shape)
    assert not ModelSpec(num_layers=2, tie_embeddings=False, **shape).tie_embeddings


@pytest.mark.parametrize(
    ("value", "why"),
    [("32", "expected an integer, not text"), (32.0, "expected an integer, not a decimal number")],
)
def test_text_and_decimals_are_not_counts(value, why):
    """A quoted figure or 32.0 for a count is refused, as the README's bad-input table says a
    wrong type is (pydantic's lax mode had read both as 32); a number field still takes an integer."""
    from simulator.specs import ModelSpec

    with pytest.raises(InputError, match=f"key 'nodes': {why}"):
        cluster_from_mapping({"name": "c", "nodes": value, "node": "dgx-a100-80gb"}, "c.yaml")
    shape = {"name": "m", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "seq_length": 64}
    with pytest.raises(ValueError, match=why):
        ModelSpec(num_layers=value, **shape)
    with pytest.raises(ValueError, match="rope_theta\n  expected a number, not text"):
        ModelSpec(num_layers=2, rope_theta="10000", **shape)
    assert ModelSpec(num_layers=2, rope_theta=10000, **shape).rope_theta == 10000.0


def test_a_node_with_the_longest_name_makes_clusters_of_any_size(tmp_path):
    """A cluster of nodes is named <node>-x<N>: a 200-character node name (the name rule's most)
    made a 203-character cluster name, refused as the node file's."""
    from hwprofiles.names import NAME_MAX

    node = yaml.safe_load((NODE_DIR / "dgx-a100-80gb.yaml").read_text())
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(dict(node, name="n" * NAME_MAX)))
    two = load_cluster(str(path), 2)
    thousand = with_nodes(two, 1000)
    assert (len(two.name), two.name[-4:]) == (NAME_MAX, "n-x2")
    assert (len(thousand.name), thousand.name[-7:]) == (NAME_MAX, "n-x1000")
