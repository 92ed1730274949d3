"""runtime.serve.modelrepo: a model repository in Triton's layout and its per-model ``config.yaml`` (pure:
no device; small ONNX models compiled by ``vnpu atc``'s compiler into real ``.om`` files).

Every key the module documents parses to what it says; every bad key or value is refused with the file,
the line and the key path; a configuration is completed from (and checked against) its ``.om``; the scan
reports each version READY or UNAVAILABLE with the reason, under the version policy."""
from __future__ import annotations

import json
import re
import textwrap

import pytest
from onnx import TensorProto, helper

from onnx_models import cnn, gelu_mlp, make_model
from runtime.atc import compile_model, make_options
from runtime.serve.engine.placement import Placement
from runtime.serve.modelrepo import (READY, UNAVAILABLE, DynamicBatching, InstanceGroup, ModelConfigError,
                                     QueuePolicy, TensorSpec, VersionPolicy, batch_gears, complete, derive,
                                     parse_model_config, read_om_info, scan_model, scan_repository, single_model,
                                     v2_datatype)
from runtime.serve.modelrepo import config as config_module

FILE = "m/config.yaml"


def parse(text: str, name: str = "m"):
    return parse_model_config(textwrap.dedent(text), name, FILE)


def refused(text: str, line: int, *parts: str):
    """The config is refused at ``line`` with a message naming each of ``parts``."""
    with pytest.raises(ModelConfigError) as e:
        parse(text).build()
    msg = e.value.detail
    assert msg.startswith(f"{FILE}: line {line}: "), msg
    for p in parts:
        assert p in msg, (p, msg)
    return msg


