"""Each runtime's own reading of an export (issue 12 item 5): DeepSpeed's DeepSpeedConfig and
torchtitan's ConfigManager (installed by the `runtimes` extra; these checks never skip), and for
Megatron-LM and nanotron, which ship no installable parser, the pinned list of argument names
(tests/data/megatron_arguments.txt) and config fields (NANOTRON_KEYS), each with the commit it was
read at."""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from planner.export import export

DATA = Path(__file__).parent / "data"


def megatron_args(text: str) -> dict[str, str | None]:
    """--flag [value] pairs of an exported argument list."""
    tokens = shlex.split(text)
    args: dict[str, str | None] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
            assert token not in args, f"{token} given twice"
            args[token] = value
    return args


def megatron_known() -> set[str]:
    lines = (DATA / "megatron_arguments.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def check_megatron(plan: dict) -> None:
    """Every flag is one Megatron-LM defines, and the degrees are the plan's."""
    args = megatron_args(export(plan, "megatron"))
    unknown = set(args) - megatron_known()
    assert not unknown, f"not in tests/data/megatron_arguments.txt: {sorted(unknown)}"
    s = plan["strategy"]
    assert int(args["--tensor-model-parallel-size"]) == s["tp"]
    assert int(args["--pipeline-model-parallel-size"]) == s["pp"]
    assert int(args["--context-parallel-size"]) == s["cp"]
    assert int(args["--global-batch-size"]) == plan["inputs"]["training"]["global_batch"]


def check_deepspeed(plan: dict) -> None:
    """DeepSpeedConfig (DeepSpeed's own parser and batch assertion) reads the export."""
    from deepspeed.runtime.config import DeepSpeedConfig

    doc = json.loads(export(plan, "deepspeed"))
    # without torch.distributed DeepSpeed takes one data-parallel rank: give it one rank's batch
    one_rank = dict(doc, train_batch_size=doc["train_batch_size"] // doc["_planner"]["data_parallel_size"])
    ds = DeepSpeedConfig(one_rank)
    assert ds.gradient_accumulation_steps == doc["gradient_accumulation_steps"] == plan["strategy"]["num_microbatches"]
    assert ds.zero_optimization_stage == doc["zero_optimization"]["stage"] == plan["strategy"]["zero"]
    if doc.get("bf16") and ds.zero_optimization_stage == 1:
        # the BF16_Optimizer the plan is priced on runs under ZeRO-1 only with fp32 accumulation
        # (DeepSpeedEngine._do_optimizer_sanity_check, get_data_types)
        import torch
        from deepspeed.runtime.config import DtypeEnum
        assert DtypeEnum(ds.grad_accum_dtype).value is torch.float32


def check_torchtitan(plan: dict) -> None:
    """Both torchtitan versions read their export of the plan (torchtitan@0.2's TOML and command
    line, torchtitan 0.3's config module)."""
    check_torchtitan_02(plan)
    check_torchtitan_03(plan)


def check_torchtitan_02(plan: dict) -> None:
    """torchtitan 0.2.2's ConfigManager reads the TOML and the command line alike, with the plan's degrees."""
    from torchtitan.config.manager import ConfigManager

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.toml"
        path.write_text(export(plan, "torchtitan@0.2"))
        configs = [ConfigManager().parse_args(["--job.config_file", str(path)])]
    try:
        cli = export(plan, "torchtitan@0.2", "cli")
    except Exception:  # a split only the TOML can write (the exporter says so)
        cli = None
    if cli is not None:
        configs.append(ConfigManager().parse_args(shlex.split(cli)))
    s = plan["strategy"]
    for config in configs:
        p = config.parallelism
        assert p.tensor_parallel_degree == s["tp"] and p.pipeline_parallel_degree == s["pp"]
        assert p.context_parallel_degree == s["cp"]
        assert p.data_parallel_shard_degree * p.data_parallel_replicate_degree == s["dp"]
        assert torchtitan_model(config.model.name, config.model.flavor) == plan_model(plan)


def torchtitan_model(name: str, flavor: str) -> dict:
    """The shape of the model torchtitan builds for a job's [model] name and flavor, read off
    the model its own code constructs (on the meta device: no memory)."""
    import torch
    from torchtitan.models.llama3 import Transformer, llama3_args

    assert name == "llama3", name
    args = llama3_args[flavor]
    with torch.device("meta"):
        model = Transformer(args)
    block = model.layers["0"]
    head_dim = block.attention.wq.weight.shape[0] // args.n_heads
    return {"layers": len(model.layers), "hidden": model.tok_embeddings.weight.shape[1], "heads": args.n_heads,
            "kv_heads": block.attention.wk.weight.shape[0] // head_dim,
            "ffn_hidden": block.feed_forward.w1.weight.shape[0], "vocab": model.tok_embeddings.weight.shape[0],
            "rope_theta": float(args.rope_theta), "norm_eps": float(model.norm.eps)}


TORCHTITAN_03 = Path(__file__).resolve().parent.parent / ".runtimes" / "torchtitan-0.3"
"""where README's test command installs torchtitan 0.3.0 (tests/torchtitan-0.3.txt) beside the
runtimes extra's 0.2.2: the two cannot share one environment, so 0.3 runs in a worker process"""
_WORKER = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
import torchtitan.components.quantization.float8 as float8
float8.has_cuda_capability = lambda *a, **k: True  # the job's GPU (sm90); torchao checks it at config time
from torchtitan.config.manager import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
for line in sys.stdin:
    req = json.loads(line)
    sys.path.insert(0, req["folder"])
    importlib.invalidate_caches()
    try:
        c = ConfigManager().parse_args(["--module", req["module"], "--config", "planner_job"])
        p, t, m = c.parallelism, c.training, c.model_spec.model
        dims = ParallelDims.from_config(p, req["gpus"])
        block = m.layers[0]
        out = {"tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "dp": dims.dp_replicate * dims.dp_shard,
               "dp_shard": dims.dp_shard, "schedule": p.pipeline_parallel_schedule,
               "microbatch": p.pipeline_parallel_microbatch_size, "fqns": p.module_fqns_per_model_part,
               "local_batch": t.local_batch_size, "global_batch": t.global_batch_size, "seq_len": t.seq_len,
               "checkpoint": type(c.activation_checkpoint).__qualname__, "compile": c.compile.enable,
               "attention": type(block.attention.inner_attention).__qualname__,
               "fp8": [type(block.feed_forward.w1).__qualname__, type(m.lm_head).__qualname__],
               "model": {"layers": len(m.layers), "hidden": m.dim, "heads": block.attention.n_heads,
                         "kv_heads": block.attention.n_kv_heads, "ffn_hidden": block.feed_forward.w1.out_features,
                         "vocab": m.vocab_size, "rope_theta": float(block.attention.rope.theta),
                         "norm_eps": float(m.norm.eps)}}
    except BaseException as e:  # tyro reports a bad config by SystemExit
        out = {"error": repr(e)}
    print("@@" + json.dumps(out), flush=True)
"""


class _Torchtitan03:
    """One worker process with torchtitan 0.3 on its path, started at the first check (importing
    torch and torchtitan once, not once per plan); each request names a config module to load."""

    process = None
    count = 0

    @classmethod
    def load(cls, text: str, gpus: int) -> dict:
        import atexit
        import subprocess
        import sys
        assert TORCHTITAN_03.is_dir(), (
            f"torchtitan 0.3.0 is not installed in {TORCHTITAN_03}: run README's test command "
            "(pip install --no-deps --target .runtimes/torchtitan-0.3 -r tests/torchtitan-0.3.txt)")
        if cls.process is None:
            cls.folder = tempfile.mkdtemp(prefix="planner-tt03-")
            cls.process = subprocess.Popen([sys.executable, "-c", _WORKER, str(TORCHTITAN_03)], text=True,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            atexit.register(cls.process.kill)
        cls.count += 1
        module = f"planner_job_{cls.count}"
        (Path(cls.folder) / f"{module}.py").write_text(text)
        cls.process.stdin.write(json.dumps({"folder": cls.folder, "module": module, "gpus": gpus}) + "\n")
        cls.process.stdin.flush()
        for line in cls.process.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise AssertionError("the torchtitan 0.3 worker stopped")


TORCHTITAN_03_CHECKPOINTS = {"none": "NoneType", "full": "FullAC.Config", "selective": "SelectiveAC.Config"}


def check_torchtitan_03(plan: dict) -> None:
    """torchtitan 0.3.0's ConfigManager loads the exported config module and ParallelDims
    validates its degrees; the job is the plan's: degrees, batch, sequence, split, schedule,
    recompute policy, precision (float8 linears, LM head in bf16), the attention backend, no
    compile, and the model it builds equals the plan's model field by field."""
    tr, s = plan["inputs"]["training"], plan["strategy"]
    got = _Torchtitan03.load(export(plan, "torchtitan"), tr["gpus"])
    assert "error" not in got, got["error"]
    assert (got["tp"], got["pp"], got["cp"], got["dp"]) == (s["tp"], s["pp"], s["cp"], s["dp"])
    assert got["dp_shard"] == ((s.get("dp_shard") or s["dp"]) if s["zero"] == 3 else 1)
    local = s["micro_batch"] * (s["num_microbatches"] if s["pp"] > 1 else 1)
    assert (got["local_batch"], got["global_batch"], got["seq_len"]) == (local, tr["global_batch"], tr["seq_len"])
    assert got["checkpoint"] == TORCHTITAN_03_CHECKPOINTS[s["recompute"]]
    assert got["attention"] == "VarlenAttention.Config" and got["compile"] is False
    fp8 = ["Float8Linear.Config", "Linear.Config"] if tr["precision"] == "fp8" else ["Linear.Config"] * 2
    assert got["fp8"] == fp8, got["fp8"]
    if s["pp"] > 1:
        assert got["schedule"] == {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}[s["schedule"]]
        assert got["microbatch"] == s["micro_batch"]
        stages = [len([n for n in part if n.startswith("layers.")]) for part in got["fqns"]]
        chunks = [b - a for st in plan["stages"] for a, b in (st.get("chunks") or [st["layers"]])]
        assert sorted(stages) == sorted(chunks)
        layers = plan["inputs"]["model"]["layers"]
        assert sum(got["fqns"], []) == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "lm_head"]
    assert got["model"] == plan_model(plan)


def plan_model(plan: dict) -> dict:
    m = plan["inputs"]["model"]
    return {key: m[key] for key in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")} | {
        "rope_theta": float(m["rope_theta"]), "norm_eps": float(m["norm_eps"])}


NANOTRON_KEYS = {
    "parallelism": {"dp", "pp", "tp", "pp_engine", "tp_mode", "tp_linear_async_communication", "expert_parallel_size"},
    "tokens": {"sequence_length", "train_steps", "micro_batch_size", "batch_accumulation_per_replica",
               "val_check_interval", "limit_val_batches", "limit_test_batches"},
    "optimizer": {"zero_stage"},
}
"""nanotron v0.4 (tag v0.4, commit f2c8383): the fields of ParallelismArgs
(src/nanotron/config/parallelism_config.py) and TokensArgs (config/config.py), and the
OptimizerArgs field the export writes; nanotron ships no installable config loader to read an
export with, so these are pinned facts"""
NANOTRON_ENGINES = {"1f1b", "afab"}
"""cast_str_to_pipeline_engine's names at v0.4"""
NANOTRON_TP_MODES = {"ALL_REDUCE", "REDUCE_SCATTER"}
"""TensorParallelLinearMode's members at v0.4 (the config names one, in any case)"""


def check_nanotron(plan: dict) -> None:
    """The export's sections hold only v0.4 field names with values of the right kind, and the
    degrees and batch multiply out as the plan says."""
    import yaml
    doc = yaml.safe_load(export(plan, "nanotron"))
    assert set(doc) == set(NANOTRON_KEYS), set(doc)
    for section, keys in NANOTRON_KEYS.items():
        assert set(doc[section]) <= keys, (section, set(doc[section]) - keys)
    par, tokens = doc["parallelism"], doc["tokens"]
    assert par["pp_engine"] in NANOTRON_ENGINES and par["tp_mode"].upper() in NANOTRON_TP_MODES
    tr, st = plan["inputs"]["training"], plan["strategy"]
    assert par["dp"] * par["tp"] * par["pp"] == tr["gpus"]
    assert tokens["micro_batch_size"] * tokens["batch_accumulation_per_replica"] * par["dp"] == tr["global_batch"]
    assert tokens["sequence_length"] == tr["seq_len"] and doc["optimizer"]["zero_stage"] == st["zero"]


CHECKS = {"megatron": check_megatron, "deepspeed": check_deepspeed, "torchtitan": check_torchtitan,
          "torchtitan@0.2": check_torchtitan_02,
          "nanotron": check_nanotron}
