"""torchtitan 0.3 job of a planner plan: llama3-8b on 16 GPUs (2 node(s) of 8), bf16.
Checked against torchtitan 0.3.0 (ConfigManager, ParallelDims, llama3 model_registry).

Save as planner_job.py and run on every node, NODE_RANK (0..1) and MASTER_ADDR (node 0) set:
  PYTHONPATH=. torchrun --nproc-per-node 8 --nnodes 2 --node-rank "${NODE_RANK:-0}" \
    --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" \
    -m torchtitan.train --module planner_job --config planner_job
You supply, as overrides after it: the Hugging Face assets and tokenizer (--hf-assets-path), the
data (--dataloader.dataset, --dataloader.dataset-path), steps (--training.steps), the learning rate
(--optimizer.*) and checkpoints (--checkpoint.*); until then torchtitan's llama3_8b recipe values stand.
"""

from torchtitan.config import CompileConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def planner_job():
    config = llama3_8b()
    config.model_spec = model_registry('8B', attn_backend='varlen')
    config.training.local_batch_size = 16
    config.training.global_batch_size = 64
    config.training.seq_len = 8192
    config.training.mixed_precision_param = 'bfloat16'
    config.training.disable_cuda_graphs = True
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 4
    config.parallelism.fsdp_reshard_after_forward = 'always'
    config.parallelism.tensor_parallel_degree = 2
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 2
    config.parallelism.pipeline_parallel_schedule = 'Interleaved1F1B'
    config.parallelism.pipeline_parallel_microbatch_size = 1
    config.parallelism.module_fqns_per_model_part = [
        ['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6', 'layers.7'],
        ['layers.8', 'layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14', 'layers.15'],
        ['layers.16', 'layers.17', 'layers.18', 'layers.19', 'layers.20', 'layers.21', 'layers.22', 'layers.23'],
        ['layers.24', 'layers.25', 'layers.26', 'layers.27', 'layers.28', 'layers.29', 'layers.30', 'layers.31', 'norm', 'lm_head'],
    ]
    config.activation_checkpoint = FullAC.Config()
    config.compile = CompileConfig(enable=False)
    return config
