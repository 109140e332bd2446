"""Hugging Face `config.json` -> our model schema (the mapping `ModelSpec.from_dict` reads).

A config.json carries many keys a planner does not need; unknown keys are ignored. The keys read,
per `model_type` (first spelling wins when several are given; `null` counts as absent):

every model_type
    num_hidden_layers | n_layer                       -> layers
    hidden_size | n_embd | n_embed                    -> hidden
    num_attention_heads | n_head                      -> heads
    num_key_value_heads (default: heads)              -> kv_heads
    head_dim (default: hidden / heads; not for MLA)   -> head_dim
    vocab_size                                        -> vocab
    tie_word_embeddings (default per model_type)      -> tied_embeddings
    _name_or_path (default, or when empty: the model_type) -> name
    torch_dtype | dtype and every other key: ignored
llama, mistral, qwen2, qwen3
    intermediate_size -> ffn_hidden; max_position_embeddings -> seq_len; attention_dropout
    -> dropout. SwiGLU, RMSNorm, RoPE, no linear biases (Qwen2's QKV bias is left out), untied.
mixtral
    as llama, plus num_local_experts | num_experts, num_experts_per_tok; each expert has
    intermediate_size.
qwen2_moe
    as llama, plus num_experts | num_local_experts, num_experts_per_tok, moe_intermediate_size,
    shared_expert_intermediate_size (one shared expert of that size when > 0),
    decoder_sparse_step (must be 1), mlp_only_layers (must be a leading run 0..k-1: dense_layers).
qwen3_moe
    as qwen2_moe without the shared expert.
deepseek_v3
    as llama, plus n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
    first_k_dense_replace -> moe.dense_layers, moe_layer_freq (must be 1),
    num_nextn_predict_layers -> mtp_layers; MLA: kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim, q_lora_rank (null: full-rank query). head_dim is the query/key
    head size qk_nope_head_dim + qk_rope_head_dim (HF's own `head_dim` key means the RoPE part).
gpt2
    n_inner (default 4 * hidden) -> ffn_hidden; n_positions | n_ctx | max_position_embeddings ->
    learned positions; activation_function; dropout = max(resid_pdrop, attn_pdrop, embd_pdrop)
    (HF default 0.1). LayerNorm, linear biases, tied.
gpt_neox
    intermediate_size, max_position_embeddings, hidden_act; dropout = max(hidden_dropout,
    attention_dropout, or the older hidden_dropout_prob, attention_probs_dropout_prob).
    Rotary, LayerNorm, linear biases, untied.
bloom
    ffn_hidden = 4 * hidden (HF ignores n_inner); dropout = max(hidden_dropout,
    attention_dropout). ALiBi, LayerNorm, linear biases, tied; no position limit in the config,
    so seq_len keeps the ModelSpec default.
opt
    ffn_dim, max_position_embeddings (learned), activation_function, dropout = max(dropout,
    attention_dropout) (HF default 0.1); word_embed_proj_dim must equal hidden_size (OPT-350m's
    projected embeddings are not modelled). LayerNorm, linear biases, tied.
bert
    intermediate_size, max_position_embeddings (learned), hidden_act, dropout =
    max(hidden_dropout_prob, attention_probs_dropout_prob) (HF default 0.1). Bidirectional
    (causal: false), LayerNorm, linear biases, tied (the MLM head).

seq_len is min(max_position_embeddings, 8192): a long-context window (128K RoPE) is an
inference limit, not a training sequence length; the CLI's --seq-len overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import SpecError

SEQ_LEN_CAP = 8192
"""Longest default training sequence taken from max_position_embeddings."""

LAYERS = ("num_hidden_layers", "n_layer")
HIDDEN = ("hidden_size", "n_embd", "n_embed")
HEADS = ("num_attention_heads", "n_head")
KV_HEADS = ("num_key_value_heads",)
HEAD_DIM = ("head_dim",)
VOCAB = ("vocab_size",)
TIED = ("tie_word_embeddings",)
ROPE_THETA = ("rope_theta", "rotary_emb_base")
NORM_EPS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
SCORING = ("scoring_func",)
NAME = "_name_or_path"
MLA_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True, slots=True)
class MoeKeys:
    """Where one model_type keeps its mixture-of-experts sizes (empty tuple: not in its configs)."""

    experts: tuple[str, ...]
    top_k: tuple[str, ...] = ("num_experts_per_tok",)
    expert_ffn: tuple[str, ...] = ("moe_intermediate_size",)
    shared_experts: tuple[str, ...] = ()
    shared_ffn: tuple[str, ...] = ()
    """size of the single shared expert (Qwen-MoE); > 0 means one shared expert"""
    dense_layers: tuple[str, ...] = ()
    dense_list: tuple[str, ...] = ()
    """a list of dense layer indices that must be the leading run 0..k-1"""
    every: tuple[str, ...] = ()
    """MoE layer period keys; only 1 (every layer after the dense ones) is supported"""


@dataclass(frozen=True, slots=True)
class Family:
    """How one model_type spells the fields of our schema, and what it fixes."""

    norm: str
    position_embedding: str
    ffn_act: str = "swiglu"
    """the activation when no `act` key is given (gated families always swiglu)"""
    act: tuple[str, ...] = ()
    ffn: tuple[str, ...] = ("intermediate_size",)
    ffn_mult: int = 0
    """ffn_hidden = ffn_mult * hidden when no `ffn` key is set (0: an `ffn` key is required)"""
    positions: tuple[str, ...] = ("max_position_embeddings",)
    dropout: tuple[str, ...] = ("attention_dropout",)
    dropout_default: float = 0.0
    linear_bias: bool = False
    tied: bool = False
    """tie_word_embeddings when the config omits it (HF's default for that model_type)"""
    causal: bool = True
    moe: MoeKeys | None = None
    mla: bool = False
    mtp: tuple[str, ...] = ()
    """multi-token-prediction module count"""
    equal_hidden: tuple[str, ...] = ()
    """sizes that must equal hidden when given (a different one means a layout we do not model)"""


_LLAMA = Family(norm="rmsnorm", position_embedding="rope")
_QWEN3_MOE = MoeKeys(experts=("num_experts", "num_local_experts"), dense_list=("mlp_only_layers",),
                     every=("decoder_sparse_step",))
_LAYERNORM: dict[str, Any] = dict(norm="layernorm", linear_bias=True)

FAMILIES: dict[str, Family] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "mixtral": replace(_LLAMA, moe=MoeKeys(experts=("num_local_experts", "num_experts"),
                                           expert_ffn=("intermediate_size",))),
    "qwen2_moe": replace(_LLAMA, moe=replace(_QWEN3_MOE, shared_ffn=("shared_expert_intermediate_size",))),
    "qwen3_moe": replace(_LLAMA, moe=_QWEN3_MOE),
    "deepseek_v3": replace(_LLAMA, mla=True, mtp=("num_nextn_predict_layers",), moe=MoeKeys(
        experts=("n_routed_experts",), shared_experts=("n_shared_experts",),
        dense_layers=("first_k_dense_replace",), every=("moe_layer_freq",))),
    "gpt2": Family(**_LAYERNORM, position_embedding="learned", ffn_act="gelu", act=("activation_function",),
                   ffn=("n_inner",), ffn_mult=4, positions=("n_positions", "n_ctx", "max_position_embeddings"),
                   dropout=("resid_pdrop", "attn_pdrop", "embd_pdrop"), dropout_default=0.1, tied=True),
    "gpt_neox": Family(**_LAYERNORM, position_embedding="rope", ffn_act="gelu", act=("hidden_act",),
                       dropout=("hidden_dropout", "attention_dropout", "hidden_dropout_prob",
                                "attention_probs_dropout_prob")),
    "bloom": Family(**_LAYERNORM, position_embedding="alibi", ffn_act="gelu", ffn=(), ffn_mult=4, positions=(),
                    dropout=("hidden_dropout", "attention_dropout"), tied=True),
    "opt": Family(**_LAYERNORM, position_embedding="learned", ffn_act="relu",
                  act=("activation_function",), ffn=("ffn_dim",), dropout=("dropout", "attention_dropout"),
                  dropout_default=0.1, tied=True, equal_hidden=("word_embed_proj_dim",)),
    "bert": Family(**_LAYERNORM, position_embedding="learned", ffn_act="gelu", act=("hidden_act",),
                   dropout=("hidden_dropout_prob", "attention_probs_dropout_prob"), dropout_default=0.1,
                   tied=True, causal=False),
}

