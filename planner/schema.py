"""The JSON Schemas of planner.plan/v2 (written) and planner.plan/v1 (still read), and a small
validator for the subset they use (type, required, properties, additionalProperties, items, enum,
minimum, exclusiveMaximum) so reading a plan names the exact key that is missing or wrong, without a jsonschema
dependency.

v2 over v1: prediction.hfu and prediction.band (how sure the step time is: the spread of
out-of-sample errors, planner/bands.py), inputs.training.memory_headroom (required), and two
optional keys that later features fill: runnable_on (the runtimes that execute the plan) and
pools (mixed clusters). A v1 plan lacks the first three; diff, check, export and ranks read it.
Later optional v2 keys: inputs.runtimes, alternatives[].runtime and best_per_runtime (a search
over the union of several runtimes' spaces, the default), and training.runtime 'ideal' (the
old 'any', still read as 'ideal'), inputs.training.ep_overlap, moe_folding, fp8_recipe,
grad_reduce, fp8_param_gather, loss_fusion, moe_imbalance, no_tp_overlap, optimizer_states and
recompute_modules, and
strategy.dp_shard (hybrid sharding, only where set); a plan of batch shares over several
pools (pools[].share, strategy_pool: the pool the strategy, stages and placement describe,
inputs.cluster the mixed cluster, inputs.training its GPUs and whole batch, breakdown_s's
pool_wait and pools_exchange); a pipeline over several pools (stages[].pool, pools[].stages,
inputs.cluster the mixed cluster).
"""

from __future__ import annotations

from planner.cost.memory import MEMORY_KEYS
from planner.cost.step import BREAKDOWN_KEYS
from planner.errors import PlanFormatError
from planner.runtimes import OLD_NAMES, OLDER_VERSIONS, TARGETS
from planner.spec.training import FP8_RECIPES, GRAD_REDUCES, LOSS_FUSIONS, OPTIMIZER_STATES, RECOMPUTE_MODULES

_NUM = {"type": "number"}
_NONNEG = {"type": "number", "minimum": 0}
"""a time, a size, a rate or a share: a plan that records one below zero was not written by a planner"""
_INT = {"type": "integer", "minimum": 1}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}


def _obj(props: dict, required: list | None = None, extra: bool = False) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": extra}


STRATEGY = _obj({
    "dp": _INT, "tp": _INT, "pp": _INT, "cp": _INT, "ep": _INT, "vpp": _INT, "micro_batch": _INT,
    "num_microbatches": _INT, "zero": {"type": "integer", "enum": [0, 1, 2, 3]},
    "recompute": {"type": "string", "enum": ["none", "selective", "full"]},
    "recompute_layers": {"type": "integer", "minimum": 0},
    "sequence_parallel": _BOOL, "dp_overlap": _BOOL,
    "schedule": {"type": "string", "enum": ["1f1b", "interleaved-1f1b"]},
    "dp_shard": _INT,
}, required=["dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "num_microbatches", "zero", "recompute",
             "sequence_parallel", "dp_overlap", "schedule"])

_RANGE = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}
STAGE = _obj({"index": {"type": "integer", "minimum": 0}, "layers": _RANGE,
              "chunks": {"type": "array", "items": _RANGE},
              "recompute_layers": {"type": "integer", "minimum": 0}, "memory_gib": _NONNEG,
              "time_per_microbatch_s": _NONNEG, "pool": _STR},
             required=["index", "layers", "recompute_layers", "memory_gib", "time_per_microbatch_s"])
"""pool: the mixed cluster's pool the stage sits on, in a pipeline over several pools"""

POOL_BREAKDOWN_KEYS = ("pool_wait", "pools_exchange")
"""a plan of batch shares over several pools (search/shares.py) adds to its strategy pool's
breakdown: how long that pool waits for the slowest, and the gradient exchange between them"""
BREAKDOWN = _obj({k: _NONNEG for k in BREAKDOWN_KEYS + POOL_BREAKDOWN_KEYS}, required=list(BREAKDOWN_KEYS))
MEMORY = _obj({k: _NONNEG for k in MEMORY_KEYS})
_PREDICTION_V1 = {"step_time_s": _NONNEG, "tokens_per_s": _NONNEG, "model_tflops_per_gpu": _NONNEG, "mfu": _NONNEG,
                  "peak_memory_gib": _NONNEG, "fits": _BOOL, "capacity_gib": _NONNEG, "breakdown_s": BREAKDOWN,
                  "memory_gib": MEMORY}
