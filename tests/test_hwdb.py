"""Hardware database: shipped files, sources, name resolution, model arithmetic, user-folder errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hwdb
from hwdb import HwdbError
from hwdb.coldstart import load_coldstart
from hwdb.db import DATA_DIR
from hwdb.listing import describe, gpu_rows, link_rows, model_rows
from hwdb.schema import EfficiencyCurve, Figure

# canonical name -> an alias that must resolve to it
GPUS = {
    "H100-SXM-80GB": "H100",
    "A100-SXM-40GB": "A100-40GB",
    "A100-SXM-80GB": "A100-80GB",
    "H100-PCIe-80GB": "H100-PCIe",
    "H200-SXM-141GB": "H200",
    "B200-SXM-180GB": "B200",
    "GB200": "GB200-NVL72",
    "L40S": "l40s",
    "L4": "l4",
    "RTX-PRO-6000-Blackwell-Server": "RTX-PRO-6000",
    "RTX-4090": "RTX4090",
    "MI300X": "mi300x",
    "MI325X": "mi325x",
}
LINKS = {
    "nvlink3": "NVLink3",
    "nvlink4": "NVLink4",
    "nvlink5": "NVLink5",
    "pcie-gen4-x16": "pcie4",
    "pcie-gen5-x16": "pcie5",
    "xgmi": "infinity-fabric",
    "ib-hdr": "HDR",
    "ib-ndr": "NDR",
    "ib-xdr": "XDR",
    "roce-100": "RoCE-100",
    "roce-200": "RoCE-200",
    "roce-400": "RoCE-400",
    "tcp-10gbe": "10GbE",
    "tcp-25gbe": "25GbE",
    "tcp-100gbe": "100GbE",
    "cloud-vpc": "vpc",
}
MODELS = {
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B",
    "Llama-3.1-405B": "meta-llama/Llama-3.1-405B",
    "Llama-2-70B": "meta-llama/Llama-2-70b-hf",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen2.5-32B": "Qwen/Qwen2.5-32B-Instruct",
    "Qwen2.5-72B": "Qwen/Qwen2.5-72B-Instruct",
    "Qwen3-32B": "Qwen/Qwen3-32B",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "Mixtral-8x7B": "mistralai/Mixtral-8x7B-v0.1",
    "DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "Qwen2.5-VL-7B": "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen2.5-VL-72B": "Qwen/Qwen2.5-VL-72B-Instruct",
}


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


# ---------------------------------------------------------------- shipped data
def test_every_shipped_file_is_loaded(db):
    assert len(db.gpus) == len(list((DATA_DIR / "gpus").glob("*.yaml")))
    assert len(db.links) == len(list((DATA_DIR / "links").glob("*.yaml")))
    assert len(db.models) == len([p for p in (DATA_DIR / "models").iterdir() if p.is_dir()])


def _figures(obj, where=""):
    """Yield (location, Figure | EfficiencyCurve) for every sourced number in a schema object."""
    for name in type(obj).model_fields:
        val = getattr(obj, name)
        if isinstance(val, (Figure, EfficiencyCurve)):
            yield f"{where}{name}", val
        elif isinstance(val, dict):
            for k, v in val.items():
                if isinstance(v, (Figure, EfficiencyCurve)):
                    yield f"{where}{name}.{k}", v


def test_every_figure_has_a_source(db):
    n = 0
    for item in [*db.gpus.values(), *db.links.values()]:
        for loc, fig in _figures(item, f"{item.name}."):
            assert fig.source and fig.source.strip(), loc
            n += 1
    assert n > 200
    for m in db.models.values():
        assert m.sidecar.source.strip(), m.name
        if m.sidecar.vision is not None:
            assert str(m.sidecar.vision.get("source", "")).strip(), m.name


def test_every_gpu_references_defined_links(db):
    for g in db.gpus.values():
        assert g.intra_node_link in db.links, g.name
        assert g.scale_out_link is None or g.scale_out_link in db.links, g.name


def test_dense_peaks_sane(db):
    for g in db.gpus.values():
        assert "bf16" in g.peak_flops, g.name
        for dt in ("fp8", "fp4", "int8"):
            if dt in g.peak_flops:
                assert g.peak_flops[dt].value >= g.peak_flops["bf16"].value, (g.name, dt)
    assert "fp8" not in db.gpu("A100-80GB").peak_flops and "int8" in db.gpu("A100-80GB").peak_flops
    assert "fp4" in db.gpu("B200").peak_flops and "fp4" in db.gpu("GB200").peak_flops
    assert db.gpu("H200").memory_bandwidth_Bps.value == pytest.approx(4.8e12)


@pytest.mark.parametrize("name,alias", sorted(GPUS.items()))
def test_gpu_resolves(db, name, alias):
    assert db.gpu(name).name == name
    assert db.gpu(alias).name == name
    assert db.gpu(name.lower()).name == name


def test_one_lookup_rule_for_every_table(db):
    """GPUs, links, models and cold-start entries resolve alike: case and '-' vs '_' don't matter, and an
    unknown name lists the known ones."""
    assert db.gpu("h100_sxm_80gb").name == "H100-SXM-80GB"
    cs = load_coldstart()
    some = sorted(cs.storage)[0]
    assert cs.storage_path(some.upper().replace("_", "-")) is cs.storage_path(some)
    with pytest.raises(HwdbError, match=r"unknown GPU 'H999'\. Known GPUs: .*H100-SXM-80GB"):
        db.gpu("H999")
    with pytest.raises(HwdbError, match=rf"unknown storage 'tape'\. Known storages: .*{some}.*coldstart/"):
        cs.storage_path("tape")


@pytest.mark.parametrize("name,alias", sorted(LINKS.items()))
def test_link_resolves(db, name, alias):
    assert db.link(name).name == name
    assert db.link(alias).name == name


@pytest.mark.parametrize("name,alias", sorted(MODELS.items()))
def test_model_resolves(db, name, alias):
    assert db.model(name).name == name
    assert db.model(alias).name == name


def test_links_direct_flags(db):
    for link in db.links.values():
        if link.kind in ("nvlink", "infiniband", "roce", "xgmi"):
            assert link.gpu_direct and link.cpu_cost_s_per_byte.value == 0, link.name
        if link.kind in ("tcp", "vpc"):
            assert not link.gpu_direct and link.cpu_cost_s_per_byte.value > 0, link.name
        assert 0 < link.efficiency.value <= 1, link.name


# ---------------------------------------------------------------- model arithmetic
PUBLISHED = [  # name, total params, active params (None: dense, active == total)
    ("Llama-3.1-8B", 8.03e9, None),
    ("Llama-3.1-70B", 70.6e9, None),
    ("Llama-3.1-405B", 405.9e9, None),
    ("Llama-2-70B", 69.0e9, None),
    ("Qwen2.5-7B", 7.6e9, None),
    ("Qwen2.5-72B", 72.7e9, None),
    ("Qwen3-32B", 32.8e9, None),
    ("Mixtral-8x7B", 46.7e9, 12.9e9),
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("DeepSeek-V3", 671e9, 37e9),  # MTP module excluded
]


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_parameter_counts_match_published(db, name, total, active):
    a = db.model(name).arch
    assert a.total_params == pytest.approx(total, rel=0.03)
    assert a.active_params == pytest.approx(active if active is not None else total, rel=0.03)
    assert a.active_params <= a.total_params


def test_kv_bytes_per_token(db):
    assert db.model("Llama-3.1-70B").arch.kv_elems_per_token * 2 == 327_680
    assert db.model("DeepSeek-V3").arch.kv_elems_per_token * 2 == 61 * (512 + 64) * 2
    assert db.model("Qwen2.5-7B").arch.kv_elems_per_token * 2 == 28 * 2 * 4 * 128 * 2


def test_architecture_features(db):
    ds = db.model("DeepSeek-V3").arch
    assert ds.is_mla and ds.is_moe
    assert (ds.num_experts, ds.experts_per_token, ds.num_shared_experts, ds.first_dense_layers) == (256, 8, 1, 3)
    mx = db.model("Mixtral-8x7B").arch
    assert mx.is_moe and (mx.num_experts, mx.experts_per_token) == (8, 2)
    assert mx.moe_intermediate_size == 14336
    q3 = db.model("Qwen3-30B-A3B").arch
    assert (q3.num_experts, q3.experts_per_token, q3.moe_intermediate_size) == (128, 8, 768)
    assert not db.model("Llama-3.1-70B").arch.is_moe


@pytest.mark.parametrize("name,out_hidden", [("Qwen2.5-VL-7B", 3584), ("Qwen2.5-VL-72B", 8192)])
def test_vision_sidecar(db, name, out_hidden):
    m = db.model(name)
    v = m.sidecar.vision
    vc = m.config["vision_config"]
    for key in (
        "depth",
        "hidden_size",
        "num_heads",
        "patch_size",
        "spatial_merge_size",
        "temporal_patch_size",
        "out_hidden_size",
    ):
        assert v[key] == vc[key], key
    assert v["out_hidden_size"] == out_hidden == m.arch.hidden_size
    assert (v["min_pixels"], v["max_pixels"]) == (3136, 12845056)


def test_vl_text_config_nesting_is_read():
    """A newer-style config with text fields under text_config parses to the same LM."""
    cfg = json.loads((DATA_DIR / "models" / "Qwen2.5-VL-7B" / "config.json").read_text())
    text_keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_hidden_layers",
        "num_key_value_heads",
        "vocab_size",
        "tie_word_embeddings",
    )
    nested = {k: v for k, v in cfg.items() if k not in text_keys}
    nested["text_config"] = {k: cfg[k] for k in text_keys}
    a, b = hwdb.arch_from_config(cfg, "x"), hwdb.arch_from_config(nested, "x")
    assert a.total_params == b.total_params and a.kv_elems_per_token == b.kv_elems_per_token


# ---------------------------------------------------------------- listing
def test_listing_rows(db):
    g = {r["name"]: r for r in gpu_rows(db)}
    assert set(GPUS) <= set(g)
    assert g["A100-SXM-80GB"]["fp8_TFLOPS"] is None and g["B200-SXM-180GB"]["fp4_TFLOPS"] == 9000
    lk = {r["name"]: r for r in link_rows(db)}
    assert set(LINKS) <= set(lk) and lk["ib-ndr"]["bandwidth_GBps"] == 50
    m = {r["name"]: r for r in model_rows(db)}
    assert set(MODELS) <= set(m)
    assert m["DeepSeek-V3"]["moe"] == "256e top-8 +1s" and m["DeepSeek-V3"]["mla"]
    assert m["Llama-3.1-70B"]["moe"] is False and m["Mixtral-8x7B"]["moe"] == "8e top-2"
    assert m["Llama-3.1-70B"]["kv_bytes_per_token_bf16"] == 327_680
    assert m["Qwen2.5-VL-7B"]["vision"] and not m["Qwen3-32B"]["vision"]
    json.dumps([gpu_rows(db), link_rows(db), model_rows(db)])  # plain data


def test_describe(db):
    d = describe(db, "gpu", "H200")
    assert d["name"] == "H200-SXM-141GB" and "source" in d["memory_bytes"]
    assert d["links"]["intra_node"]["name"] == "nvlink4"
    d = describe(db, "link", "NDR")
    assert "H100-SXM-80GB" in d["used_by_gpus"] and d["bandwidth_Bps"]["source"]
    d = describe(db, "model", "DeepSeek-V3")
    assert d["architecture"]["derived"]["kv_bytes_per_token"]["bf16"] == 70_272
    assert d["config"]["model_type"] == "deepseek_v3" and d["source"]
    json.dumps(describe(db, "model", "Qwen2.5-VL-72B"))
    with pytest.raises(HwdbError, match="Known kinds"):
        describe(db, "switch", "x")
    with pytest.raises(HwdbError, match="H200-SXM-141GB"):
        describe(db, "gpu", "H900")


# ---------------------------------------------------------------- user folders and errors
H100_TEXT = (DATA_DIR / "gpus" / "H100-SXM-80GB.yaml").read_text()


def _user_gpu(tmp_path: Path, text: str, fname: str = "MyGPU.yaml") -> Path:
    (tmp_path / "gpus").mkdir(exist_ok=True)
    p = tmp_path / "gpus" / fname
    p.write_text(text)
    return p


def _mine(text: str) -> str:
    return text.replace("name: H100-SXM-80GB", "name: My-GPU").replace(
        "aliases: [H100, H100-SXM, h100_sxm]", "aliases: [mine]"
    )


def test_user_gpu_loads_and_overrides(tmp_path):
    _user_gpu(tmp_path, _mine(H100_TEXT).replace("value: 4.25", "value: 1.99"))
    db = hwdb.load([tmp_path])
    assert db.gpu("mine").price_usd_per_hour.value == 1.99
    assert db.gpu("H100").price_usd_per_hour.value == 4.25
    # same name in a later folder wins
    _user_gpu(tmp_path, H100_TEXT.replace("value: 4.25", "value: 3.00"), "H100.yaml")
    assert hwdb.load([tmp_path]).gpu("H100").price_usd_per_hour.value == 3.00


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda t: t.replace("memory_bytes:", "memory_byte:"), "memory_byte"),
        (lambda t: t.replace("power_W: {value: 700", "power_W: {value: -700"), "power_W.value"),
        (lambda t: t.replace("gpus_per_node: 8", "gpus_per_node: many"), "gpus_per_node"),
        (lambda t: t.replace("  fp8: {", "  fp6: {"), "peak_flops"),
        (lambda t: t.replace('source: "NVIDIA H100 SXM datasheet, max TDP"', 'source: ""'), "power_W.source"),
    ],
)
def test_bad_user_gpu_names_file_and_field(tmp_path, mutate, field):
    bad = _mine(H100_TEXT)
    assert mutate(bad) != bad
    p = _user_gpu(tmp_path, mutate(bad))
    with pytest.raises(HwdbError) as ei:
        hwdb.load([tmp_path])
    msg = str(ei.value)
    assert str(p) in msg and field in msg, msg


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = _user_gpu(tmp_path, _mine(H100_TEXT).replace("vendor: nvidia", "vendor: [nvidia"))
    with pytest.raises(HwdbError) as ei:
        hwdb.load([tmp_path])
    msg = str(ei.value)
    assert str(p) in msg and "YAML" in msg and "line" in msg, msg


def test_unknown_link_names_file_and_field(tmp_path):
    p = _user_gpu(tmp_path, _mine(H100_TEXT).replace("intra_node_link: nvlink4", "intra_node_link: nvlink9"))
    with pytest.raises(HwdbError) as ei:
        hwdb.load([tmp_path])
    msg = str(ei.value)
    assert str(p) in msg and "intra_node_link" in msg and "nvlink9" in msg and "nvlink4" in msg, msg


def test_user_link_can_be_referenced(tmp_path):
    (tmp_path / "links").mkdir()
    link_text = (DATA_DIR / "links" / "nvlink4.yaml").read_text().replace("name: nvlink4", "name: my-fabric")
    (tmp_path / "links" / "my-fabric.yaml").write_text(link_text.replace("aliases: [NVLink4, nvlink-4]", "aliases: []"))
    _user_gpu(tmp_path, _mine(H100_TEXT).replace("intra_node_link: nvlink4", "intra_node_link: my-fabric"))
    assert hwdb.load([tmp_path]).gpu("My-GPU").intra_node_link == "my-fabric"


def test_unknown_gpu_lists_known_names(db):
    with pytest.raises(HwdbError) as ei:
        db.gpu("H900")
    msg = str(ei.value)
    for name in ("H100-SXM-80GB", "MI300X", "L4", "RTX-4090"):
        assert name in msg


def test_missing_user_folder(tmp_path):
    with pytest.raises(HwdbError, match="does not exist"):
        hwdb.load([tmp_path / "nope"])


def test_user_model_folder_with_only_config(tmp_path, db):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    shutil.copy(DATA_DIR / "models" / "Llama-3.1-8B" / "config.json", folder / "config.json")
    m = db.model(str(folder))
    assert m.name == "my-llama"
    assert m.arch.total_params == db.model("Llama-3.1-8B").arch.total_params
    assert db.model(str(folder / "config.json")).arch.num_layers == 32
    # and as a model folder inside a user hwdb folder
    (tmp_path / "hw" / "models").mkdir(parents=True)
    shutil.copytree(folder, tmp_path / "hw" / "models" / "my-llama")
    assert hwdb.load([tmp_path / "hw"]).model("my-llama").arch.num_layers == 32


def test_bad_user_model_config(tmp_path, db):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(HwdbError) as ei:
        db.model(str(folder))
    assert "config.json" in str(ei.value) and "num_attention_heads" in str(ei.value)
