"""PyTorch (CPU) as an independent oracle for the layer graph's FLOPs, saved activations and
training-state bytes (planner.graph, planner.cost.memory).

Nothing here reuses the planner's formulas: each test builds the model in plain torch (no
transformers), lets PyTorch count what it does, and compares with the graph.

  FLOPs        torch.utils.flop_counter.FlopCounterMode over forward + backward (2*m*n*k per
               matmul, backward = grad-input + grad-weight GEMMs = 2x forward).
  activations  torch.autograd.graph.saved_tensors_hooks: every tensor autograd keeps for
               backward, deduplicated by storage, parameters excluded, the layer input included
               (Korthikanti et al. 2022 count the first LayerNorm's input).
  states       the bytes of real tensors after one torch.optim.AdamW step in the mixed-precision
               layout (bf16 weights, fp32 master + fp32 grads + two fp32 Adam moments).

Two CPU-vs-GPU details the models below take care of:
  * F.dropout on CPU multiplies by a bf16 noise tensor (2 bytes per element kept for backward);
    the fused CUDA kernel keeps a bool mask (1 byte, as in Korthikanti 2022). `_dropout` calls
    torch.native_dropout, the op CUDA runs, which on CPU too keeps a bool mask.
  * CPU LayerNorm in bf16 keeps mean/rstd in bf16 (4 bytes per token) where CUDA keeps fp32 (8,
    the graph's `aux`): a 0.1 % effect at these sizes, well inside the tolerances.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch CPU is the independent oracle; pip install torch==2.13.0")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from planner.cost.memory import GRAD_BYTES, OPTIMIZER_BYTES, state_bytes  # noqa: E402
from planner.graph import (  # noqa: E402
    LOGIT_SAVED_BYTES, Ctx, build_layers, embedding_work, head_work, layer_work, model_params)
from planner.spec.model import ModelSpec, MoeSpec  # noqa: E402

torch.set_num_threads(2)


# --------------------------------------------------------------------------------------------
# Plain-torch transformer pieces
# --------------------------------------------------------------------------------------------

def _dropout(x, p: float):
    """Training-mode dropout keeping a 1-byte bool mask (the fused CUDA kernel's layout)."""
    return torch.native_dropout(x, p, True)[0] if p > 0 else x


class SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up saving only its input for backward, as Megatron's fused bias_swiglu does
    (an unfused silu/mul would also keep silu(gate))."""

    @staticmethod
    def forward(ctx, gate_up):
        ctx.save_for_backward(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        (gate_up,) = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        d_gate = grad * up * sig * (1 + gate * (1 - sig))
        return torch.cat([d_gate, grad * gate * sig], dim=-1)


class RMSNormFn(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * w keeping its 16-bit input and the fp32 rstd per token, as
    fused RMSNorm kernels do (Apex/Transformer Engine). torch's nn.RMSNorm is composite on CPU
    and in bf16 keeps two fp32 copies of the activation (8 bytes per element)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        acc = torch.promote_types(x.dtype, torch.float32)
        rstd = torch.rsqrt(x.to(acc).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.to(acc) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype) * weight.to(rstd.dtype)
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (grad.to(rstd.dtype) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        return RMSNormFn.apply(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, bias: bool, impl: str, p_attn: float = 0.0):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, h // heads
        self.impl, self.p_attn = impl, p_attn
        self.qkv = nn.Linear(h, (heads + 2 * kv_heads) * self.d, bias=bias)
        self.proj = nn.Linear(heads * self.d, h, bias=bias)

    def forward(self, x):
        b, s, _ = x.shape
        d, a, g = self.d, self.heads, self.kv_heads
        q, k, v = self.qkv(x).split([a * d, g * d, g * d], dim=-1)
        q = q.view(b, s, a, d).transpose(1, 2)
        k = k.view(b, s, g, d).transpose(1, 2)
        v = v.view(b, s, g, d).transpose(1, 2)
        if self.impl == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=g < a)
        else:  # eager: every s x s score is computed (no causal skipping), then masked
            if g < a:
                k, v = k.repeat_interleave(a // g, dim=1), v.repeat_interleave(a // g, dim=1)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            causal = torch.ones(s, s, dtype=torch.bool).triu(1)
            probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
            o = _dropout(probs, self.p_attn) @ v
        return self.proj(o.transpose(1, 2).reshape(b, s, a * d))


class MLP(nn.Module):
    def __init__(self, h: int, f: int, act: str, bias: bool):
        super().__init__()
        self.act = act
        self.up = nn.Linear(h, 2 * f if act == "swiglu" else f, bias=bias)
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x):
        y = self.up(x)
        return self.down(SwiGLUFn.apply(y) if self.act == "swiglu" else F.gelu(y))


class MoE(nn.Module):
    """Top-k MoE: router h->E, softmax, top-k; each expert (SwiGLU) runs on its routed tokens,
    outputs combined with the routing weights (index_put: index_add would also keep its source
    for backward, a copy no MoE runtime keeps)."""

    def __init__(self, h: int, experts: int, top_k: int, f: int):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(h, experts, bias=False)
        self.experts = nn.ModuleList(MLP(h, f, "swiglu", bias=False) for _ in range(experts))

    def forward(self, x):
        xt = x.reshape(-1, x.shape[-1])
        weights, idx = torch.softmax(self.router(xt), dim=-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(xt)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel():
                y = expert(xt[tok]) * weights[tok, slot].unsqueeze(-1)
                out = out.index_put((tok,), y, accumulate=True)
        return out.view_as(x)


def _norm(spec: ModelSpec):
    return nn.LayerNorm(spec.hidden) if spec.norm == "layernorm" else RMSNorm(spec.hidden)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, impl: str, p: float = 0.0):
        super().__init__()
        h = spec.hidden
        self.p = p
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.attn = Attention(h, spec.heads, spec.kv_heads, spec.linear_bias, impl, p)
        if spec.moe is not None:
            self.mlp = MoE(h, spec.moe.experts, spec.moe.top_k, spec.moe.expert_ffn_hidden)
        else:
            self.mlp = MLP(h, spec.ffn_hidden, spec.ffn_act, spec.linear_bias)

    def forward(self, x):
        x = x + _dropout(self.attn(self.norm1(x)), self.p)
        return x + _dropout(self.mlp(self.norm2(x)), self.p)


class GPT(nn.Module):
    """Token + learned position embeddings, blocks, final norm, untied LM head, fp32 cross entropy."""

    def __init__(self, spec: ModelSpec, impl: str, p: float = 0.0):
        super().__init__()
        self.p = p
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.max_position, spec.hidden) if spec.position_embedding == "learned" else None
        self.blocks = nn.ModuleList(Block(spec, impl, p) for _ in range(spec.layers))
        self.norm = _norm(spec)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1]))
        x = _dropout(x, self.p)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


# --------------------------------------------------------------------------------------------
# Measurement helpers
# --------------------------------------------------------------------------------------------

def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def measure_saved(module: nn.Module, fn):
    """(bytes, {storage ptr: (nbytes, dtype, shape)}) of the tensors autograd saves while fn()
    runs, one count per storage, parameters excluded. fn's result is kept alive (so no saved
    storage is freed and reused) until the count is done."""
    params = _storages(module.parameters())
    seen: dict[int, tuple[int, torch.dtype, tuple]] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), (st.nbytes(), t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    total = sum(n for n, _, _ in seen.values())
    del out
    return total, seen


def count_train_flops(module: nn.Module, x) -> int:
    with FlopCounterMode(display=False) as counter:
        module(x).sum().backward()
    return counter.get_total_flops()


def graph_train_flops(spec: ModelSpec, ctx: Ctx) -> float:
    """Forward GEMMs + attention core, x3 for forward + backward (backward = 2x forward GEMMs)."""
    (layer,) = build_layers(spec)
    w = layer_work(layer, ctx)
    return 3 * (sum(f for f, _ in w.gemms) + w.attn_flops)


def _ratio(measured: float, graph: float) -> str:
    return f"measured {measured:,.0f} vs graph {graph:,.0f} (ratio {measured / graph:.4f})"


# --------------------------------------------------------------------------------------------
# 1. FLOPs of one layer, forward + backward
# --------------------------------------------------------------------------------------------

B, S = 2, 64

FLOP_SPECS = {
    # GPT-2 style: LayerNorm, MHA with biases, GELU MLP of 4h
    "gpt": ModelSpec(name="gpt", layers=1, hidden=128, heads=4, ffn_hidden=512, vocab=512, ffn_act="gelu",
                     linear_bias=True, position_embedding="learned", seq_len=S),
    # Llama style: RMSNorm, GQA (8 query heads, 2 kv heads), SwiGLU, no biases; rope is
    # elementwise (no matmul FLOPs), so the torch block leaves it out
    "llama": ModelSpec(name="llama", layers=1, hidden=128, heads=8, kv_heads=2, ffn_hidden=344, vocab=512,
                       ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=S),
    # top-2 of 8 SwiGLU experts behind attention
    "moe": ModelSpec(name="moe", layers=1, hidden=128, heads=4, ffn_hidden=344, vocab=512, ffn_act="swiglu",
                     norm="rmsnorm", position_embedding="rope", seq_len=S,
                     moe=MoeSpec(experts=8, top_k=2, expert_ffn_hidden=96)),
}


@pytest.mark.parametrize("name", list(FLOP_SPECS))
def test_layer_flops_match_flop_counter(name):
    # Reference: every GEMM is 2*m*n*k (forward), its backward is the grad-input and grad-weight
    # GEMMs (2x forward), so training = 3x forward (Narayanan et al. 2021 §5.1; Korthikanti 2022
    # App. A: per layer forward 24*b*s*h^2 + 4*b*s^2*h for GPT). Eager attention computes the full
    # s x s scores (Ctx(flash=False): no causal skipping). MoE: tokens*top_k expert GEMMs plus the
    # router 2*tokens*h*E (Megatron num_floating_point_operations counts k routed experts).
    spec = FLOP_SPECS[name]
    torch.manual_seed(0)
    block = Block(spec, impl="eager")
    x = torch.randn(B, S, spec.hidden, requires_grad=True)  # input grads too: backward = 2x forward
    measured = count_train_flops(block, x)
    graph = graph_train_flops(spec, Ctx(micro_batch=B, seq_len=S, flash=False))
    if name == "gpt":  # Korthikanti's closed form, as a check on the check
        h = spec.hidden
        assert graph == pytest.approx(3 * (24 * B * S * h * h + 4 * B * S * S * h), rel=1e-12)
    assert measured == pytest.approx(graph, rel=0.01), _ratio(measured, graph)


# --------------------------------------------------------------------------------------------
# 2. Saved activation bytes of one layer (bf16)
# --------------------------------------------------------------------------------------------

H, A, SEQ, MB = 256, 8, 128, 2


def _gpt_spec(layers: int = 1, heads: int = A, vocab: int = 2048) -> ModelSpec:
    return ModelSpec(name="gpt", layers=layers, hidden=H, heads=heads, ffn_hidden=4 * H, vocab=vocab,
                     ffn_act="gelu", linear_bias=True, position_embedding="learned", seq_len=SEQ)


def _layer_saved(spec: ModelSpec, impl: str, p: float) -> tuple[int, dict]:
    torch.manual_seed(0)
    block = Block(spec, impl, p).to(torch.bfloat16).train()
    x = torch.randn(MB, SEQ, spec.hidden, dtype=torch.bfloat16, requires_grad=True)
    return measure_saved(block, lambda: block(x))


def test_gpt_layer_saved_bytes_flash_no_dropout():
    # Reference: Korthikanti 2022 Table 2 without dropout masks and without the s x s terms (flash
    # keeps no scores): 32*s*b*h, plus the graph's aux (norm statistics, attention log-sum-exp);
    # REFERENCES.md: PyTorch measured 32.08*s*b*h per GPT layer with causal SDPA.
    spec = _gpt_spec(heads=4)
    measured, _ = _layer_saved(spec, "sdpa", 0.0)
    w = layer_work(build_layers(spec)[0], Ctx(micro_batch=MB, seq_len=SEQ, flash=True, dropout=0.0))
    sbh = SEQ * MB * H
    assert w.saved.main == 32 * sbh
    assert measured == pytest.approx(w.saved.total, rel=0.05), _ratio(measured, w.saved.total)


def test_gpt_layer_saved_bytes_eager_dropout():
    # Reference: Korthikanti 2022 Eq. 1 / Table 2 (no parallelism): s*b*h*(34 + 5*a*s/h) bytes,
    # 16-bit values and 1-byte dropout masks; the graph adds LayerNorm mean/rstd as `aux`.
    spec = _gpt_spec(heads=A)
    measured, _ = _layer_saved(spec, "eager", 0.1)
    w = layer_work(build_layers(spec)[0], Ctx(micro_batch=MB, seq_len=SEQ, flash=False, dropout=0.1))
    assert w.saved.main == SEQ * MB * H * (34 + 5 * A * SEQ / H)
    assert measured == pytest.approx(w.saved.total, rel=0.05), _ratio(measured, w.saved.total)


def test_llama_layer_saved_bytes_gqa_swiglu():
    # Beyond the GPT layer: GQA keeps K and V at kv_heads only (SDPA enable_gqa), and a fused
    # SwiGLU keeps its 2f-wide input and the f-wide down-projection input (graph: 3*2 bytes per
    # f per token). Reference: the same per-tensor accounting as Korthikanti 2022 §4.1.
    spec = ModelSpec(name="llama", layers=1, hidden=H, heads=8, kv_heads=2, ffn_hidden=688, vocab=2048,
                     ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=SEQ)
    measured, _ = _layer_saved(spec, "sdpa", 0.0)
    w = layer_work(build_layers(spec)[0], Ctx(micro_batch=MB, seq_len=SEQ, flash=True, dropout=0.0))
    assert measured == pytest.approx(w.saved.total, rel=0.05), _ratio(measured, w.saved.total)


def test_moe_layer_saved_bytes():
    # Beyond the GPT layer: a top-2-of-4 MoE layer. What autograd keeps for the MoE MLP: the MLP
    # norm output (router input, the same tensor the graph's 4*rep counts), the routed token copies
    # (expert inputs, tokens*top_k*h), the expert outputs (kept to differentiate the routing
    # weights, tokens*top_k*h), the SwiGLU tensors per routed token, plus small routing tensors
    # (probabilities, indices). Graph: the same two tokens*top_k*h buffers and SwiGLU terms.
    spec = ModelSpec(name="moe", layers=1, hidden=H, heads=4, ffn_hidden=688, vocab=2048, ffn_act="swiglu",
                     norm="rmsnorm", position_embedding="rope", seq_len=SEQ,
                     moe=MoeSpec(experts=4, top_k=2, expert_ffn_hidden=128))
    measured, _ = _layer_saved(spec, "sdpa", 0.0)
    w = layer_work(build_layers(spec)[0], Ctx(micro_batch=MB, seq_len=SEQ, flash=True, dropout=0.0))
    assert measured == pytest.approx(w.saved.total, rel=0.05), _ratio(measured, w.saved.total)


# --------------------------------------------------------------------------------------------
# 3. Saved activation bytes of a whole small model
# --------------------------------------------------------------------------------------------

WHOLE = {"sdpa-no-dropout": ("sdpa", 0.0, True), "eager-dropout": ("eager", 0.1, False)}


def _whole_model_saved(impl: str, p: float):
    spec = _gpt_spec(layers=2, heads=4, vocab=2048)
    torch.manual_seed(0)
    model = GPT(spec, impl, p).to(torch.bfloat16).train()
    idx = torch.randint(0, spec.vocab, (MB, SEQ))
    targets = torch.randint(0, spec.vocab, (MB, SEQ))
    measured, seen = measure_saved(model, lambda: model(idx, targets))
    logits_fp32 = sum(n for n, dt, shape in seen.values() if dt == torch.float32 and shape[-1:] == (spec.vocab,))
    return spec, measured, logits_fp32


@pytest.mark.parametrize("variant", list(WHOLE))
def test_whole_model_saved_bytes(variant):
    # Reference: sum of the per-layer Korthikanti 2022 terms (as above), the embedding dropout mask,
    # the final norm's input and output (LM-head input), and what the fp32 cross entropy keeps
    # for backward (graph: LOGIT_SAVED_BYTES per logit).
    impl, p, flash = WHOLE[variant]
    spec, measured, logits_fp32 = _whole_model_saved(impl, p)
    ctx = Ctx(micro_batch=MB, seq_len=SEQ, flash=flash, dropout=p)
    layers = sum(layer_work(layer, ctx).saved.total for layer in build_layers(spec))
    ends = embedding_work(spec, ctx).saved_bytes + head_work(spec, ctx).saved_bytes
    graph = layers + ends
    n_logits = MB * SEQ * spec.vocab
    detail = (f"{_ratio(measured, graph)}; cross entropy keeps {logits_fp32 / n_logits:.2f} bytes per logit "
              f"(fp32 log-softmax), the graph counts {LOGIT_SAVED_BYTES}")
    # the logits term on its own: what the fp32 cross entropy keeps per logit
    assert logits_fp32 == pytest.approx(LOGIT_SAVED_BYTES * n_logits, rel=0.01), detail
    assert measured == pytest.approx(graph, rel=0.05), detail


# --------------------------------------------------------------------------------------------
# 4. Parameters and mixed-precision AdamW state bytes
# --------------------------------------------------------------------------------------------

PARAM_SPECS = {
    "gpt": _gpt_spec(layers=2, heads=4, vocab=2048),
    "llama-gqa": ModelSpec(name="llama", layers=2, hidden=H, heads=8, kv_heads=2, ffn_hidden=688, vocab=2048,
                           ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=SEQ),
    "moe": ModelSpec(name="moe", layers=2, hidden=H, heads=4, ffn_hidden=688, vocab=2048, ffn_act="swiglu",
                     norm="rmsnorm", position_embedding="rope", seq_len=SEQ,
                     moe=MoeSpec(experts=4, top_k=2, expert_ffn_hidden=128)),
}


@pytest.mark.parametrize("name", list(PARAM_SPECS))
def test_model_params_match_torch(name):
    # Reference: Narayanan 2021 Eq. 2 for GPT (12*l*h^2 + 13*l*h + (V+s)*h, here with an untied
    # head: + V*h + 2h final norm); for the others, the parameter count of the same torch model.
    spec = PARAM_SPECS[name]
    model = GPT(spec, impl="sdpa")
    n = sum(p.numel() for p in model.parameters())
    assert model_params(spec) == pytest.approx(n, rel=0.01), f"graph {model_params(spec):,} vs torch {n:,}"
    if name == "gpt":
        h, l, v, s = H, spec.layers, spec.vocab, SEQ
        assert n == 12 * l * h * h + 13 * l * h + (v + s) * h + v * h + 2 * h


def test_adamw_state_bytes_match_state_bytes():
    # Reference: ZeRO paper (Rajbhandari et al. 2020 §3.1) mixed-precision Adam, 2 + 12 bytes per
    # parameter, with fp32 gradients (Megatron main_grad; Korthikanti 2022's 18 bytes/param).
    spec = PARAM_SPECS["gpt"]
    torch.manual_seed(0)
    model = GPT(spec, impl="sdpa").to(torch.bfloat16).train()
    master = [p.detach().float().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    idx = torch.randint(0, spec.vocab, (MB, SEQ))
    model(idx, idx.roll(-1, dims=1)).backward()
    for p, m in zip(model.parameters(), master):
        m.grad = p.grad.float()
    model.zero_grad(set_to_none=True)  # the bf16 grads are transient; fp32 grads are the state
    opt.step()
    with torch.no_grad():
        for p, m in zip(model.parameters(), master):
            p.copy_(m)

    def nbytes(tensors):
        tensors = list(tensors)
        assert len(_storages(tensors)) == len(tensors)  # no shared storage
        return sum(t.untyped_storage().nbytes() for t in tensors)

    weights = nbytes(model.parameters())
    grads = nbytes(m.grad for m in master)
    states = [opt.state[m] for m in master]
    optimizer = nbytes(master) + nbytes(st[k] for st in states for k in ("exp_avg", "exp_avg_sq"))
    assert all(st["exp_avg"].dtype == torch.float32 for st in states)

    g_weights, g_grads, g_opt = state_bytes(model_params(spec), zero=0, shards=1, grad_bytes=GRAD_BYTES,
                                           optimizer=OPTIMIZER_BYTES)
    assert weights == pytest.approx(g_weights, rel=0.02), _ratio(weights, g_weights)
    assert grads == pytest.approx(g_grads, rel=0.02), _ratio(grads, g_grads)
    assert optimizer == pytest.approx(g_opt, rel=0.02), _ratio(optimizer, g_opt)


# --------------------------------------------------------------------------------------------
# The loss at its peak (runtimes.RuntimeRules.loss_bytes_per_logit)
# --------------------------------------------------------------------------------------------

def _loss_peak_bytes_per_logit(loss_fn, batch=1, seq=256, hidden=64, vocab=2000, around=None) -> float:
    """The most bytes live at once, per logit, from the LM head's matmul through the loss and its
    backward (torch.distributed._tools.mem_tracker on CPU; the head's input and weight excluded),
    the logits dropped after the loss as torchtitan's train step does (`del pred`); `around`: a
    context both the loss and its backward run in (torch's loss_parallel())."""
    import contextlib
    from torch.distributed._tools.mem_tracker import MemTracker
    torch.manual_seed(0)
    h = torch.randn(batch, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    tracker = MemTracker()
    tracker.track_external(h, w)
    with tracker, around or contextlib.nullcontext():
        logits = h @ w.t()
        loss = loss_fn(logits, labels)
        del logits
        loss.backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return (peak - 2 * (h.numel() + w.numel())) / (batch * seq * vocab)


def test_torchtitans_uncompiled_loss_peaks_at_its_records_bytes_per_logit():
    """torchtitan's own cross_entropy_loss (cross_entropy of an fp32 cast; the installed 0.2.2)
    holds the fp32 log-probabilities, their gradient and the input's gradient at once."""
    pytest.importorskip("torchtitan")
    from torchtitan.components.loss import cross_entropy_loss

    from planner.runtimes import RUNTIME_RULES
    assert _loss_peak_bytes_per_logit(cross_entropy_loss) == pytest.approx(
        RUNTIME_RULES["torchtitan"].loss_bytes_per_logit, abs=0.05)


def _on_one_megatron_rank(tmp_path, measure):
    """`measure` (a loss's bytes per logit) of megatron-core 0.16.0's vocab_parallel_cross_entropy
    on one tensor-parallel rank (gloo on CPU, a file rendezvous: no port to collide with)."""
    import warnings
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no Transformer Engine or Apex on CPU
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)

        def loss(logits, labels):  # Megatron's layout: [sequence, batch, vocab]
            return vocab_parallel_cross_entropy(logits.transpose(0, 1), labels.transpose(0, 1)).mean()
        return measure(loss)
    finally:
        parallel_state.destroy_model_parallel()
        if started:
            dist.destroy_process_group()


def test_megatron_cores_vocab_parallel_loss_peaks_at_its_records_bytes_per_logit(tmp_path):
    """megatron-core 0.16.0's vocab_parallel_cross_entropy (one tensor-parallel rank, gloo on
    CPU): the bf16 logits beside their fp32 copy, softmax and gradient in place. Megatron-DeepSpeed's
    and nanotron's versions of it subtract the max out of place and hold more (their records: 10,
    measured once on their own code, which the tests cannot import)."""
    from planner.runtimes import RUNTIME_RULES
    measured = _on_one_megatron_rank(tmp_path, _loss_peak_bytes_per_logit)
    assert measured == pytest.approx(RUNTIME_RULES["megatron"].loss_bytes_per_logit, abs=0.05)
    for name in ("deepspeed", "nanotron"):
        assert RUNTIME_RULES[name].loss_bytes_per_logit > measured + 3


def test_a_compiled_loss_keeps_the_bf16_logits_alone():
    """Under torch.compile the loss keeps only the bf16 logits (and per-row statistics) for
    backward, whose gradient comes back in bf16: 2 + 2 bytes per logit at the peak, the
    torchtitan@compile record's."""
    import shutil
    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("cc")):
        pytest.skip("torch.compile on CPU needs a C++ compiler")
    from planner.runtimes import RUNTIME_RULES

    def loss(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
    compiled = torch.compile(loss)
    logits = torch.randn(1, 256, 2000, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 2000, (1, 256))
    compiled(logits, labels).backward()  # compile outside the count
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = compiled(logits, labels)
    big = [t for t in kept if t.numel() >= logits.numel()]
    assert [(t.dtype, t.numel()) for t in big] == [(torch.bfloat16, logits.numel())]
    logits.grad = None
    out.backward()
    assert logits.grad.dtype == torch.bfloat16
    assert RUNTIME_RULES["torchtitan@compile"].loss_bytes_per_logit == 2 * big[0].element_size()


# --------------------------------------------------------------------------------------------
# An eager norm's HBM traffic (runtimes.RuntimeRules.eager_norm_bytes)
# --------------------------------------------------------------------------------------------

class _TorchtitanEagerRMSNorm(torch.nn.Module):
    """torchtitan/models/norms.py's RMSNorm at d4c86e375 (2024-12), verbatim in its arithmetic,
    its weight in bf16 as FSDP2's mixed precision casts it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=torch.bfloat16))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def _bytes_moved_per_element(fn, numel: int) -> float:
    """Bytes every aten op that copies reads and writes while `fn` runs (its tensor arguments and
    results; a broadcast view at the size of what it views; an op that returns an argument's
    storage without writing it, such as _unsafe_view, moves nothing), per element of `numel`."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def size(t):
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            aliases = {t.untyped_storage().data_ptr() for t in ins} & {t.untyped_storage().data_ptr() for t in outs}
            if not func.is_view and not (aliases and not func._schema.is_mutable):
                Count.total += sum(size(t) for t in ins + outs)
            return out

    with Count():
        fn()
    return Count.total / numel


def test_torchtitans_eager_rmsnorm_moves_its_records_bytes():
    from planner.graph import NORM_FUSED_BYTES
    from planner.runtimes import RUNTIME_RULES

    tokens, hidden = 512, 4096
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    norm = _TorchtitanEagerRMSNorm(hidden)
    out = []
    fwd = _bytes_moved_per_element(lambda: out.append(norm(x)), tokens * hidden)
    grad = torch.randn_like(out[0])
    bwd = _bytes_moved_per_element(lambda: out[0].backward(grad), tokens * hidden)
    assert (fwd, bwd) == pytest.approx(RUNTIME_RULES["torchtitan@2024-12"].eager_norm_bytes, abs=0.1)
    # the fused kernel the other records price reads the input and writes the output
    assert NORM_FUSED_BYTES == x.element_size() * 2
    for name in ("torchtitan", "megatron", "deepspeed", "nanotron", "torchtitan@compile"):
        assert RUNTIME_RULES[name].eager_norm_bytes is None


def _torchtitan_complex_rope(xq, xk, freqs_cis):
    """torchtitan's apply_rotary_emb (0.3.0 models/common/rope.py ComplexRoPE; 1ea476e9f and
    9dec370 models/llama/model.py), verbatim in its arithmetic; the cache shaped for broadcast."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def test_torchtitans_complex_rope_moves_its_records_bytes():
    """20 bytes a rotated element each way (the cache, read once an op, adds 4 / heads: 0.1 here)."""
    from planner.runtimes import RUNTIME_RULES

    b, s, heads, kv, d = 2, 512, 64, 16, 128
    xq = torch.randn(b, s, heads, d, dtype=torch.bfloat16, requires_grad=True)
    xk = torch.randn(b, s, kv, d, dtype=torch.bfloat16, requires_grad=True)
    angles = torch.outer(torch.arange(s).float(), 1.0 / 500000.0 ** (torch.arange(0, d, 2).float() / d))
    cache = torch.polar(torch.ones_like(angles), angles)
    out = []
    rotated = xq.numel() + xk.numel()
    fwd = _bytes_moved_per_element(lambda: out.append(_torchtitan_complex_rope(xq, xk, cache)), rotated)
    grads = tuple(torch.randn_like(t) for t in out[0])
    bwd = _bytes_moved_per_element(lambda: torch.autograd.backward(out[0], grads), rotated)
    assert (fwd, bwd) == pytest.approx(RUNTIME_RULES["torchtitan"].eager_rope_bytes, abs=0.25)
    for name in ("torchtitan@0.2", "torchtitan@2024-04", "torchtitan@2024-12"):
        assert RUNTIME_RULES[name].eager_rope_bytes == RUNTIME_RULES["torchtitan"].eager_rope_bytes
    for name in ("torchtitan@compile", "torchtitan@2024-12-compiled", "megatron", "deepspeed", "nanotron"):
        assert RUNTIME_RULES[name].eager_rope_bytes is None


def test_eager_swiglu_moves_the_graphs_bytes():
    """torchtitan's and nanotron's silu(gate) * up, forward and backward, per ffn element."""
    from planner.graph import EAGER_SWIGLU_BYTES

    gate = torch.randn(1024, 688, dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn(1024, 688, dtype=torch.bfloat16, requires_grad=True)
    out = []
    fwd = _bytes_moved_per_element(lambda: out.append(F.silu(gate) * up), gate.numel())
    grad = torch.randn_like(out[0])
    bwd = _bytes_moved_per_element(lambda: out[0].backward(grad), gate.numel())
    assert (fwd, bwd) == pytest.approx(EAGER_SWIGLU_BYTES)


def test_repeat_kv_moves_what_the_graph_counts():
    """9dec370's repeat_kv (unsqueeze, expand, reshape: one copy) forward and the sum of the
    gradient back to the KV heads backward, for K: ACT_BYTES for each element of both, each way
    (graph._eager_traffic)."""
    from planner.graph import ACT_BYTES

    b, s, kv, rep, d = 2, 256, 2, 4, 128
    k = torch.randn(b, s, kv, d, dtype=torch.bfloat16, requires_grad=True)
    out = []
    fwd = _bytes_moved_per_element(lambda: out.append(k.unsqueeze(3).expand(b, s, kv, rep, d).reshape(b, s, kv * rep, d)),
                                   b * s)
    grad = torch.randn_like(out[0])
    bwd = _bytes_moved_per_element(lambda: out[0].backward(grad), b * s)
    assert fwd == bwd == ACT_BYTES * (kv * rep + kv) * d


def test_torchs_loss_parallel_peaks_at_the_2024_torchtitan_records_bytes_per_logit(tmp_path):
    """torchtitan 9dec370's and 0.2.x's train step under tp (loss_parallel_enabled; v0.2.2
    train.py, the same test of tp and disable_loss_parallel): the head's output a
    vocabulary-sharded DTensor, cross_entropy of its fp32 cast inside torch's loss_parallel()
    context, forward and backward. One rank on CPU (gloo) runs the same DTensor code path as each
    rank of a tp group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    from planner.runtimes import RUNTIME_RULES

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        def sharded_loss(logits, labels):
            pred = DTensor.from_local(logits, mesh, [Shard(2)])
            return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

        per_logit = _loss_peak_bytes_per_logit(sharded_loss, around=loss_parallel())
    finally:
        dist.destroy_process_group()
    for name in ("torchtitan@2024-12-compiled", "torchtitan@2024-12", "torchtitan@0.2"):
        assert per_logit == pytest.approx(RUNTIME_RULES[name].loss_bytes(8), abs=0.05)
        assert RUNTIME_RULES[name].loss_bytes(1) == RUNTIME_RULES["torchtitan"].loss_bytes_per_logit


def test_torchtitan_03s_own_vocab_parallel_loss_peaks_at_its_records_bytes_per_logit(tmp_path):
    """torchtitan 0.3.0 under tp: its lm_head leaves the logits vocabulary-sharded (models/common/
    decoder_sharding.py: out S(-1)) and cross_entropy_loss runs its own _LossParallelCrossEntropy
    (components/loss.py: the fp32 cast, its log-probabilities saved for backward). One rank on CPU
    (gloo), in a process of its own since 0.3 and the installed 0.2.2 cannot share one."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from runtime_checks import TORCHTITAN_03

    from planner.runtimes import RUNTIME_RULES

    assert TORCHTITAN_03.is_dir(), f"torchtitan 0.3.0 is not installed in {TORCHTITAN_03}: run README's test command"
    script = f"""
import json, sys
sys.path[:0] = [{str(TORCHTITAN_03)!r}, {str(Path(__file__).parent)!r}]
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
from torchtitan.components.loss import _LossParallelCrossEntropy
from test_torch_oracle import _loss_peak_bytes_per_logit
group = dist.group.WORLD
print(json.dumps(_loss_peak_bytes_per_logit(
    lambda logits, labels: _LossParallelCrossEntropy.apply(logits.flatten(0, 1).float(), labels.flatten(0, 1),
                                                           group, logits.shape[-1], "sum"))))
dist.destroy_process_group()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    per_logit = json.loads(done.stdout.strip().splitlines()[-1])
    assert per_logit == pytest.approx(RUNTIME_RULES["torchtitan"].loss_bytes(8), abs=0.05)
    assert RUNTIME_RULES["torchtitan"].loss_bytes(1) == RUNTIME_RULES["torchtitan"].loss_bytes_per_logit


def _loss_traffic_per_logit(loss_fn, batch=1, seq=64, vocab=16000) -> float:
    """HBM bytes per logit element a loss moves, forward and backward, op by op under PyTorch's
    dispatcher: what each op reads (its tensor arguments, an out= one excepted) and writes (its
    results); a gather or scatter (index, index_put_, nll_loss) by its small operands and the
    fresh tensors it writes, as its kernel moves one element a row of the logits. A wide
    vocabulary keeps the per-row statistics (max, sums, labels) below 0.05 bytes a logit."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    n = batch * seq * vocab

    def tensors(x):
        return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not func.is_view:
                reads = tensors((args, {k: v for k, v in kwargs.items() if k != "out"}))
                writes = tensors(out)
                if str(func).startswith(("aten.index.", "aten.index_put", "aten.nll_loss")):
                    reads = [t for t in reads if t.numel() < n]
                    writes = [t for t in writes if not any(t is a for a in tensors(args))]
                Count.total += sum(t.numel() * t.element_size() for t in reads + writes)
            return out

    torch.manual_seed(0)
    logits = torch.randn(batch, seq, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    with Count():
        loss_fn(logits, labels).backward()
    return Count.total / n


def test_torchs_cross_entropy_on_an_fp32_cast_moves_the_torchtitan_records_bytes_per_logit():
    """torchtitan's uncompiled loss (cross_entropy of the logits' fp32 cast)."""
    from planner.runtimes import RUNTIME_RULES

    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
    per_logit = _loss_traffic_per_logit(loss)
    for name in ("torchtitan", "torchtitan@0.2", "torchtitan@2024-12", "torchtitan@2024-12-compiled"):
        assert per_logit == pytest.approx(RUNTIME_RULES[name].loss_traffic_per_logit, abs=0.05)


def test_megatron_cores_vocab_parallel_loss_moves_the_graphs_bytes_per_logit(tmp_path):
    """megatron-core 0.16.0's unfused vocab_parallel_cross_entropy (one tensor-parallel rank, gloo
    on CPU): what the records without a loss of their own price (graph.LOGIT_RW_BYTES)."""
    from planner.graph import LOGIT_RW_BYTES
    from planner.runtimes import RUNTIME_RULES
    per_logit = _on_one_megatron_rank(tmp_path, _loss_traffic_per_logit)
    assert per_logit == pytest.approx(LOGIT_RW_BYTES, abs=0.05)
    # Megatron-DeepSpeed's and nanotron's out-of-place versions move somewhat more; unmeasured, they
    # are priced at megatron-core's
    for name in ("megatron", "deepspeed", "nanotron"):
        assert RUNTIME_RULES[name].loss_traffic_per_logit is None


# --------------------------------------------------------------------------------------------
# torchtitan's per-op selective checkpointing (graph.op_policy)
# --------------------------------------------------------------------------------------------

class _TorchtitanEagerBlock(nn.Module):
    """A Llama block as torchtitan runs it without torch.compile: its FeedForward's eager
    w2(F.silu(w1(x)) * w3(x)) (0.3.0 models/common/feed_forward.py); the norms 0.3's nn.RMSNorm
    (PyTorch's fused CUDA kernel, which RMSNormFn stands in for: on CPU nn.RMSNorm is composite)
    or 9dec370's eager RMSNorm; K and V passed to SDPA with enable_gqa (0.2 on) or expanded by
    9dec370's repeat_kv (unsqueeze, expand, reshape)."""

    def __init__(self, h: int, heads: int, kv_heads: int, f: int, eager_norm: bool, expanded_kv: bool,
                 merged_gate_up: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.d, self.expanded_kv = heads, kv_heads, h // heads, expanded_kv
        self.merged_gate_up = merged_gate_up
        d = self.d
        self.wq, self.wk = nn.Linear(h, heads * d, bias=False), nn.Linear(h, kv_heads * d, bias=False)
        self.wv, self.wo = nn.Linear(h, kv_heads * d, bias=False), nn.Linear(heads * d, h, bias=False)
        self.w1, self.w3, self.w2 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)
        self.n1, self.n2 = (_TorchtitanEagerRMSNorm(h), _TorchtitanEagerRMSNorm(h)) if eager_norm else (RMSNorm(h), RMSNorm(h))

    def forward(self, x):
        b, s, _ = x.shape
        y = self.n1(x)
        q = self.wq(y).view(b, s, self.heads, self.d)
        k = self.wk(y).view(b, s, self.kv_heads, self.d)
        v = self.wv(y).view(b, s, self.kv_heads, self.d)
        if self.expanded_kv:
            rep = self.heads // self.kv_heads
            k = k.unsqueeze(3).expand(b, s, self.kv_heads, rep, self.d).reshape(b, s, self.heads, self.d)
            v = v.unsqueeze(3).expand(b, s, self.kv_heads, rep, self.d).reshape(b, s, self.heads, self.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=not self.expanded_kv)
        x = x + self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))
        y = self.n2(x)
        if self.merged_gate_up:  # nanotron: one gate_up GEMM, split, act(gate) * up
            gate, up = torch.cat([self.w1(y), self.w3(y)], dim=-1).split(self.w1.out_features, dim=-1)
            return x + self.w2(F.silu(gate) * up)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def test_torchtitans_per_op_policy_keeps_what_the_graph_counts():
    """torchtitan's SelectiveAC policy (0.3.0 distributed/activation_checkpoint.py; the same rule
    since 1ea476e9f): save the outputs of the save-list ops, except every second matmul. Run by
    PyTorch's own selective checkpointing on CPU, where SDPA's flash kernel is
    _scaled_dot_product_flash_attention_for_cpu (standing in for the CUDA flash op of the list);
    what it stores, plus the checkpointed input, is what graph.op_policy says the layer keeps."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    h, heads, kv, f, b, s = 256, 8, 2, 688, 2, 128
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    count = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            count[mode] += 1
            if count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    modes = []

    def context_fn():
        modes.append(create_selective_checkpoint_contexts(policy))
        return modes[-1]

    block = _TorchtitanEagerBlock(h, heads, kv, f, eager_norm=False, expanded_kv=False).to(torch.bfloat16).train()
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    out = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    from torch.utils._pytree import tree_leaves
    stored = [leaf.val for entries in modes[0][0].storage.values() for outs in entries.values()
              for leaf in tree_leaves(outs) if isinstance(getattr(leaf, "val", None), torch.Tensor)]
    measured = sum(t.untyped_storage().nbytes() for t in stored) + x.untyped_storage().nbytes()
    assert count["forward"] == 7  # wq, wk, wv, wo, w1, w3, w2: four saved, three recomputed
    spec = ModelSpec(name="llama", layers=1, hidden=h, heads=heads, kv_heads=kv, ffn_hidden=f, vocab=2048,
                     ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=s)
    w = layer_work(build_layers(spec)[0], Ctx(micro_batch=b, seq_len=s, flash=True, recompute="op"))
    assert measured == pytest.approx(w.saved.total, rel=0.02), _ratio(measured, w.saved.total)
    out.sum().backward()  # the recomputation replays the saved outputs and rebuilds the rest
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("runtime", ["torchtitan", "torchtitan@2024-12", "nanotron"])
def test_torchtitans_eager_layer_keeps_what_the_graph_counts(runtime):
    """Without recomputation an eager torchtitan block keeps more than fused kernels would: silu's
    output for the mul (2 bytes a ffn element), 9dec370's eager RMSNorm its fp32 input cast and
    normalised value (4 bytes more an element, both norms), its repeat_kv the expanded K and V.
    nanotron v0.4 splits one gate_up GEMM's output and runs SiLUActivation(gate) * up (its
    TritonRMSNorm and flash attention fused). PyTorch's saved-tensor hooks count it; the graph
    counts it from the runtime's record."""
    from planner.cost.step import layer_ctx
    from planner.runtimes import RUNTIME_RULES
    from planner.spec.training import TrainingSetup

    h, heads, kv, f = H, 8, 2, 688
    rules = RUNTIME_RULES[runtime]
    torch.manual_seed(0)
    block = _TorchtitanEagerBlock(h, heads, kv, f, rules.eager_norm_bytes is not None, rules.expanded_kv,
                                  merged_gate_up=runtime == "nanotron")
    block = block.to(torch.bfloat16).train()
    x = torch.randn(MB, SEQ, h, dtype=torch.bfloat16, requires_grad=True)
    measured, _ = measure_saved(block, lambda: block(x))
    spec = ModelSpec(name="llama", layers=1, hidden=h, heads=heads, kv_heads=kv, ffn_hidden=f, vocab=2048,
                     ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=SEQ)
    setup = TrainingSetup(gpus=1, global_batch=MB, seq_len=SEQ, runtime=runtime)
    ctx = layer_ctx(spec, setup, tp=1, cp=1, ep=1, micro_batch=MB, sequence_parallel=False)
    eager = layer_work(build_layers(spec)[0], ctx).saved.total
    fused = layer_work(build_layers(spec)[0], Ctx(micro_batch=MB, seq_len=SEQ, flash=True)).saved.total
    assert eager > fused and rules.eager_swiglu
    assert measured == pytest.approx(eager, rel=0.01), _ratio(measured, eager)


