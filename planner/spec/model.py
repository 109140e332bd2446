"""ModelSpec: the architecture of a model, from our YAML (strict) or a Hugging Face config.json.

Schema (DESIGN.md "Spec files"): transformer fields, optional `moe:` and `mla:` blocks, or an
explicit `graph:` list of layers for non-transformer models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from planner.errors import SpecError
from planner.limits import MAX_LAYERS
from planner.spec.fields import Fields, load_mapping

FfnAct = Literal["gelu", "swiglu", "relu"]
ROUTER_SCORINGS = ("softmax", "sigmoid")
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["rope", "learned", "alibi", "none"]
FFN_ACTS = ("gelu", "swiglu", "relu")
NORMS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("rope", "learned", "alibi", "none")


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """Mixture-of-experts MLP replacing the dense MLP in every layer after `dense_layers`."""

    experts: int
    """routed experts per MoE layer"""
    top_k: int
    """routed experts each token visits"""
    expert_ffn_hidden: int
    """intermediate size of one routed expert"""
    shared_experts: int = 0
    """experts every token visits (DeepSeek, Qwen-MoE)"""
    shared_ffn_hidden: int = 0
    """intermediate size of one shared expert (default: expert_ffn_hidden)"""
    dense_layers: int = 0
    """leading layers that keep the dense MLP of size ffn_hidden"""
    router_scoring: str = "softmax"
    """how the router scores experts: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3)"""
    groups: int = 0
    """group-limited routing: the experts fall into this many equal groups, consecutive (Megatron
    moe_router_num_groups, DeepSeek-V3's n_group 8; 0: none)"""
    group_topk: int = 0
    """the groups a token's experts come from (moe_router_group_topk, DeepSeek-V3's topk_group 4:
    with one group a node, a token reaches at most 4 nodes)"""

    def __post_init__(self) -> None:
        if self.top_k > self.experts:
            raise SpecError(f"moe.top_k ({self.top_k}) must not exceed moe.experts ({self.experts})")
        if self.groups or self.group_topk:
            if not self.groups or self.experts % self.groups or not 1 <= self.group_topk <= self.groups:
                raise SpecError(f"moe.groups ({self.groups}) must divide moe.experts ({self.experts}) and "
                                f"moe.group_topk ({self.group_topk}) be 1..groups")
            if self.group_topk * (self.experts // self.groups) < self.top_k:
                raise SpecError(f"moe.group_topk ({self.group_topk}) groups of {self.experts // self.groups} experts "
                                f"cannot hold moe.top_k ({self.top_k})")


@dataclass(frozen=True, slots=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank query and key/value projections."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0
    """0 means a full-rank query projection"""


@dataclass(frozen=True, slots=True)
class GraphLayer:
    """One layer of an explicit graph; all figures per sample (one sequence or image)."""

    name: str
    fwd_flops: float
    params: int
    saved_bytes: float
    output_bytes: float


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    kv_heads: int = 0
    """key/value heads (GQA); 0 in the input means = heads"""
    head_dim: int = 0
    """0 in the input means hidden / heads"""
    ffn_act: FfnAct = "gelu"
    norm: Norm = "layernorm"
    linear_bias: bool = False
    position_embedding: PositionEmbedding = "rope"
    max_position: int = 0
    """rows of a learned position table (default seq_len)"""
    seq_len: int = 2048
    tied_embeddings: bool = False
    causal: bool = True
    """False for encoders (BERT): attention over the whole sequence"""
    dropout: float = 0.0
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    mtp_layers: int = 0
    """DeepSeek multi-token-prediction modules: listed, never priced unless asked for"""
    rope_theta: float = 0.0
    """base of the rotary position embedding (Llama 3: 500000); 0: not stated (the runtime's)"""
    norm_eps: float = 0.0
    """epsilon of the layer or RMS norms; 0: not stated (the runtime's)"""
    graph: tuple[GraphLayer, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.graph is not None:
            return
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise SpecError(f"{self.name}: hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.max_position == 0:
            object.__setattr__(self, "max_position", self.seq_len)
        if self.heads % self.kv_heads:
            raise SpecError(f"{self.name}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.moe and self.moe.dense_layers > self.layers:
            raise SpecError(f"{self.name}: moe.dense_layers ({self.moe.dense_layers}) exceeds layers ({self.layers})")

    @property
    def is_graph(self) -> bool:
        return self.graph is not None

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index >= self.moe.dense_layers

    def to_dict(self) -> dict:
        """The resolved spec as plain data (recorded in plans; from_dict reads it back)."""
        d = asdict(self)
        if self.graph is not None:
            return {"name": self.name, "source": self.source, "seq_len": self.seq_len,
                    "graph": [asdict(g) for g in self.graph]}
        for key in ("moe", "mla", "graph"):
            if d[key] is None:
                del d[key]
        if self.moe is not None and not self.moe.groups:
            del d["moe"]["groups"], d["moe"]["group_topk"]  # plans made before the fields read alike
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str = "model") -> "ModelSpec":
        f = Fields(data, where)
        name = f.str("name", "model")
        source = f.str("source", "")
        if f.has("graph"):
            return _graph_model(f, name, source)
        layers = f.int("layers", maximum=MAX_LAYERS)
        hidden = f.int("hidden")
        heads = f.int("heads")
        spec = dict(
            name=name, source=source, layers=layers, hidden=hidden, heads=heads,
            kv_heads=f.int("kv_heads", heads), head_dim=f.int("head_dim", 0, minimum=0),
            ffn_hidden=f.int("ffn_hidden"), ffn_act=f.choice("ffn_act", FFN_ACTS, "gelu"),
            norm=f.choice("norm", NORMS, "layernorm"), linear_bias=f.bool("linear_bias", False),
            position_embedding=f.choice("position_embedding", POSITION_EMBEDDINGS, "rope"),
            max_position=f.int("max_position", 0, minimum=0), vocab=f.int("vocab"),
            seq_len=f.int("seq_len", 2048), tied_embeddings=f.bool("tied_embeddings", False),
            causal=f.bool("causal", True), dropout=_dropout(f),
            mtp_layers=f.int("mtp_layers", 0, minimum=0),
            rope_theta=f.float("rope_theta", 0.0, positive=False), norm_eps=f.float("norm_eps", 0.0, positive=False,
                                                                                    maximum=1.0),
        )
        moe = f.sub("moe")
        if moe is not None:
            experts_ffn = moe.int("expert_ffn_hidden")
            spec["moe"] = _checked(
                where, MoeSpec, experts=moe.int("experts"), top_k=moe.int("top_k"), expert_ffn_hidden=experts_ffn,
                shared_experts=moe.int("shared_experts", 0, minimum=0),
                shared_ffn_hidden=moe.int("shared_ffn_hidden", experts_ffn),
                dense_layers=moe.int("dense_layers", 0, minimum=0),
                router_scoring=moe.choice("router_scoring", ROUTER_SCORINGS, "softmax"),
                groups=moe.int("groups", 0, minimum=0), group_topk=moe.int("group_topk", 0, minimum=0))
            moe.reject_unknown()
        mla = f.sub("mla")
        if mla is not None:
            spec["mla"] = _checked(
                where, MlaSpec, kv_lora_rank=mla.int("kv_lora_rank"), qk_nope_head_dim=mla.int("qk_nope_head_dim"),
                qk_rope_head_dim=mla.int("qk_rope_head_dim"), v_head_dim=mla.int("v_head_dim"),
                q_lora_rank=mla.int("q_lora_rank", 0, minimum=0))
            mla.reject_unknown()
        f.reject_unknown()
        return _checked(where, cls, **spec)


def _checked(where: str, build, **fields):
    """build(**fields), naming the file (`where`) in the error of a rule between fields that the
    spec's own checks find (heads and kv_heads, top_k and experts, ...)."""
    try:
        return build(**fields)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def _dropout(f: Fields) -> float:
    return f.float("dropout", 0.0, positive=False, maximum=0.999)


def _graph_model(f: Fields, name: str, source: str) -> ModelSpec:
    items = f.raw("graph")
    if not isinstance(items, list) or not items:
        raise f.error("graph", "expected a non-empty list of layers")
    if len(items) > MAX_LAYERS:
        raise f.error("graph", f"{len(items):,} layers; at most {MAX_LAYERS:,}")
    graph = []
    for i, item in enumerate(items):
        g = Fields(item, f.where, f"graph[{i}].")
        graph.append(GraphLayer(
            name=g.str("name", f"layer{i}"), fwd_flops=g.float("fwd_flops"),
            params=g.int("params", minimum=0), saved_bytes=g.float("saved_bytes", positive=False),
            output_bytes=g.float("output_bytes")))
        g.reject_unknown()
    seq_len = f.int("seq_len", 1)
    f.reject_unknown()
    return ModelSpec(name=name, source=source, layers=len(graph), hidden=0, heads=0, ffn_hidden=0,
                     vocab=0, seq_len=seq_len, graph=tuple(graph))


def load_model(ref: str) -> ModelSpec:
    """A preset name (file stem under models/), a path to our YAML, or a path to a config.json."""
    from planner.presets import resolve
    from planner.spec import hf

    path = resolve(ref, "models", "model")
    data = load_mapping(path)
    if path.suffix == ".json" or "model_type" in data:
        return ModelSpec.from_dict(hf.to_spec_dict(data, str(path)), str(path))
    data.setdefault("name", path.stem)
    return ModelSpec.from_dict(data, str(path))