_REQUIRED = object()


class _Config:
    """Typed reads of a config.json under alias spellings; every error names the file and the key."""

    def __init__(self, data: dict, where: str):
        self.data = data
        self.where = where

    def error(self, message: str) -> SpecError:
        return SpecError(f"{self.where}: {message}")

    def find(self, keys: tuple[str, ...]) -> tuple[str, Any] | None:
        """(key, value) of the first of `keys` given with a non-null value."""
        for key in keys:
            if self.data.get(key) is not None:
                return key, self.data[key]
        return None

    def _get(self, keys: tuple[str, ...], default: Any) -> tuple[str | None, Any]:
        found = self.find(keys)
        if found is not None:
            return found
        if default is _REQUIRED:
            also = f" (also accepted: {', '.join(keys[1:])})" if len(keys) > 1 else ""
            raise self.error(f"required key {keys[0]} is missing{also}")
        return None, default

    def int(self, keys: tuple[str, ...], default: Any = _REQUIRED, minimum: int = 1) -> Any:
        key, value = self._get(keys, default)
        if key is None:
            return value
        if isinstance(value, bool) or not (isinstance(value, int) or isinstance(value, float) and value.is_integer()):
            raise self.error(f"{key}: expected an integer, got {value!r}")
        if value < minimum:
            expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(f"{key}: expected {expected}, got {value!r}")
        return int(value)

    def number(self, keys: tuple[str, ...]) -> float:
        """A positive finite number under one of `keys`, or 0.0 when none is given."""
        key, value = self._get(keys, None)
        if key is None:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 2**53:
            raise self.error(f"{key}: expected a positive number, got {value!r}")
        return float(value)

    def bool(self, keys: tuple[str, ...], default: bool) -> bool:
        key, value = self._get(keys, default)
        if not isinstance(value, bool):
            raise self.error(f"{key}: expected true or false, got {value!r}")
        return value

    def max_probability(self, keys: tuple[str, ...], default: float) -> float:
        """The largest of the given dropout probabilities, or `default` when none is given."""
        values = []
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise self.error(f"{key}: expected a probability in [0, 1), got {value!r}")
            values.append(float(value))
        return max(values, default=default)