BAND = _obj({"low_error": _NUM, "high_error": _NUM,
             "step_time_s": {"type": "array", "items": _NONNEG, "minItems": 2, "maxItems": 2},
             "rows": {"type": "integer", "minimum": 0}, "basis": _STR})
"""10th-90th percentile of signed out-of-sample errors (predicted / measured - 1) and the measured
step times they allow, with what they were taken from"""
PREDICTION = _obj({**_PREDICTION_V1, "hfu": _NONNEG, "band": BAND})
_TRAINING = {"gpus": _INT, "global_batch": _INT, "seq_len": _INT,
             "precision": {"type": "string", "enum": ["bf16", "fp16", "fp8"]},
             "attention": {"type": "string", "enum": ["flash", "eager"]},
             "runtime": {"type": "string", "enum": ["ideal", *OLD_NAMES, *TARGETS, *OLDER_VERSIONS]}}
TRAINING = _obj({**_TRAINING, "memory_headroom": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                 "moe_dispatcher": {"type": "string", "enum": ["alltoall", "dedup"]}, "ep_overlap": _BOOL,
                 "moe_folding": _BOOL, "fp8_recipe": {"type": "string", "enum": list(FP8_RECIPES)},
                 "grad_reduce": {"type": "string", "enum": list(GRAD_REDUCES)}, "fp8_param_gather": _BOOL,
                 "loss_fusion": {"type": "string", "enum": list(LOSS_FUSIONS)},
                 "moe_imbalance": {"type": "number", "minimum": 1}, "no_tp_overlap": _BOOL,
                 "optimizer_states": {"type": "string", "enum": list(OPTIMIZER_STATES)},
                 "recompute_modules": {"type": "array", "items": {"type": "string", "enum": list(RECOMPUTE_MODULES)}}},
                required=[*_TRAINING, "memory_headroom"])
"""moe_dispatcher, fp8_recipe, grad_reduce, loss_fusion, optimizer_states and recompute_modules only where the
request named one (else the runtime's own); ep_overlap, moe_folding, fp8_param_gather and no_tp_overlap only where they are on
(moe_folding false: the request kept the experts unfolded); moe_imbalance only where it is not 1"""
_SOLVER = _obj({"name": _STR, "time_limit_s": _NONNEG})
_INPUTS = {"model": {"type": "object"}, "cluster": {"type": "object"}, "training": TRAINING,
           "constraints": {"type": "object"}, "solver": _SOLVER, "sha256": _STR}
INPUTS = _obj({**_INPUTS, "runtimes": {"type": "array", "items": _STR}}, required=list(_INPUTS))
"""runtimes: the union searched where the request named no runtime ('ideal' and 'any' are the
old default's space)"""
_ALTERNATIVE = {"strategy": STRATEGY, "step_time_s": _NONNEG, "peak_memory_gib": _NONNEG, "why_not": _STR}
ALTERNATIVE = _obj({**_ALTERNATIVE, "runtime": _STR}, required=list(_ALTERNATIVE))
_PRECISION = {"type": "string", "enum": ["bf16", "fp16", "fp8"]}
SHARE = _obj({"global_batch": _INT, "precision": _PRECISION, "step_time_s": _NONNEG, "busy": _NONNEG,
              "peak_memory_gib": _NONNEG, "capacity_gib": _NONNEG,
              "strategy": STRATEGY})
