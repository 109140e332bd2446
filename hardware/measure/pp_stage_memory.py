"""Measure what PyTorch's caching allocator reserves beyond what it allocates for a rank of a
1F1B pipeline under FSDP2, on one GPU: the gap torchtitan's pipelined Llama 3.1 405B rows leave
(README, "Where the model is weakest": 82.5 GiB of logged max_reserved with 1F1B where the
buffers add to 57-61 GiB, and 75.3 GiB for the 32k x 1 shape of equal bytes).

Run on a GPU (PyTorch with CUDA; nothing else):

    python hardware/measure/pp_stage_memory.py > pp_stage_memory_<gpu>.json

The stage: LAYERS decoder layers at one rank's shapes of Llama 3.1 405B under tp 8 with sequence
parallelism (hidden 16384; 16 query heads and 1 key/value head of 128, the key/value expanded to
every query head as torchtitan 9dec370's repeat_kv does; SwiGLU FFN 6656; eager RMSNorm; no
RoPE), the sequence-parallel all-gather and reduce-scatter stood in by a concatenation and a sum
of the same sizes; the first rank has the vocabulary shard of the embedding (16032 rows), the
last the final norm, the output layer's shard and torchtitan's loss (cross entropy of the fp32
logits). FSDP2 on a one-rank mesh with torchtitan 9dec370's pipelined settings (each block a
unit, then the root; bf16 parameters, fp32 gradient reduction, reshard_after_forward False),
each layer under full activation checkpointing. A step runs the micro-batches in the order
torch.distributed.pipelining's Schedule1F1B gives the rank (one_f_one_b), runs each backward as
that library's stage does under FSDP2 (backward: gradient sync, resharding and the last-backward
flag off, so FSDP2 keeps the bf16 weights and accumulates unsharded fp32 gradients; after the
last, every FSDP state's post-backward), keeps every stage output to the step's end and a
receive buffer per micro-batch across steps (torch 2.6 stage.py output_chunks,
_prepare_forward_infra, _prepare_backward_infra), then sets the gradients to None as an
optimizer's zero_grad does (no optimizer runs: on one rank its states would be 8 times the
sharded ones the published runs hold).

GPU_RUNS, each in a process of its own (PYTORCH_CUDA_ALLOC_CONF is read when CUDA initialises):
the first rank's stage at torchtitan's two shapes of a micro-batch (4 x 8192 and 1 x 32768 tokens)
under two allocator settings (the default, and expandable_segments:True that torchtitan's
single-node run_llama_train.sh sets and its multinode_trainer.slurm does not), and its two
interleaved chunks (Table 5's other schedule) under the default; per step
max_memory_allocated and max_memory_reserved, the allocation and reserve after the warm-up
forwards, the allocator's retries in the step and its peak inactive split bytes.
reserved - allocated is what the cost model does not price; allocated is what it does. Prints one
JSON document, also when a run fails or runs out of time (that run's entry says so).

With VPP > 1 (--dims) the rank holds VPP chunks of LAYERS / VPP layers, the model's stages rank,
rank + PP, ..., each its own FSDP2 root, run in ScheduleInterleaved1F1B's order (interleaved_1f1b).

On a CPU (--device cpu) a run takes TINY's shape, or the one --dims JSON gives (its keys: those
of TINY, RANK and VPP among them), and counts the tensors that live with torch's MemTracker
(max_tracked_bytes): tests/test_measure_scripts.py compares that with the memory model's price of
the same stage.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
import time

GPU_DIMS = {"TP": 8, "HIDDEN": 16384, "HEADS": 16, "KV_HEADS": 1, "HEAD_DIM": 128, "FFN": 6656, "VOCAB": 16032,
            "LAYERS": 8, "PP": 8, "VPP": 1, "RANK": 0, "MICROBATCHES": 8, "STEPS": 2}
"""one rank's shapes of Llama 3.1 405B (hidden 16384, 128 heads, 8 KV heads, FFN 53248, vocab
128256) under tensor parallelism 8, on the first of 8 pipeline ranks (VPP chunks of it with an
interleaved schedule), 8 micro-batches a step"""
SHAPES = {"8k-x4": (4, 8192), "32k-x1": (1, 32768)}
"""(micro-batch, sequence) of torchtitan's Table 5 (local batch 32 over 8 micro-batches of 8192
tokens) and Table 6 (local batch 8 of 32768)"""
ALLOCATORS = {"default": "", "expandable": "expandable_segments:True"}
GPU_RUNS = (("8k-x4", "default", {}), ("8k-x4", "expandable", {}), ("8k-x4", "default", {"VPP": 2}),
            ("32k-x1", "default", {}), ("32k-x1", "expandable", {}))
"""(shape, allocator, dims overrides) of the GPU runs, the most telling first: the budget may cut
the last"""
TINY = {**GPU_DIMS, "TP": 2, "HIDDEN": 64, "HEADS": 4, "HEAD_DIM": 16, "FFN": 96, "VOCAB": 128, "LAYERS": 2,
        "PP": 4, "MICROBATCHES": 4, "MICRO_BATCH": 2, "SEQ": 16}
"""a shape small enough for a CPU (--device cpu; --dims JSON overrides any of its keys), where the
tensors that live are counted by torch's MemTracker instead of the caching allocator"""
BUDGET_S = 210
"""seconds the GPU runs may take in all (all.sh gives the script 230): a run gets what is left; one
takes about 40 s on an H200 (two steps of 8 micro-batches through 8 layers, about 27 TFLOP a
layer's forward), so the five GPU_RUNS fit"""


