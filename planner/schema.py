"""The JSON Schema of planner.plan/v1, and a small validator for the subset it uses (type,
required, properties, additionalProperties, items, enum, minimum) so reading a plan names the
exact key that is missing or wrong, without a jsonschema dependency."""

from __future__ import annotations

from planner.cost.memory import MEMORY_KEYS
from planner.cost.step import BREAKDOWN_KEYS
from planner.errors import PlanFormatError

_NUM = {"type": "number"}
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
}, required=["dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "num_microbatches", "zero", "recompute",
             "sequence_parallel", "dp_overlap", "schedule"])

_RANGE = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}
STAGE = _obj({"index": {"type": "integer", "minimum": 0}, "layers": _RANGE,
              "chunks": {"type": "array", "items": _RANGE},
              "recompute_layers": {"type": "integer", "minimum": 0}, "memory_gib": _NUM,
              "time_per_microbatch_s": _NUM},
             required=["index", "layers", "recompute_layers", "memory_gib", "time_per_microbatch_s"])

BREAKDOWN = _obj({k: _NUM for k in BREAKDOWN_KEYS})
MEMORY = _obj({k: _NUM for k in MEMORY_KEYS})
PREDICTION = _obj({"step_time_s": _NUM, "tokens_per_s": _NUM, "model_tflops_per_gpu": _NUM, "mfu": _NUM,
                   "peak_memory_gib": _NUM, "fits": _BOOL, "capacity_gib": _NUM, "breakdown_s": BREAKDOWN,
                   "memory_gib": MEMORY})
TRAINING = _obj({"gpus": _INT, "global_batch": _INT, "seq_len": _INT,
                 "precision": {"type": "string", "enum": ["bf16", "fp16", "fp8"]},
                 "attention": {"type": "string", "enum": ["flash", "eager"]},
                 "runtime": {"type": "string", "enum": ["any", "megatron", "deepspeed", "torchtitan"]},
                 "memory_headroom": _NUM},
                required=["gpus", "global_batch", "seq_len", "precision", "attention", "runtime"])
INPUTS = _obj({"model": {"type": "object"}, "cluster": {"type": "object"}, "training": TRAINING,
               "constraints": {"type": "object"},
               "solver": _obj({"name": _STR, "time_limit_s": _NUM}), "sha256": _STR})
ALTERNATIVE = _obj({"strategy": STRATEGY, "step_time_s": _NUM, "peak_memory_gib": _NUM, "why_not": _STR})

PLAN_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://planner.dev/schema/planner.plan/v1.json",
    "title": "planner.plan/v1",
    **_obj({
        "schema": {"type": "string", "enum": ["planner.plan/v1"]},
        "planner_version": _STR,
        "inputs": INPUTS,
        "strategy": STRATEGY,
        "stages": {"type": "array", "items": STAGE, "minItems": 1},
        "placement": _obj({"order": _STR, "tiers": {"type": "object"}}),
        "prediction": PREDICTION,
        "alternatives": {"type": "array", "items": ALTERNATIVE},
        "notes": {"type": "array", "items": _STR},
        "search": {"type": "object"},
    }, required=["schema", "planner_version", "inputs", "strategy", "stages", "placement", "prediction",
                 "alternatives"]),
}

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