"""a pool's part of a plan of batch shares over several pools: its sequences of the global
batch, the precision it trains in, the step its own strategy takes on them, the share of the plan's step that is (busy), its
peak memory and capacity"""
POOL = _obj({"name": _STR, "cluster": _STR, "gpu": _STR, "gpus": _INT, "used_gpus": {"type": "integer", "minimum": 0},
             "precision": _PRECISION, "step_time_s": _NONNEG, "why_not": _STR, "share": SHARE,
             "stages": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
             "mfu": _NONNEG},
            required=["name", "cluster", "gpu", "gpus", "used_gpus"])
"""one pool of a mixed cluster: its GPUs, how many the plan uses, the best step time it
reaches alone (or why it has no plan), its precision where its GPU lacks the one requested
(spec/pools.pool_precision), and its share where the plan spans several pools with batch
shares, or its first and last stage and its MFU (its stages' model FLOPs over its GPUs' own
peak) where one pipeline spans them"""
PER_RUNTIME = _obj({"runtime": _STR, "step_time_s": _NONNEG, "strategy": STRATEGY, "why_not": _STR},
                   required=["runtime"])
"""one runtime's best plan in a search over several (a strategy summary and its step time), or
why it has none"""
RUNNABLE = _obj({"runtime": _STR, "checked_against": _STR})


def _plan(version: str, inputs: dict, prediction: dict, extra: dict) -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://planner.dev/schema/planner.plan/{version}.json",
        "title": f"planner.plan/{version}",
        **_obj({
            "schema": {"type": "string", "enum": [f"planner.plan/{version}"]},
            "planner_version": _STR,
            "inputs": inputs,
            "strategy": STRATEGY,
            "stages": {"type": "array", "items": STAGE, "minItems": 1},
            "placement": _obj({"order": _STR, "tiers": {"type": "object"}}),
            "prediction": prediction,
            "alternatives": {"type": "array", "items": ALTERNATIVE},
            "notes": {"type": "array", "items": _STR},
            "search": {"type": "object"},
            **extra,
        }, required=["schema", "planner_version", "inputs", "strategy", "stages", "placement", "prediction",
                     "alternatives"]),
    }


PLAN_SCHEMA = _plan("v2", INPUTS, PREDICTION, {"runnable_on": {"type": "array", "items": RUNNABLE},
                                              "best_per_runtime": {"type": "array", "items": PER_RUNTIME},
                                              "pools": {"type": "array", "items": POOL},
                                              "strategy_pool": _STR})
PLAN_SCHEMA_V1 = _plan("v1", _obj({"model": {"type": "object"}, "cluster": {"type": "object"},
                                   "training": _obj(_TRAINING), "constraints": {"type": "object"},
                                   "solver": _SOLVER, "sha256": _STR}),
                       _obj(_PREDICTION_V1), {})
SCHEMAS = {"planner.plan/v2": PLAN_SCHEMA, "planner.plan/v1": PLAN_SCHEMA_V1}
"""every plan schema this planner reads, newest first"""

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _is(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def check(value, schema: dict, where: str = "plan") -> None:
    """Raise PlanFormatError naming the first key (as a dotted path) that breaks `schema`."""
    kind = schema.get("type")
    if kind and not _is(value, kind):
        raise PlanFormatError(f"{where}: expected {kind}, got {type(value).__name__} ({value!r:.40})")
    if "enum" in schema and value not in schema["enum"]:
        raise PlanFormatError(f"{where}: expected one of {schema['enum']}, got {value!r}")
    if "minimum" in schema and value < schema["minimum"]:
        raise PlanFormatError(f"{where}: expected >= {schema['minimum']}, got {value!r}")
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        raise PlanFormatError(f"{where}: expected < {schema['exclusiveMaximum']}, got {value!r}")
    if kind == "object":
        for key in schema.get("required", []):
            if key not in value:
                raise PlanFormatError(f"{where}.{key}: missing")
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                check(item, props[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                raise PlanFormatError(f"{where}.{key}: unknown key")
    if kind == "array":
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            raise PlanFormatError(f"{where}: expected {schema.get('minItems')}..{schema.get('maxItems', 'any')} items, "
                                  f"got {len(value)}")
        for k, item in enumerate(value):
            check(item, schema.get("items", {}), f"{where}[{k}]")
