"""Spec errors at the library level: every malformed or illegal spec raises one SpecError whose
message names the file, the key and (where one exists) the close match (DESIGN.md "Spec strictness").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import SpecError
from planner.spec.hardware import load_cluster
from planner.spec.model import load_model

TINY = """\
name: tiny
layers: 2
hidden: 64
heads: 4
ffn_hidden: 256
vocab: 100
"""

CLUSTER = """\
name: mine
gpu: {name: h100-custom, memory_gib: 80, hbm_GBps: 3350, tflops: {bf16: 989}}
gpus_per_node: 8
intra_node: {GBps: 450, latency_us: 3}
inter_node: {GBps: 50, latency_us: 6}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def spec_error(load, path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load(str(path))
    message = str(info.value)
    assert "\n" not in message, "a spec error is one line"
    return message


def test_tiny_model_fixture_loads(tmp_path):
    """The base the error cases below break one key of is itself valid."""
    model = load_model(str(write(tmp_path, "tiny.yaml", TINY)))
    assert (model.layers, model.hidden, model.heads, model.head_dim) == (2, 64, 4, 16)


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "broken.yaml", "name: x\nlayers: [1, 2\n")
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "malformed YAML" in message
    assert "line 3" in message


def test_malformed_json_config_names_file_and_position(tmp_path):
    path = write(tmp_path, "hf/config.json", '{"model_type": "llama",,}')
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "malformed JSON" in message
    assert "line 1, column 24" in message


def test_top_level_list_is_not_a_model(tmp_path):
    path = write(tmp_path, "list.yaml", "- layers: 2\n")
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "expected a mapping" in message


def test_unknown_key_names_key_file_and_close_match(tmp_path):
    path = write(tmp_path, "typo.yaml", TINY + "hiden: 64\n")
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "hiden: unknown key" in message
    assert "did you mean hidden" in message


def test_unknown_key_in_moe_block_names_nested_path(tmp_path):
    moe = "moe:\n  experts: 4\n  top_k: 1\n  expert_ffn_hidden: 64\n  topk: 2\n"
    path = write(tmp_path, "moe.yaml", TINY + moe)
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "moe.topk: unknown key" in message
    assert "did you mean top_k" in message


def test_missing_required_field(tmp_path):
    path = write(tmp_path, "nolayers.yaml", TINY.replace("layers: 2\n", ""))
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "layers: missing (required)" in message


@pytest.mark.parametrize("key, bad", [("hidden", -1), ("layers", 0), ("heads", -4), ("vocab", 0)])
def test_non_positive_sizes_are_rejected(tmp_path, key, bad):
    text = "\n".join(f"{key}: {bad}" if line.startswith(f"{key}:") else line for line in TINY.splitlines())
    path = write(tmp_path, f"{key}.yaml", text + "\n")
    message = spec_error(load_model, path)
    assert str(path) in message
    assert f"{key}: expected an integer >= 1, got {bad}" in message


def test_string_where_integer_expected(tmp_path):
    path = write(tmp_path, "str.yaml", TINY.replace("hidden: 64", "hidden: big"))
    message = spec_error(load_model, path)
    assert "hidden: expected an integer, got 'big'" in message


def test_unknown_preset_lists_close_matches():
    with pytest.raises(SpecError) as info:
        load_model("llama3-8")
    message = str(info.value)
    assert "unknown model preset 'llama3-8'" in message
    assert "did you mean llama3-8b" in message


def test_missing_model_file():
    with pytest.raises(SpecError, match=r"/nonexistent/m\.yaml: no such model file"):
        load_model("/nonexistent/m.yaml")


def test_unsupported_hf_model_type_lists_supported(tmp_path):
    path = write(tmp_path, "mamba/config.json", json.dumps({"model_type": "mamba", "hidden_size": 64}))
    message = spec_error(load_model, path)
    assert str(path) in message
    assert "model_type 'mamba' is not supported" in message
    assert "llama" in message  # the supported types are listed


def test_inline_gpu_cluster_without_efficiency_gets_family_default(tmp_path):
    cluster = load_cluster(str(write(tmp_path, "mine.yaml", CLUSTER)))
    assert cluster.gpu.name == "h100-custom"
    assert cluster.gpu.flops("bf16") == pytest.approx(989e12)
    assert cluster.source == ""
    assert cluster.efficiency.source.startswith("default (")
    assert cluster.efficiency.source == "default (hopper)"