def to_spec_dict(config: dict, where: str) -> dict:
    """The model-schema mapping of one parsed config.json (`where` names its file in errors).

    Only fields the config determines are set; ModelSpec.from_dict applies its defaults to the rest.
    """
    family = _family(config, where)
    cfg = _Config(config, where)
    hidden = cfg.int(HIDDEN)
    heads = cfg.int(HEADS)
    name = config.get(NAME)
    spec: dict[str, Any] = {
        "name": name if isinstance(name, str) and name else config["model_type"],
        # the file's name, not its path: a plan must not depend on where the file was read from
        "source": f"Hugging Face config.json ({Path(where).name})",
        "layers": cfg.int(LAYERS),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": cfg.int(KV_HEADS, heads),
        "ffn_hidden": cfg.int(family.ffn, family.ffn_mult * hidden if family.ffn_mult else _REQUIRED),
        "ffn_act": _activation(cfg, family),
        "norm": family.norm,
        "linear_bias": family.linear_bias,
        "position_embedding": family.position_embedding,
        "vocab": cfg.int(VOCAB),
        "tied_embeddings": cfg.bool(TIED, family.tied),
        "causal": family.causal,
        "dropout": cfg.max_probability(family.dropout, family.dropout_default),
    }
    for key in family.equal_hidden:
        if cfg.int((key,), hidden) != hidden:
            raise cfg.error(f"{key} ({config[key]}) differs from the hidden size ({hidden}): "
                            "projected embeddings are not supported")
    if family.mla:
        spec["mla"] = mla = {key: cfg.int((key,)) for key in MLA_KEYS}
        if q_rank := cfg.int(("q_lora_rank",), 0, minimum=0):
            mla["q_lora_rank"] = q_rank
        spec["head_dim"] = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    elif cfg.find(HEAD_DIM):
        spec["head_dim"] = cfg.int(HEAD_DIM)
    if positions := cfg.int(family.positions, 0):
        spec["seq_len"] = min(positions, SEQ_LEN_CAP)
        if family.position_embedding == "learned":
            spec["max_position"] = positions
    if family.moe:
        spec["moe"] = _moe(cfg, family.moe)
    if mtp := cfg.int(family.mtp, 0, minimum=0):
        spec["mtp_layers"] = mtp
    if family.position_embedding == "rope" and (theta := cfg.number(ROPE_THETA)):
        spec["rope_theta"] = theta
    if eps := cfg.number(NORM_EPS):
        spec["norm_eps"] = eps
    if family.moe and (scoring := cfg.find(SCORING)):
        if scoring[1] not in ("softmax", "sigmoid"):
            raise cfg.error(f"{scoring[0]}: router scoring {scoring[1]!r} is not supported (softmax or sigmoid)")
        spec["moe"]["router_scoring"] = scoring[1]
    if family.moe and (groups := cfg.int(("n_group",), 0, minimum=0)) > 1:
        # group-limited routing (DeepSeek-V3: n_group 8, topk_group 4); one group is no limit
        spec["moe"]["groups"], spec["moe"]["group_topk"] = groups, cfg.int(("topk_group",), groups, minimum=1)
    return spec