def _frozen(block: nn.Module) -> nn.Module:
    """`block` with its weights turned into buffers: no weight gradients, whose buffers a
    runtime keeps apart (the gradient states), and none of the tracker's parameter hooks."""
    for module in block.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                del module._parameters[name]
                module.register_buffer(name, param.detach())
    return block


def _backward_extra_bytes(block: nn.Module, x, mode: str) -> int:
    """The most bytes a block's forward and backward hold at once beyond what its forward left
    (its saved tensors, its output and the output's gradient, the seed of its backward):
    torch.distributed._tools.mem_tracker on CPU, the block's weights frozen (_frozen), so the
    figure is activations and their gradients alone. `mode` 'none', 'full' (torch's
    non-reentrant checkpoint) or 'op' (torchtitan's per-op selective policy)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func == torch.ops.aten.mm.default:
            count["recompute" if ctx.is_recompute else "forward"] += 1
            if count["recompute" if ctx.is_recompute else "forward"] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    block = _frozen(block)
    tracker = MemTracker()
    tracker.track_external(x)
    with tracker:
        if mode == "none":
            out = block(x)
        else:
            context = (lambda: create_selective_checkpoint_contexts(policy)) if mode == "op" else None
            out = checkpoint(block, x, use_reentrant=False, **({"context_fn": context} if context else {}))
        seed = torch.ones_like(out)
        left = tracker.get_tracker_snapshot("current")[torch.device("cpu")]
        out.backward(seed)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]

    def total(snapshot):
        return next(v for k, v in snapshot.items() if str(k).endswith("Total"))

    return total(peak) - total(left)


@pytest.mark.parametrize("runtime", ["torchtitan", "torchtitan@2024-12"])
@pytest.mark.parametrize("mode", ["none", "op", "full"])
def test_a_layers_backward_holds_what_the_graph_adds_to_its_saved_bytes(runtime, mode):
    """Beyond what a layer saved, its backward holds its MLP's activation gradients
    (graph.MLP_BACKWARD_GRADS: three ffn-wide tensors under SwiGLU, Work.backward_bytes) and, where
    it recomputes, the rebuilt forward (saved without recomputation less saved with it: the
    rebuild buffer cost/step prices). On torchtitan's eager block, counted by torch's memory
    tracker: exactly the graph's figure without recomputation; with it the graph's sum is over
    the measured peak by less than 30 % (the rebuild buffer counts the whole rebuilt forward,
    which the backward frees as it goes: 24-25 % here at every shape tried)."""
    from dataclasses import replace

    from planner.cost.step import layer_ctx
    from planner.runtimes import RUNTIME_RULES
    from planner.spec.training import TrainingSetup

    h, heads, kv, f, b, s = H, 8, 2, 688, 2, 256
    rules = RUNTIME_RULES[runtime]
    torch.manual_seed(0)
    block = _TorchtitanEagerBlock(h, heads, kv, f, rules.eager_norm_bytes is not None, rules.expanded_kv)
    block = block.to(torch.bfloat16).train()
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    measured = _backward_extra_bytes(block, x, mode)
    spec = ModelSpec(name="llama", layers=1, hidden=h, heads=heads, kv_heads=kv, ffn_hidden=f, vocab=2048,
                     ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=s)
    ctx = layer_ctx(spec, TrainingSetup(gpus=1, global_batch=b, seq_len=s, runtime=runtime), tp=1, cp=1, ep=1,
                    micro_batch=b, sequence_parallel=False)
    layer = build_layers(spec)[0]
    work = layer_work(layer, replace(ctx, recompute=mode))
    rebuilt = layer_work(layer, replace(ctx, recompute="none")).saved.total - work.saved.total
    assert work.backward_bytes == 3 * 2 * b * s * f
    graph = rebuilt + work.backward_bytes
    if mode == "none":
        assert measured == graph, _ratio(measured, graph)
    assert measured <= graph <= measured * 1.3, _ratio(measured, graph)


def test_a_gelu_layers_backward_holds_two_ffn_wide_gradients():
    """Ungated, the MLP's backward holds the output's gradient and the pre-activation's
    (graph.MLP_BACKWARD_GRADS 'gelu'): on a GPT block (torch's gelu and its gelu_backward) at two
    shapes, exactly what the tracker measures beyond the saved bytes."""
    spec = ModelSpec(name="gpt", layers=1, hidden=H, heads=A, kv_heads=A, ffn_hidden=4 * H, vocab=2048,
                     ffn_act="gelu", norm="layernorm", position_embedding="learned", seq_len=256, linear_bias=True)
    for b, s in ((MB, 256), (1, 512)):
        torch.manual_seed(0)
        block = Block(spec, "sdpa").to(torch.bfloat16).train()
        x = torch.randn(b, s, H, dtype=torch.bfloat16, requires_grad=True)
        measured = _backward_extra_bytes(block, x, "none")
        graph = layer_work(build_layers(spec)[0], Ctx(micro_batch=b, seq_len=s, flash=True)).backward_bytes
        assert graph == 2 * 2 * b * s * 4 * H
        assert measured == graph, _ratio(measured, graph)


class _TorchtitanTPAttention(nn.Module):
    """9dec370's Attention with repeat_kv, its head counts read off the local tensors (under
    tensor parallelism each rank holds heads / tp of them)."""

    def __init__(self, h: int, heads: int, kv_heads: int):
        super().__init__()
        self.d, self.rep = h // heads, heads // kv_heads
        self.wq, self.wk = nn.Linear(h, heads * self.d, bias=False), nn.Linear(h, kv_heads * self.d, bias=False)
        self.wv, self.wo = nn.Linear(h, kv_heads * self.d, bias=False), nn.Linear(heads * self.d, h, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.d) for w in (self.wq, self.wk, self.wv))
        kv = k.shape[2]
        k = k.unsqueeze(3).expand(b, s, kv, self.rep, self.d).reshape(b, s, kv * self.rep, self.d)
        v = v.unsqueeze(3).expand(b, s, kv, self.rep, self.d).reshape(b, s, kv * self.rep, self.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))


class _TorchtitanTPFeedForward(nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _TorchtitanTPBlock(nn.Module):
    """9dec370's TransformerBlock uncompiled (eager RMSNorm, SwiGLU and repeat_kv), its modules
    named as apply_tp's plan names them."""

    def __init__(self, h: int, heads: int, kv_heads: int, f: int):
        super().__init__()
        self.attention_norm, self.ffn_norm = _TorchtitanEagerRMSNorm(h), _TorchtitanEagerRMSNorm(h)
        self.attention, self.feed_forward = _TorchtitanTPAttention(h, heads, kv_heads), _TorchtitanTPFeedForward(h, f)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def _saved_under_torchtitans_tp(rank: int, world: int, store: str, h: int, heads: int, kv_heads: int, f: int,
                                vocab: int) -> dict:
    """Bytes autograd saves on one rank of a tp group of `world` (gloo on CPU) for a block and for
    the final norm with the LM head, parallelized by the plan torchtitan 9dec370's apply_tp gives
    them under sequence parallelism (parallelisms/parallelize_llama.py): SequenceParallel norms,
    PrepareModuleInput from Shard(1) to Replicate before the column-parallel linears, the
    row-parallel ones back to Shard(1); the head column-parallel from a Shard(1) input to
    vocabulary-sharded logits. Parameters excluded; DTensors counted by their local tensors."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module)

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        torch.manual_seed(0)
        block = _TorchtitanTPBlock(h, heads, kv_heads, f).to(torch.bfloat16)
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(), "attention": gather,
            **{f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")},
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(), "feed_forward": gather,
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
        head = nn.ModuleDict({"norm": RMSNorm(h), "output": nn.Linear(h, vocab, bias=False)}).to(torch.bfloat16)
        parallelize_module(head, mesh, {"norm": SequenceParallel(), "output": ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})

        def local(t):
            return t._local_tensor if isinstance(t, DTensor) else t

        def saved(module, fn):
            params = _storages(local(p) for p in module.parameters())
            seen = {}

            def pack(t):
                st = local(t).untyped_storage()
                if st.data_ptr() not in params:
                    seen.setdefault(st.data_ptr(), st.nbytes())
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = fn()
            (out.to_local() if isinstance(out, DTensor) else out).float().sum().backward()
            return sum(seen.values())

        x = torch.randn(MB, SEQ // world, h, dtype=torch.bfloat16, requires_grad=True)
        return {"block": saved(block, lambda: block(x)),
                "head": saved(head, lambda: head["output"](head["norm"](x)))}
    finally:
        dist.destroy_process_group()


def test_torchtitans_sequence_parallelism_keeps_the_gathered_gemm_inputs(tmp_path):
    """Under torchtitan's tensor parallelism (DTensor's) the QKV, first MLP and LM-head linears
    keep the all-gathered norm output, tokens x hidden, where Megatron's keep the sequence shard:
    two CPU ranks (gloo) run 9dec370's plan, PyTorch's saved-tensor hooks count what one keeps,
    and the graph counts it from the record (RuntimeRules.sp_saves_gathered)."""
    import json
    import subprocess
    import sys
    from dataclasses import replace
    from pathlib import Path

    from planner.cost.step import layer_ctx
    from planner.runtimes import RUNTIME_RULES
    from planner.spec.training import TrainingSetup

    h, heads, kv, f, vocab, tp = H, 8, 4, 688, 2048, 2
    args = f"{tmp_path / 'store'!s}', {h}, {heads}, {kv}, {f}, {vocab}"
    script = ("import json, sys; sys.path.insert(0, {tests!r}); from test_torch_oracle import "
              "_saved_under_torchtitans_tp as run; print(json.dumps(run({rank}, {tp}, '{args})))")
    ranks = [subprocess.Popen([sys.executable, "-c", script.format(tests=str(Path(__file__).parent), rank=r,
                                                                      tp=tp, args=args)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(tp)]
    outs = [r.communicate(timeout=300) for r in ranks]
    assert all(r.returncode == 0 for r in ranks), [err for _, err in outs]
    measured = json.loads(outs[0][0].strip().splitlines()[-1])

    spec = ModelSpec(name="llama", layers=1, hidden=h, heads=heads, kv_heads=kv, ffn_hidden=f, vocab=vocab,
                     ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", seq_len=SEQ)
    assert not RUNTIME_RULES["megatron"].sp_saves_gathered
    setup = TrainingSetup(gpus=tp, global_batch=MB, seq_len=SEQ, runtime="torchtitan@2024-12")
    ctx = layer_ctx(spec, setup, tp=tp, cp=1, ep=1, micro_batch=MB, sequence_parallel=True)
    counted = {}
    for keeps in (True, False):
        at = replace(ctx, sp_saves_gathered=keeps)
        head = head_work(spec, at)
        counted[keeps] = (layer_work(build_layers(spec)[0], at).saved.total,
                          head.saved_bytes - LOGIT_SAVED_BYTES * head.logits)
    assert ctx.sp_saves_gathered
    block, head = counted[True]
    assert measured["block"] == pytest.approx(block, rel=0.01), _ratio(measured["block"], block)
    assert measured["head"] == pytest.approx(head, rel=0.01), _ratio(measured["head"], head)
    # what keeping the shard (Megatron's way) would save instead: a gathered copy is tp shards
    shard = 2 * MB * SEQ * h / tp
    assert block - counted[False][0] == pytest.approx(2 * (tp - 1) * shard)
    assert head - counted[False][1] == pytest.approx((tp - 1) * shard)


def test_gradient_accumulation_passes_move_their_records_bytes():
    """What accumulating one micro-batch's gradients costs per parameter outside the GEMMs
    (RuntimeRules.grad_accum_bytes): DeepSpeed's BF16_Optimizer.update_hp_grads, verbatim in its
    arithmetic (microsoft/DeepSpeed 56c522386 and 38327e07f bf16_optimizer.py: a cast of the bf16
    gradient, then an fp32 add), and autograd adding a second backward's gradient into a 16-bit
    .grad (Megatron-LM of April 2021: the first backward's is stolen, each later one added)."""
    from planner.runtimes import RUNTIME_RULES

    n = 1 << 16
    lp_grad = torch.randn(n, dtype=torch.bfloat16)
    hp_grad = torch.zeros(n, dtype=torch.float32)
    update = _bytes_moved_per_element(lambda: hp_grad.data.add_(lp_grad.data.to(hp_grad.dtype).view(hp_grad.shape)), n)
    assert update == RUNTIME_RULES["deepspeed"].grad_accum_bytes_of("bf16", 1)

    linear = nn.Linear(256, 256, bias=False).half()
    x = torch.randn(64, 256, dtype=torch.float16)
    first = _bytes_moved_per_element(lambda: linear(x).sum().backward(), linear.weight.numel())
    second = _bytes_moved_per_element(lambda: linear(x).sum().backward(), linear.weight.numel())
    for precision in ("fp16", "bf16"):
        assert second - first == RUNTIME_RULES["megatron@2021"].grad_accum_bytes_of(precision, 0)
    for name in ("megatron", "megatron@2022", "torchtitan", "composer", "deepspeed@2021"):
        assert RUNTIME_RULES[name].grad_accum_bytes == ()