def test_hosts_must_tile_a_node(tmp_path):
    """gpus_per_host (a node, the NVLink domain, spanning several hosts) must divide the node."""
    path = write(tmp_path, "hosts.yaml", CLUSTER.replace("gpus_per_node: 8", "gpus_per_node: 8\ngpus_per_host: 3"))
    message = spec_error(load_cluster, path)
    assert str(path) in message and "gpus_per_host" in message and "divisor of gpus_per_node (8)" in message
    fine = load_cluster(str(write(tmp_path, "fine.yaml", CLUSTER.replace("gpus_per_node: 8", "gpus_per_node: 8\ngpus_per_host: 4"))))
    assert fine.count_unit == (4, "hosts") and load_cluster(str(write(tmp_path, "m.yaml", CLUSTER))).count_unit == (8, "nodes")
    assert "gpus_per_host" not in load_cluster(str(write(tmp_path, "m2.yaml", CLUSTER))).to_dict()  # plans unchanged


def test_unknown_key_in_intra_node(tmp_path):
    path = write(tmp_path, "typo.yaml", CLUSTER.replace("latency_us: 3}", "latncy_us: 3}"))
    message = spec_error(load_cluster, path)
    assert str(path) in message
    assert "intra_node.latncy_us: unknown key" in message
    assert "did you mean latency_us" in message


def test_gpu_without_tflops(tmp_path):
    path = write(tmp_path, "notflops.yaml", CLUSTER.replace(", tflops: {bf16: 989}", ""))
    message = spec_error(load_cluster, path)
    assert str(path) in message
    assert "tflops: missing (required)" in message


def test_gpu_with_empty_tflops(tmp_path):
    path = write(tmp_path, "emptytflops.yaml", CLUSTER.replace("tflops: {bf16: 989}", "tflops: {}"))
    message = spec_error(load_cluster, path)
    assert "tflops" in message


def test_cluster_missing_inter_node(tmp_path):
    text = "".join(line + "\n" for line in CLUSTER.splitlines() if not line.startswith("inter_node"))
    message = spec_error(load_cluster, write(tmp_path, "nointer.yaml", text))
    assert "inter_node: missing (required)" in message


def test_unnamed_gpu_family_from_its_peak(tmp_path):
    """A GPU whose name says nothing takes its family from the bf16 peak (documented defaults)."""
    from planner.spec.hardware import Cluster

    spec = {"name": "mystery", "gpu": {"name": "x1", "memory_gib": 96, "hbm_GBps": 4000, "tflops": {"bf16": 1000}},
            "gpus_per_node": 4, "intra_node": {"GBps": 300}, "inter_node": {"GBps": 25}}
    assert Cluster.from_dict(spec, "mystery.yaml").efficiency.source == "default (hopper)"
    spec["gpu"]["tflops"] = {"bf16": 50}
    assert Cluster.from_dict(spec, "mystery.yaml").efficiency.source == "default (generic)"


def test_explicit_graph_model_plans_with_yaml_exponents():
    """A graph model (tests/data/toy-cnn.yaml writes 2.0e9, which YAML 1.1 reads as a string)."""
    from planner.planning import make_plan

    model = load_model(str(Path(__file__).parent / "data" / "toy-cnn.yaml"))
    assert model.is_graph and model.graph[0].fwd_flops == 2.0e9
    plan = make_plan(model, load_cluster("dgx-a100-80g"), gpus=8, global_batch=256, seq_len=1, precision="bf16",
                     attention="flash", runtime="any", constraints={})
    assert plan["strategy"]["tp"] == 1 and plan["prediction"]["fits"]


def test_efficiency_blocks_of_both_versions_load_and_others_are_refused(tmp_path):
    import yaml

    from planner.spec.efficiency import Efficiency, LegacyEfficiency
    from planner.spec.hardware import Cluster

    base = yaml.safe_load((Path(__file__).parent.parent / "hardware" / "clusters" / "dgx-h100.yaml").read_text())
    v1 = dict(base, efficiency={"gemm_peak_fraction": 0.7, "gemm_intensity_half": 100, "hbm_fraction": 0.9,
                                "intra_link_fraction": 0.8, "inter_link_fraction": 0.8, "dp_overlap_fraction": 0.5,
                                "tp_overlap_fraction": 0.0})
    assert isinstance(Cluster.from_dict(v1, "v1.yaml").efficiency, LegacyEfficiency)
    v2 = dict(base, efficiency={"version": 2, "framework_fraction": 0.8, "fitted": ["framework_fraction"]})
    eff = Cluster.from_dict(v2, "v2.yaml").efficiency
    assert isinstance(eff, Efficiency) and eff.framework_fraction == 0.8 and eff.dp_overlap_fraction == 0.5
    for bad, needle in (({"version": 3}, "version"), ({"version": 2, "gemm_peak_fraction": 0.7}, "gemm_peak_fraction"),
                        ({"version": 2, "framework_fraction": 1.5}, "framework_fraction"),
                        ({"version": 2, "fitted": ["hbm"]}, "fitted")):
        with pytest.raises(SpecError, match=needle):
            Cluster.from_dict(dict(base, efficiency=bad), "bad.yaml")