def _family(config: dict, where: str) -> Family:
    model_type = config.get("model_type")
    supported = ", ".join(sorted(FAMILIES))
    if model_type is None:
        raise SpecError(f"{where}: model_type is missing; supported model types: {supported}")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise SpecError(f"{where}: model_type {model_type!r} is not supported; supported model types: {supported}")
    return FAMILIES[model_type]


def _activation(cfg: _Config, family: Family) -> str:
    """relu or gelu from the activation key (any variant: gelu_new, gelu_fast, ...); a gated
    family's MLP is priced as SwiGLU, whose shapes a GeGLU shares, so its hidden_act must name
    one of the two."""
    found = cfg.find(family.act)
    if found is None:
        gated = cfg.find(("hidden_act",)) if family.ffn_act == "swiglu" else None
        if gated is not None and not any(a in str(gated[1]).lower() for a in ("silu", "swish", "gelu")):
            raise cfg.error(f"hidden_act: activation {gated[1]!r} is not supported in a gated MLP (expected silu "
                            "or a gelu variant)")
        return family.ffn_act
    key, value = found
    for act in ("relu", "gelu"):
        if act in str(value).lower():
            return act
    raise cfg.error(f"{key}: activation {value!r} is not supported (expected a relu or gelu variant)")


def _moe(cfg: _Config, keys: MoeKeys) -> dict:
    for key in keys.every:
        if cfg.int((key,), 1) != 1:
            raise cfg.error(f"{key}: only 1 is supported (MoE in every layer after the dense ones), "
                            f"got {cfg.data[key]}")
    moe = {"experts": cfg.int(keys.experts), "top_k": cfg.int(keys.top_k),
           "expert_ffn_hidden": cfg.int(keys.expert_ffn)}
    if shared_ffn := cfg.int(keys.shared_ffn, 0, minimum=0):
        moe.update(shared_experts=1, shared_ffn_hidden=shared_ffn)
    if shared := cfg.int(keys.shared_experts, 0, minimum=0):
        moe["shared_experts"] = shared
    if dense := cfg.int(keys.dense_layers, 0, minimum=0) or _dense_prefix(cfg, keys.dense_list):
        moe["dense_layers"] = dense
    return moe


def _dense_prefix(cfg: _Config, keys: tuple[str, ...]) -> int:
    """k when the listed dense layers are exactly 0..k-1 (Qwen's mlp_only_layers), else 0 or an error."""
    found = cfg.find(keys)
    if found is None:
        return 0
    key, value = found
    if not isinstance(value, list) or value != list(range(len(value))):
        raise cfg.error(f"{key}: only a leading run of dense layers [0, 1, ..., k-1] is supported, got {value!r}")
    return len(value)
