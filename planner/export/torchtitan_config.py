"""torchtitan 0.3: the job of a plan as a Python config module, torchtitan's own config system.

torchtitan 0.3 reads no TOML: `torchrun -m torchtitan.train --module M --config F` imports module
M (its `config_registry`, or M itself) and calls F() for a Trainer.Config, then applies
`--section.key` overrides (torchtitan/config/manager.py, ConfigManager._load_config). The export
is such a module: it starts from torchtitan's own recipe of the plan's llama3 flavor
(config_registry.llama3_8b / _70b / _405b: optimizer, schedule, dataset, tokenizer path) and sets
every field the plan decides. What it writes, and why:
- the degrees, batch, split, schedule, ZeRO mapping and recompute policy of the 0.2 job config
  (export/torchtitan.job_config: the same ParallelismConfig and TrainingConfig field names, and
  the same refusals), activation checkpointing as the config class 0.3 takes (FullAC,
  SelectiveAC, None);
- the model through llama3.model_registry(flavor, attn_backend="varlen", converters): "varlen"
  is 0.3's FlashAttention backend (the recipes default to FlexAttention, whose kernels the plan
  did not price); fp8 plans add Float8LinearConverter with the LM head left out
  (filter_fqns ["lm_head"], as the 405B recipe does and the plan prices it), bf16 plans none
  (the 405B recipe's own converter would train a bf16 plan in fp8);
- compile off (CompileConfig(enable=False)): the plan prices torchtitan uncompiled (the
  torchtitan capability record), and the 405B recipe's compiled async-TP would be another job;
- CUDA graphs off under pipeline stages (training.disable_cuda_graphs: 0.3 captures forward and
  backward in one graph by default, and Trainer.Config._validate_cuda_graphs refuses that with pp).
"""

from __future__ import annotations

from planner.export import torchtitan as v02
from planner.export.common import PlanView, launch_nodes

RUNTIME = "torchtitan"
FORMATS = ("py",)
CHECKED_AGAINST = "torchtitan 0.3.0 (ConfigManager, ParallelDims, llama3 model_registry)"
"""the runtime version whose config manager this output was checked against"""
MODULE = "planner_job"
"""the module (file) name and config function the launch line names"""
RECIPES = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}
"""torchtitan 0.3.0's config_registry function of each llama3 flavor"""


def export(plan: dict, v: PlanView, fmt: str = "py") -> str:
    sections = v02.job_config(v, head="lm_head")  # every check and refusal of the job, shared with 0.2
    model = sections.pop("model")
    checkpoint = sections.pop("activation_checkpoint")
    per_node, nodes, _, placed = launch_nodes(plan, v)
    recipe = RECIPES[model["flavor"]]
    imports = ["from torchtitan.config import CompileConfig",
               "from torchtitan.models.llama3 import model_registry",
               f"from torchtitan.models.llama3.config_registry import {recipe}"]
    converters = ""
    if "converters" in model:
        imports.insert(0, "from torchtitan.components.quantization import Float8LinearConverter")
        converters = ", converters=[Float8LinearConverter.Config(filter_fqns=['lm_head'])]"
    policy = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()", "none": "None"}[checkpoint["mode"]]
    if checkpoint["mode"] != "none":
        imports.insert(1, f"from torchtitan.distributed.activation_checkpoint import {policy.split('.')[0]}")
    body = [f'    config = {recipe}()',
            f"    config.model_spec = model_registry({model['flavor']!r}, attn_backend='varlen'{converters})"]
    if v.pp > 1:  # 0.3 captures forward and backward in one CUDA graph, which it refuses under pipelines
        sections["training"]["disable_cuda_graphs"] = True
    for section, keys in sections.items():
        body += [f"    config.{section}.{key} = {_value(value)}" for key, value in keys.items()]
    body += [f"    config.activation_checkpoint = {policy}", "    config.compile = CompileConfig(enable=False)",
             "    return config"]
    doc = [f'"""torchtitan 0.3 job of a planner plan: {v.model.name} on {v.gpus} GPUs ({nodes} node(s) of '
           f'{per_node}), {v.precision}.',
           f"Checked against {CHECKED_AGAINST}.",
           "",
           f"Save as {MODULE}.py and run on every node, NODE_RANK (0..{nodes - 1}) and MASTER_ADDR (node 0) set:",
           f'  PYTHONPATH=. torchrun --nproc-per-node {per_node} --nnodes {nodes} --node-rank "${{NODE_RANK:-0}}" \\',
           '    --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" \\',
           f"    -m torchtitan.train --module {MODULE} --config {MODULE}",
           *placed,
           "You supply, as overrides after it: the Hugging Face assets and tokenizer (--hf-assets-path), the",
           "data (--dataloader.dataset, --dataloader.dataset-path), steps (--training.steps), the learning rate",
           f"(--optimizer.*) and checkpoints (--checkpoint.*); until then torchtitan's {recipe} recipe values stand.",
           '"""']
    return "\n".join(doc + [""] + imports + ["", "", f"def {MODULE}():"] + body) + "\n"


def _value(value) -> str:
    """A Python literal; a list of stages one stage a line."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "[\n" + "".join(f"        {part!r},\n" for part in value) + "    ]"
    return repr(value)