# ------------------------------------------------------------------------------------------ config.yaml
def test_every_documented_key_parses():
    doc = config_module.__doc__
    example = textwrap.dedent(doc[doc.index("::") + 2:doc.index("Every mistake")])
    cfg = parse_model_config(example, "resnet", FILE).build()
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("resnet", "vnpu_om", 8)
    assert cfg.version_policy == VersionPolicy("latest", 1)
    assert cfg.inputs == (TensorSpec("x", "FP32", (3, 32, 32)),)
    assert cfg.outputs == (TensorSpec("probs", "FP32", (10,)),)
    db = cfg.dynamic_batching
    assert (db.preferred_batch_size, db.max_queue_delay_microseconds, db.min_batch) == ((4, 8), 2000, 2)
    assert (db.priority_levels, db.default_priority_level) == (2, 2)
    assert db.default_queue_policy == QueuePolicy("REJECT", 0, True, 64)
    assert db.queue_policy(1) == QueuePolicy("DELAY", 50000, False, 16)
    assert db.queue_policy(2) == db.default_queue_policy
    assert cfg.instance_group == (InstanceGroup(2, "KIND_NPU", (0, 1)), InstanceGroup(1, "KIND_CPU"))
    assert cfg.fallback == (Placement((2,)), Placement(cpu=True))
    js = cfg.triton_json()
    assert json.loads(json.dumps(js)) == js
    assert js["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 32, 32]}]
    assert js["dynamic_batching"]["priority_queue_policy"]["1"]["timeout_action"] == "DELAY"
    assert js["instance_group"][0] == {"name": "resnet_0", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}
    assert js["parameters"] == {"fallback": {"string_value": "2;cpu"}, "min_batch": {"string_value": "2"}}


def test_empty_file_gives_the_defaults():
    p = parse("")
    assert p.values == () and not p.given("max_batch_size")
    cfg = p.build()
    assert cfg.max_batch_size == 0 and cfg.dynamic_batching is None and cfg.fallback == (Placement(cpu=True),)
    assert cfg.instance_group == (InstanceGroup(),) and cfg.version_policy == VersionPolicy()


def test_seed_aliases():
    cfg = parse("""
        dynamic_batching: {max_batch: 16, timeout_ms: 2.5, min_batch: 4}
    """).build()
    assert cfg.max_batch_size == 16 and cfg.dynamic_batching.max_queue_delay_microseconds == 2500
    assert cfg.dynamic_batching.min_batch == 4
    same = parse("max_batch_size: 16\ndynamic_batching: {max_batch: 16, timeout_ms: 1, "
                 "max_queue_delay_microseconds: 1000}").build()
    assert same.max_batch_size == 16 and same.dynamic_batching.max_queue_delay_microseconds == 1000


@pytest.mark.parametrize("text,want", [
    ("latest", VersionPolicy("latest", 1)), ("all", VersionPolicy("all")),
    ("{all: {}}", VersionPolicy("all")), ("{latest: 2}", VersionPolicy("latest", 2)),
    ("{latest: {num_versions: 3}}", VersionPolicy("latest", 3)),
    ("{specific: [3, 1]}", VersionPolicy("specific", versions=(3, 1))),
    ("{specific: {versions: [2]}}", VersionPolicy("specific", versions=(2,)))])
def test_version_policy_forms(text, want):
    assert parse(f"version_policy: {text}").build().version_policy == want


@pytest.mark.parametrize("policy,want", [(VersionPolicy("latest", 2), (3, 7)), (VersionPolicy("all"), (1, 3, 7)),
                                         (VersionPolicy("specific", versions=(1, 9)), (1,))])
def test_version_policy_select(policy, want):
    assert policy.select([7, 1, 3]) == want


def test_dynamic_batching_switches_and_triton_spellings():
    assert parse("max_batch_size: 4\ndynamic_batching: false").build().dynamic_batching is None
    assert parse("max_batch_size: 4\ndynamic_batching: true").build().dynamic_batching == DynamicBatching()
    g = parse("instance_group: [{kind: KIND_GPU, gpus: 1-2, count: 3}]").build().instance_group
    assert g == (InstanceGroup(3, "KIND_NPU", (1, 2)),)
    cfg = parse("input: [{name: a, data_type: FP16, dims: [-1]}, {name: b, data_type: int64, dims: [2, 2]}]").build()
    assert [(t.datatype, t.dtype) for t in cfg.inputs] == [("FP16", "float16"), ("INT64", "int64")]
    assert cfg.inputs[0].accepts((7,)) and not cfg.inputs[1].accepts((2, 3))


@pytest.mark.parametrize("text,line,parts", [
    ("bogus: 1", 1, ["unknown key bogus", "known: name"]),
    ("- a\n- b", 1, ["expected a mapping"]),
    ("max_batch_size: [1", 1, ["not valid YAML"]),
    ("name: other", 1, ["name:", "'other' differs from the model's directory 'm'"]),
    ("platform: tensorrt_plan", 1, ["platform", "vnpu_om"]),
    ("\nmax_batch_size: -1", 2, ["max_batch_size", "integer >= 0"]),
    ("max_batch_size: eight", 1, ["max_batch_size", "'eight'"]),
    ("input: {name: x}", 1, ["input", "expected a list"]),
    ("input:\n  - {name: x, dims: [1]}", 2, ["input[0]", "'data_type' is required"]),
    ("input:\n  - {name: x, data_type: TYPE_STRING, dims: [1]}", 2, ["input[0].data_type", "not servable"]),
    ("input:\n  - {name: x, data_type: TYPE_FOO, dims: [1]}", 2, ["input[0].data_type", "unknown data type"]),
    ("input:\n  - name: x\n    data_type: FP32\n    dims: [3, 0]", 4, ["input[0].dims", "sizes >= 1 or -1"]),
    ("input:\n  - {name: x, data_type: FP32, dims: abc}", 2, ["input[0].dims", "list of sizes"]),
    ("input:\n  - {name: x, data_type: FP32, dims: [1], format: NCHW}", 2, ["unknown key input[0].format"]),
    ("output:\n  - {name: y, data_type: FP32, dims: [1]}\n  - {name: y, data_type: FP32, dims: [1]}", 2,
     ["output:", "y is listed twice"]),
    ("max_batch_size: 8\ndynamic_batching:\n  preferred_batch_size: [2, 0]", 3,
     ["dynamic_batching.preferred_batch_size[1]", ">= 1"]),
    ("max_batch_size: 8\ndynamic_batching:\n  preferred_batch_size: [4, 4]", 3,
     ["dynamic_batching.preferred_batch_size", "distinct"]),
    ("max_batch_size: 8\ndynamic_batching: {preferred_batch_size: [16]}", 2,
     ["dynamic_batching:", "preferred_batch_size 16 is larger than max_batch_size 8"]),
    ("dynamic_batching: {}", 1, ["dynamic_batching:", "needs max_batch_size > 0"]),
    ("max_batch_size: 8\ndynamic_batching:\n  min_batch: 2", 3, ["dynamic_batching.min_batch", "queue delay"]),
    ("max_batch_size: 8\ndynamic_batching:\n  timeout_ms: -1", 3, ["dynamic_batching.timeout_ms", ">= 0"]),
    ("max_batch_size: 8\ndynamic_batching:\n  max_queue_delay_microseconds: 10\n  timeout_ms: 1", 4,
     ["dynamic_batching.timeout_ms", "give one"]),
    ("max_batch_size: 8\ndynamic_batching:\n  max_batch: 4", 3, ["dynamic_batching.max_batch", "differs from"]),
    ("max_batch_size: 8\ndynamic_batching:\n  priority_levels: 2\n  default_priority_level: 3", 4,
     ["dynamic_batching.default_priority_level", "1..2"]),
    ("max_batch_size: 8\ndynamic_batching:\n  default_priority_level: 1", 3,
     ["dynamic_batching.default_priority_level", "without priority_levels"]),
    ("max_batch_size: 8\ndynamic_batching:\n  priority_levels: 2\n  default_priority_level: 1\n"
     "  priority_queue_policy: {5: {max_queue_size: 1}}", 5, ["dynamic_batching.priority_queue_policy", "level 5"]),
    ("max_batch_size: 8\ndynamic_batching:\n  priority_queue_policy: {x: {}}", 3,
     ["dynamic_batching.priority_queue_policy", "integer >= 1"]),
    ("max_batch_size: 8\ndynamic_batching:\n  default_queue_policy:\n    timeout_action: DROP", 4,
     ["dynamic_batching.default_queue_policy.timeout_action", "REJECT, DELAY"]),
    ("max_batch_size: 8\ndynamic_batching:\n  default_queue_policy:\n    max_queue_size: -1", 4,
     ["dynamic_batching.default_queue_policy.max_queue_size", ">= 0"]),
    ("max_batch_size: 8\ndynamic_batching:\n  default_queue_policy:\n    allow_timeout_override: maybe", 4,
     ["allow_timeout_override", "true or false"]),
    ("max_batch_size: 8\ndynamic_batching:\n  preserve_ordering: true", 3,
     ["unknown key dynamic_batching.preserve_ordering"]),
    ("instance_group:\n  - {count: 0}", 2, ["instance_group[0].count", ">= 1"]),
    ("instance_group:\n  - {kind: KIND_TPU}", 2, ["instance_group[0].kind", "KIND_NPU"]),
    ("instance_group:\n  - {devices: [0], gpus: [1]}", 2, ["instance_group[0].gpus", "give one"]),
    ("instance_group:\n  - kind: KIND_CPU\n    devices: [0]", 3, ["instance_group[0].devices", "takes no devices"]),
    ("instance_group:\n  - {devices: [0, 0]}", 2, ["instance_group[0].devices", "distinct"]),
    ("instance_group:\n  - {devices: zero}", 2, ["instance_group[0].devices", "device ids"]),
    ("instance_group: []", 1, ["instance_group", "at least one group"]),
    ("fallback: [cpu, 3]", 1, ["fallback", "cpu must be the last"]),
    ("fallback:\n  - 3\n  - x", 3, ["fallback[1]", "bad placement"]),
    ("instance_group: [{devices: [3]}]\nfallback: [3, cpu]", 2, ["fallback", "device 3 is both"]),
    ("version_policy: newest", 1, ["version_policy", "latest, all"]),
    ("version_policy: {latest: 0}", 1, ["version_policy.latest", ">= 1"]),
    ("version_policy: {specific: []}", 1, ["version_policy.specific", "distinct versions"]),
    ("version_policy: {latest: 1, all: {}}", 1, ["version_policy", "give one of"]),
    ("version_policy: {all: {num_versions: 2}}", 1, ["version_policy.all", "takes no settings"]),
])
def test_bad_config_names_file_line_and_key(text, line, parts):
    refused(text, line, *parts)


def test_cannot_read_config(tmp_path):
    with pytest.raises(ModelConfigError, match="cannot read"):
        config_module.load_model_config(tmp_path / "nope.yaml", "m")


@pytest.mark.parametrize("text,v2", [("TYPE_FP32", "FP32"), ("FP32", "FP32"), ("float32", "FP32"),
                                     ("type_int8", "INT8"), ("TYPE_BOOL", "BOOL")])
def test_datatype_names(text, v2):
    assert v2_datatype(text) == v2


# ------------------------------------------------------------------------------------------ .om files
def unbatchable():
    """x [N, 16] -> ReduceSum over the batch axis -> y [16]: the output does not follow the batch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])
    axes = helper.make_tensor("ax", TensorProto.INT64, [1], [0])
    return make_model([helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], [x], [y], [axes], opset=13)


@pytest.fixture(scope="module")
def oms(tmp_path_factory):
    d = tmp_path_factory.mktemp("oms")
    out = {"mlp8": compile_model(gelu_mlp(), make_options("x:-1,16", "1,2,4,8")),
           "mlp4": compile_model(gelu_mlp(), make_options("x:-1,16", "1,4")),
           "mlp_static": compile_model(gelu_mlp()),                       # x [4, 16]
           "cnn": compile_model(cnn(batch=1)),                            # x [1, 3, 16, 16]
           "wide": compile_model(gelu_mlp(d=8, h=8), make_options("x:-1,8", "1,2")),
           "reduce": compile_model(unbatchable(), make_options("x:-1,16", "1,2"))}
    return {k: cm.save(d / f"{k}.om").read_bytes() for k, cm in out.items()}


def om_file(oms, tmp_path, key: str, rel: str = "x.om"):
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(oms[key])
    return p


def test_derive_from_a_dynamic_om(oms, tmp_path):
    om = read_om_info(om_file(oms, tmp_path, "mlp8"))
    assert om.gears == (1, 2, 4, 8) and om.unbatchable == "" and [t.name for t in om.inputs] == ["x"]
    cfg = derive("mlp", om)
    assert cfg.max_batch_size == 8 and cfg.dynamic_batching == DynamicBatching()
    assert cfg.inputs == (TensorSpec("x", "FP32", (16,)),) and cfg.outputs == (TensorSpec("y", "FP32", (16,)),)
    assert batch_gears(cfg, om) == (1, 2, 4, 8)


def test_derive_from_a_static_om(oms, tmp_path):
    om = read_om_info(om_file(oms, tmp_path, "cnn"))
    cfg = derive("cnn", om)
    assert om.gears == () and om.static_batch == 1
    assert cfg.max_batch_size == 0 and cfg.dynamic_batching is None and batch_gears(cfg, om) == ()
    assert cfg.inputs == (TensorSpec("x", "FP32", (1, 3, 16, 16)),)


def test_static_om_served_as_one_gear(oms, tmp_path):
    om = read_om_info(om_file(oms, tmp_path, "mlp_static"))
    cfg = complete(parse("max_batch_size: 3"), om)
    assert om.static_batch == 4 and cfg.inputs[0].dims == (16,) and batch_gears(cfg, om) == (4,)
    with pytest.raises(ModelConfigError, match=r"line 1: max_batch_size: 5, but the .om is static \(its tensors "
                                               r"lead with 4\)"):
        complete(parse("max_batch_size: 5"), om)


def test_unbatchable_dynamic_om(oms, tmp_path):
    om = read_om_info(om_file(oms, tmp_path, "reduce"))
    assert "output y does not carry the batch on its first axis" in om.unbatchable
    assert derive("r", om).max_batch_size == 0
    with pytest.raises(ModelConfigError, match="max_batch_size: 2, but the .om cannot batch"):
        complete(parse("max_batch_size: 2"), om)


@pytest.mark.parametrize("text,line,part", [
    ("max_batch_size: 16", 1, "max_batch_size: 16, but the .om's batch gears are 1, 2, 4, 8: use 1..8"),
    ("max_batch_size: 0", 1, "max_batch_size: 0, but the .om's batch gears"),
    ("max_batch_size: 8\ninput:\n  - {name: x, data_type: FP32, dims: [8]}", 3,
     "input[0].dims: [8], but the .om's x has [16] without the batch axis"),
    ("input:\n  - {name: x, data_type: FP16, dims: [16]}", 2,
     "input[0].data_type: TYPE_FP16, but the .om's x is TYPE_FP32"),
    ("input:\n  - {name: z, data_type: FP32, dims: [16]}", 2, "input[0].name: z is not an input of the .om (it has x)"),
    ("output: []", 1, "output: the .om's output y is missing"),
])
def test_config_that_disagrees_with_the_om(oms, tmp_path, text, line, part):
    om = read_om_info(om_file(oms, tmp_path, "mlp8"))
    with pytest.raises(ModelConfigError) as e:
        complete(parse(text), om)
    assert e.value.detail.startswith(f"{FILE}: line {line}: ") and part in e.value.detail, e.value.detail


def test_config_agreeing_with_the_om(oms, tmp_path):
    om = read_om_info(om_file(oms, tmp_path, "mlp8"))
    cfg = complete(parse("""
        max_batch_size: 4
        input: [{name: x, data_type: TYPE_FP32, dims: [-1]}]
        dynamic_batching: {preferred_batch_size: [4], timeout_ms: 1}
    """), om)
    assert cfg.max_batch_size == 4 and cfg.inputs[0].dims == (-1,) and cfg.outputs[0].dims == (16,)
    assert cfg.dynamic_batching.preferred_batch_size == (4,) and batch_gears(cfg, om) == (1, 2, 4, 8)


def test_unreadable_om_names_the_file(tmp_path):
    p = tmp_path / "bad.om"
    p.write_bytes(b"\x93VNPU-OM" + bytes(100))
    with pytest.raises(ModelConfigError, match=re.escape(str(p))):
        read_om_info(p)
    with pytest.raises(ModelConfigError, match="cannot read"):
        read_om_info(tmp_path / "missing.om")


# ------------------------------------------------------------------------------------------ repository
def test_scan_repository(oms, tmp_path):
    root = tmp_path / "repo"
    for rel, key in (("mlp/1/model.om", "mlp8"), ("mlp/2/model.om", "mlp4"), ("mlp/3/model.om", "wide"),
                     ("cnn/1/model.om", "cnn"), ("broken/1/model.om", "mlp8")):
        om_file(oms, root, key, rel)
    (root / "mlp" / "config.yaml").write_text("version_policy: all\n")
    (root / "mlp" / "notes").mkdir()                                            # not a version: ignored
    (root / "mlp" / "0").mkdir()
    (root / ".hidden").mkdir()
    (root / "README.md").write_text("not a model")
    (root / "empty").mkdir()
    (root / "broken" / "config.yaml").write_text("max_batch_size: 4\ndynamic_batching:\n  min_batch: 9\n")
    repo = scan_repository(root)
    assert [m.name for m in repo.models] == ["broken", "cnn", "empty", "mlp"]
    mlp = repo.model("mlp")
    # the configuration comes from the newest selected version (3, width 8): 1 and 2 (width 16) disagree
    assert mlp.config.inputs[0].dims == (8,) and [v.state for v in mlp.versions] == [UNAVAILABLE, UNAVAILABLE, READY]
    assert mlp.versions[0].reason == ("its .om disagrees with the model's configuration: input[0].dims: [8], but "
                                      "the .om's x has [16] without the batch axis")
    assert mlp.latest.version == 3 and mlp.latest.gears == (1, 2)
    broken = repo.model("broken")
    assert broken.config is None and broken.versions[0].state == UNAVAILABLE
    assert broken.error.startswith(f"{root / 'broken' / 'config.yaml'}: line 3: dynamic_batching.min_batch")
    assert repo.model("empty").error.startswith("no version directories")
    assert repo.model("cnn").latest.state == READY and repo.model("cnn").config.max_batch_size == 0
    index = [(e.name, e.version, e.state) for e in repo.index()]
    assert index == [("broken", "1", UNAVAILABLE), ("cnn", "1", READY), ("empty", "", UNAVAILABLE),
                     ("mlp", "1", UNAVAILABLE), ("mlp", "2", UNAVAILABLE), ("mlp", "3", READY)]
    with pytest.raises(ModelConfigError, match="model broken: nothing to serve"):
        repo.check()


def test_version_policy_picks_versions(oms, tmp_path):
    root = tmp_path / "repo"
    for v, key in ((1, "mlp8"), (2, "mlp4"), (5, "mlp8")):
        om_file(oms, root, key, f"m/{v}/model.om")
    latest = scan_model(root, "m")
    assert [(v.version, v.state) for v in latest.versions] == [(1, UNAVAILABLE), (2, UNAVAILABLE), (5, READY)]
    assert latest.versions[0].reason == "not selected by the version_policy"
    (root / "m" / "config.yaml").write_text("version_policy: {latest: 2}\n")
    two = scan_model(root, "m")
    # 2 (gears 1,4) cannot serve the max_batch_size 8 that version 5 gives the derived configuration
    assert [v.state for v in two.versions] == [UNAVAILABLE, UNAVAILABLE, READY]
    assert "max_batch_size: 8, but the .om's batch gears are 1, 4" in two.versions[1].reason
    (root / "m" / "config.yaml").write_text("max_batch_size: 4\nversion_policy: {specific: [1, 2]}\n")
    spec = scan_model(root, "m")
    assert [v.state for v in spec.versions] == [READY, READY, UNAVAILABLE]
    assert [v.gears for v in spec.ready_versions] == [(1, 2, 4, 8), (1, 4)] and spec.latest.version == 2


def test_corrupt_version_is_unavailable_not_fatal(oms, tmp_path):
    root = tmp_path / "repo"
    om_file(oms, root, "mlp8", "m/1/model.om")
    bad = om_file(oms, root, "mlp8", "m/2/model.om")
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    (root / "m" / "3").mkdir()
    m = scan_model(root, "m")
    # latest 1 selects version 3, which has no model.om: nothing to serve, each version says why
    assert m.config is None and "no version that version_policy selects (3)" in m.error
    (root / "m" / "config.yaml").write_text("version_policy: all\n")
    m = scan_model(root, "m")
    assert [v.state for v in m.versions] == [READY, UNAVAILABLE, UNAVAILABLE]
    assert "corrupt" in m.versions[1].reason and "cannot read" in m.versions[2].reason


def test_single_model(oms, tmp_path):
    p = om_file(oms, tmp_path, "mlp8", "my-model.om")
    repo = single_model(p)
    m = repo.model("my-model")
    assert repo.root is None and m.config.max_batch_size == 8 and m.latest.version == 1 and m.latest.path == p
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_batch_size: 2\ndynamic_batching: {timeout_ms: 1}\n")
    m = single_model(p, "mlp", cfg).model("mlp")
    assert m.config.max_batch_size == 2 and m.config.dynamic_batching.max_queue_delay_microseconds == 1000
    with pytest.raises(ModelConfigError, match="is not a model name"):
        single_model(om_file(oms, tmp_path, "mlp8", "bad name.om"))
    assert single_model(tmp_path / "nope.om").model("nope").latest is None


def test_repository_root_must_be_a_directory(tmp_path):
    with pytest.raises(ModelConfigError, match="model repository"):
        scan_repository(tmp_path / "missing")