def test_a_borrowed_block_is_its_lenders_read_from_there_and_refused_where_it_would_pass_a_guess_on(tmp_path):
    """efficiency: {borrowed_from: NAME} takes NAME's fitted block (so a refit reaches every
    borrower), says so in its source, and refuses a lender that borrows or was never fitted, a
    mixed cluster, another GPU family and values beside it."""
    lender = load_cluster("dgx-h100").efficiency
    for name in ("dgx-h200", "grand-teton-h100"):
        eff = load_cluster(name).efficiency
        assert eff.values() == lender.values() and eff.fitted == lender.fitted
        assert eff.source == "borrowed from dgx-h100: fitted there on its runs, none on this cluster"
    assert load_cluster("dgx-a100-40g").efficiency.values() == load_cluster("dgx-a100-80g").efficiency.values()
    assert load_cluster("gb200-nvl72").efficiency.values() == load_cluster("dgx-b200").efficiency.values()
    mine = CLUSTER + "efficiency: {borrowed_from: dgx-h100}\n"
    assert load_cluster(str(write(tmp_path, "mine.yaml", mine))).efficiency.values() == lender.values()
    unfitted = write(tmp_path, "unfitted.yaml", CLUSTER)
    for text, needle in ((CLUSTER + "efficiency: {borrowed_from: dgx-h200}\n", "borrows its block from 'dgx-h100'"),
                         (CLUSTER + f"efficiency: {{borrowed_from: {unfitted}}}\n", "no block fitted on its own runs"),
                         (CLUSTER + "efficiency: {borrowed_from: h100-plus-a100}\n", "mixed cluster"),
                         (CLUSTER + "efficiency: {borrowed_from: dgx-a100-80g}\n", "within a GPU family"),
                         (CLUSTER + "efficiency: {borrowed_from: dgx-h100, framework_fraction: 0.9}\n",
                          "framework_fraction: nothing goes beside borrowed_from"),
                         (CLUSTER + "efficiency: {borrowed_from: no-such-cluster}\n", "no-such-cluster")):
        path = write(tmp_path, "borrower.yaml", text)
        message = spec_error(load_cluster, path)
        assert str(path) in message and needle in message, message


DERATED = """\
name: mine
gpu: {name: h100-capped, derated_from: {gpu: h100-sxm-80g, compute: 0.5}, memory_gib: 90, hbm_GBps: 2000}
gpus_per_node: 8
intra_node: {GBps: 450, latency_us: 3}
inter_node: {GBps: 50, latency_us: 6}
"""


def test_a_derated_gpu_is_its_base_slower_with_its_own_keys(tmp_path):
    """derated_from scales the base's dense peaks and measured attention throughputs by the
    factor, keeps its measured fractions of peak, and takes every key the file states."""
    from planner.spec.hardware import load_gpu
    base = load_gpu("h100-sxm-80g")
    gpu = load_cluster(str(write(tmp_path, "c.yaml", DERATED))).gpu
    assert gpu.name == "h100-capped" and gpu.family == base.family
    assert gpu.memory_bytes == 90 * 1024**3 and gpu.hbm_Bps == 2000e9
    assert dict(gpu.peak_flops) == pytest.approx({p: v / 2 for p, v in base.peak_flops})
    assert gpu.measured.gemm_fraction == base.measured.gemm_fraction
    assert gpu.measured.hbm_fraction == base.measured.hbm_fraction
    for mine, theirs in zip(gpu.measured.attention, base.measured.attention, strict=True):
        assert (mine.kernel, mine.causal, mine.head_dim) == (theirs.kernel, theirs.causal, theirs.head_dim)
        assert [t for _, t in mine.points] == pytest.approx([t / 2 for _, t in theirs.points])
    assert load_gpu("h100-sxm-96g-500w").flops("bf16") == pytest.approx(0.895 * base.flops("bf16"))


@pytest.mark.parametrize("change, expected", [
    ("compute: 0.5", "compute: 1.5"),
    ("compute: 0.5", "compute: 0.5, speed: 2"),
    ("gpu: h100-sxm-80g", "gpu: h100-sxm-8g"),
    ("memory_gib: 90", "memory_gib: 90, tflops: {bf16: 500}"),
])
def test_a_bad_derating_names_its_key(tmp_path, change, expected):
    message = spec_error(load_cluster, write(tmp_path, "c.yaml", DERATED.replace(change, expected)))
    assert "c.yaml" in message
    assert any(k in message for k in ("compute", "speed", "h100-sxm-8g", "tflops")), message


def test_a_gpu_derated_from_itself_is_refused(tmp_path):
    path = write(tmp_path, "loop.yaml", "name: loop\nderated_from: {gpu: PATH, compute: 0.9}\n")
    path.write_text(path.read_text().replace("PATH", str(path)))
    from planner.spec.hardware import load_gpu
    message = spec_error(load_gpu, path)
    assert "cycle" in message