def one_f_one_b(pp: int, rank: int, microbatches: int) -> list[tuple[str, int]]:
    """Schedule1F1B's order of forwards ('F', i) and backwards ('B', i) on stage `rank` of `pp`:
    min(microbatches, pp - rank) forwards first, then one backward and one forward until the
    forwards are done, then the remaining backwards (torch 2.6 distributed/pipelining/schedules.py
    Schedule1F1B._step_microbatches, warmup_chunks)."""
    warm = min(microbatches, pp - rank)
    order = [("F", i) for i in range(warm)]
    forwards = warm
    for b in range(microbatches):
        order.append(("B", b))
        if forwards < microbatches:
            order.append(("F", forwards))
            forwards += 1
    return order


def interleaved_1f1b(pp: int, rank: int, microbatches: int, chunks: int) -> list[tuple[str, int, int]]:
    """ScheduleInterleaved1F1B's order on rank `rank` of `pp` holding `chunks` model chunks (the
    stages rank, rank + pp, ...): ('F' or 'B', local chunk, micro-batch). The rank's k-th forward
    runs chunk (k // pp) % chunks on micro-batch (k // (pp chunks)) pp + k % pp, its k-th backward
    the chunks in reverse; min(all, (chunks - 1) pp + 2 (pp - 1 - rank)) forwards first, then one
    forward and one backward until the forwards are done, then the remaining backwards (torch
    distributed/pipelining/schedules.py ScheduleInterleaved1F1B, warmup_ops; microbatches a
    multiple of pp, as that schedule requires)."""
    def op(kind, k):
        chunk = (k // pp) % chunks
        return kind, chunk if kind == "F" else chunks - 1 - chunk, (k // (pp * chunks)) * pp + k % pp

    total = chunks * microbatches
    warm = min(total, (chunks - 1) * pp + 2 * (pp - 1 - rank))
    order = [op("F", k) for k in range(warm)]
    for k in range(total - warm):
        order += [op("F", warm + k), op("B", k)]
    return order + [op("B", k) for k in range(total - warm, total)]


def stage_dims(shape: str, device: str, overrides: dict | None = None) -> dict:
    """The run's dimensions: GPU_DIMS at SHAPES[shape] on a GPU, TINY on a CPU, with `overrides`
    (only TINY's keys; RANK within the pipeline)."""
    if device == "cuda" and shape not in SHAPES:
        raise SystemExit(f"--child: a GPU run's shape is one of {', '.join(SHAPES)}, got {shape!r}")
    base = dict(GPU_DIMS, MICRO_BATCH=SHAPES[shape][0], SEQ=SHAPES[shape][1]) if device == "cuda" else dict(TINY)
    unknown = sorted(set(overrides or {}) - set(TINY))
    if unknown:
        raise SystemExit(f"--dims: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(sorted(TINY))}")
    dims = {**base, **(overrides or {})}
    if not 0 <= dims["RANK"] < dims["PP"]:
        raise SystemExit(f"--dims: RANK must be a pipeline rank, 0 to PP - 1 = {dims['PP'] - 1}, got {dims['RANK']}")
    if dims["VPP"] > 1 and (dims["LAYERS"] % dims["VPP"] or dims["MICROBATCHES"] % dims["PP"]):
        raise SystemExit("--dims: with VPP > 1, LAYERS must divide into VPP chunks and MICROBATCHES be a multiple of "
                         f"PP (ScheduleInterleaved1F1B), got LAYERS {dims['LAYERS']}, VPP {dims['VPP']}, "
                         f"MICROBATCHES {dims['MICROBATCHES']}, PP {dims['PP']}")
    return dims


def _modules(torch, nn, F, checkpoint, dims):
    from torchtitan_ops import rms_norm  # beside this script, on sys.path when it runs

    tp, hidden, heads, kv, hd, ffn = (dims[k] for k in ("TP", "HIDDEN", "HEADS", "KV_HEADS", "HEAD_DIM", "FFN"))
    RMSNorm = rms_norm(torch, nn, hidden)

    def gather(t):  # the sequence-parallel all-gather: a [b, s/tp, h] shard to [b, s, h]
        return torch.cat([t] * tp, dim=1)

    def scatter(t):  # the reduce-scatter back to the shard
        b, s, h = t.shape
        return t.view(b, tp, s // tp, h).sum(1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.wq = nn.Linear(hidden, heads * hd, bias=False)
            self.wk = nn.Linear(hidden, kv * hd, bias=False)
            self.wv = nn.Linear(hidden, kv * hd, bias=False)
            self.wo = nn.Linear(heads * hd, hidden, bias=False)
            self.w1 = nn.Linear(hidden, ffn, bias=False)
            self.w3 = nn.Linear(hidden, ffn, bias=False)
            self.w2 = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            h = gather(self.attention_norm(x))
            b, s, _ = h.shape
            q = self.wq(h).view(b, s, heads, hd).transpose(1, 2)
            k, v = (w(h).view(b, s, kv, hd).repeat_interleave(heads // kv, dim=2).transpose(1, 2)
                    for w in (self.wk, self.wv))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, heads * hd)
            x = x + scatter(self.wo(o))
            h = gather(self.ffn_norm(x))
            return x + scatter(self.w2(F.silu(self.w1(h)) * self.w3(h)))

    class Embedding(nn.Module):  # the vocabulary shard; rows outside it give zeros, summed over tp
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(dims["VOCAB"], hidden)

        def forward(self, tokens):
            return scatter(self.table(tokens))

    class Head(nn.Module):  # the final norm and the vocabulary shard of the output layer: the logits
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm()
            self.output = nn.Linear(hidden, dims["VOCAB"] // tp, bias=False)

        def forward(self, x):
            return self.output(gather(self.norm(x)))

    class Stage(nn.Module):  # a pipeline rank's chunk of the model, each layer checkpointed whole
        def __init__(self, first: bool, last: bool):
            super().__init__()
            self.embedding = Embedding() if first else None
            self.layers = nn.ModuleList(Layer() for _ in range(dims["LAYERS"]))
            self.head = Head() if last else None

        def forward(self, x):
            x = x if self.embedding is None else self.embedding(x)
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False)
            return x if self.head is None else self.head(x)

    return Stage


def _fsdp(torch):
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _pipelined_backward(fully_shard, stage, loss_or_output, grad, last: bool) -> None:
    """One micro-batch's backward as torch.distributed.pipelining's stage runs it under FSDP2
    (torch 2.6 stage.py backward_maybe_with_nosync; 2.13 splits the last part into
    perform_reduce_grad): gradient sync, post-backward resharding and the last-backward flag off,
    so FSDP2 keeps the bf16 weights and accumulates unsharded fp32 gradients; after the `last`,
    each FSDP state's post_backward (its reduce-scatter) by hand and the root's final callback."""
    stage.set_is_last_backward(False)
    stage.set_reshard_after_backward(False)
    stage.set_requires_gradient_sync(False)
    loss_or_output.backward(grad)
    if not last:
        return
    stage.set_is_last_backward(True)
    stage.set_reshard_after_backward(True)
    stage.set_requires_gradient_sync(True)
    root = fully_shard.state(stage)
    for state in root._state_ctx.all_states:
        groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.8 and later: a list
        for group in groups if groups is not None else [state._fsdp_param_group]:
            if group is not None:
                group.post_backward()
    root._root_post_backward_final_callback()


def _cpu_tracker(torch):
    """torch's MemTracker counting every tensor that lives, without its per-module statistics
    (it refuses a module called more than once while it tracks, and a stage calls each layer once
    per micro-batch)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):
        def _pre_fw_hook(self, *args, **kwargs):
            pass

        _post_fw_hook = _pre_bw_hook = _post_bw_hook = _pre_fw_hook

        def peak_bytes(self):
            return self.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    return StepTracker()


def child(shape: str, device: str, overrides: dict | None = None) -> dict:
    """One allocator setting (the environment's), one micro-batch shape and one pipeline rank
    (stage_dims): the readings of each of its STEPS steps."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.checkpoint import checkpoint

    dims = stage_dims(shape, device, overrides)
    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(device, (1,))
    fully_shard, policy = _fsdp(torch)
    rank, pp, m, vpp = dims["RANK"], dims["PP"], dims["MICROBATCHES"], dims["VPP"]
    # chunk c of this rank is the model's stage rank + c pp (torchtitan's looped schedules), each
    # its own FSDP2 root as torchtitan parallelizes every model part
    stages = [rank + c * pp for c in range(vpp)]
    Stage = _modules(torch, nn, F, checkpoint, {**dims, "LAYERS": dims["LAYERS"] // vpp})
    with torch.device(device):
        chunks = [Stage(s == 0, s == pp * vpp - 1) for s in stages]
    for chunk in chunks:
        for unit in (*chunk.layers, chunk):  # torchtitan 9dec370 apply_fsdp: each block, then the root
            fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=False)

    micro_batch, seq = dims["MICRO_BATCH"], dims["SEQ"]
    shard = (micro_batch, seq // dims["TP"], dims["HIDDEN"])
    # each chunk's receive buffers, one a micro-batch, kept across steps: the output's gradient
    # where another stage follows, the input (and the gradient it gets) where another precedes
    grad_recv = [[] if s == pp * vpp - 1 else [torch.empty(shard, device=device, dtype=torch.bfloat16)
                                              for _ in range(m)] for s in stages]
    input_recv = [[] if s == 0 else [torch.empty(shard, device=device, dtype=torch.bfloat16, requires_grad=True)
                                    for _ in range(m)] for s in stages]
    order = ([(kind, 0, i) for kind, i in one_f_one_b(pp, rank, m)] if vpp == 1
             else interleaved_1f1b(pp, rank, m, vpp))

    def reading(name):
        return {f"{name}_allocated_bytes": torch.cuda.memory_allocated(),
                f"{name}_reserved_bytes": torch.cuda.memory_reserved()} if cuda else {}

    def step():
        retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if cuda else 0
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        tokens = [torch.randint(0, dims["VOCAB"], (micro_batch, seq), device=device) for _ in range(m)]
        tracker = contextlib.nullcontext() if cuda else _cpu_tracker(torch)
        if not cuda:
            tracker.track_external(*chunks, *(t for c in range(vpp) for t in grad_recv[c] + input_recv[c]), *tokens)
        pending, outputs, ran, out = {}, [], [], {}
        with tracker:
            for n, (kind, c, i) in enumerate(order):
                ran.append(f"{stages[c]}{kind}{i}")
                first, last = stages[c] == 0, stages[c] == pp * vpp - 1
                if kind == "F":
                    if not first:
                        with torch.no_grad():
                            input_recv[c][i].normal_()  # the received activation
                    y = chunks[c](tokens[i] if first else input_recv[c][i])
                    outputs.append(y)  # output_chunks: every output kept to the step's end
                    if last:  # torchtitan 9dec370's loss: cross entropy of the fp32 logits
                        labels = tokens[i].flatten() % y.shape[-1]  # within the vocabulary shard
                        pending[c, i] = F.cross_entropy(y.flatten(0, 1).float(), labels)
                    else:
                        pending[c, i] = y
                    if n + 1 < len(order) and order[n + 1][0] == "B" and not out:
                        out.update(reading("after_warmup"))
                else:
                    if not last:
                        grad_recv[c][i].normal_()  # the received gradient
                    _pipelined_backward(fully_shard, chunks[c], pending.pop((c, i)), None if last else grad_recv[c][i],
                                        i == m - 1)
            del outputs
        if not cuda:
            out["max_tracked_bytes"] = tracker.peak_bytes()
        for p in (p for chunk in chunks for p in chunk.parameters()):
            p.grad = None
        if cuda:
            torch.cuda.synchronize()
            stats = torch.cuda.memory_stats()
            out.update({"max_allocated_bytes": torch.cuda.max_memory_allocated(),
                        "max_reserved_bytes": torch.cuda.max_memory_reserved(),
                        "alloc_retries": stats.get("num_alloc_retries", 0) - retries,
                        "peak_inactive_split_bytes": stats.get("inactive_split_bytes.all.peak", 0)})
        out["ran"] = " ".join(ran)
        out["wall_s"] = time.perf_counter() - start
        return out

    steps = [step() for _ in range(dims["STEPS"])]
    params = sum(p.numel() for chunk in chunks for p in chunk.parameters())
    dist.destroy_process_group()
    return {"shape": shape, "dims": dims, "params": params, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "steps": steps}


def measure(device: str) -> dict:
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pp_stage_memory.py measures a GPU: no CUDA device is visible (--device cpu tries it)")
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda, "date": datetime.date.today().isoformat(),
           "script": "hardware/measure/pp_stage_memory.py", "runs": []}
    # a CPU has no caching allocator to set: one run there
    runs = GPU_RUNS if device == "cuda" else (("tiny", "default", {}),)
    began = time.perf_counter()
    for shape, name, overrides in runs:
        conf = ALLOCATORS[name]
        left = BUDGET_S - (time.perf_counter() - began)
        if left < 10:
            out["runs"].append({"shape": shape, "allocator": name, "error": "skipped: out of time"})
            continue
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        try:
            run = subprocess.run([sys.executable, __file__, "--child", shape, "--device", device,
                                  "--dims", json.dumps(overrides)], env=env, capture_output=True, text=True,
                                 timeout=left)
            row = json.loads(run.stdout) if run.returncode == 0 else {
                "shape": shape, "error": f"rc {run.returncode}: {(run.stderr or run.stdout)[-400:]}"}
        except subprocess.TimeoutExpired:
            row = {"shape": shape, "error": f"stopped after {left:.0f} s: out of time"}
        except json.JSONDecodeError:
            row = {"shape": shape, "error": f"no JSON: {run.stdout[-400:]}"}
        out["runs"].append({"allocator": name, **row})
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    where = args[args.index("--device") + 1] if "--device" in args else "cuda"
    if "--child" in args:
        dims = json.loads(args[args.index("--dims") + 1]) if "--dims" in args else None
        json.dump(child(args[args.index("--child") + 1], where, dims), sys.stdout)
    else:
        json.dump(measure(where), sys.stdout, indent=1)
    print()
