"""The largest inputs the planner answers (issue 13): beyond each, a one-line refusal that names
the limit, never a hang, an overflow or a traceback. Each is at least what the largest published
training runs and their planning need, with room to spare.
"""

from __future__ import annotations

MAX_GPUS = 1_000_000
"""GPUs of one plan (planned in about 3 s)"""
MAX_LAYERS = 10_000
"""layers of a model (a chain this deep plans in under a minute)"""
MAX_SEQ_LEN = 1_048_576
"""tokens of one sequence"""
MAX_GLOBAL_BATCH = 16_777_216
"""sequences of one step (16M: beyond any published run, whose batches are a few thousand)"""
MAX_TOKENS = 1e16
"""tokens (or steps) of one forecast run: 10,000 trillion, over 300 times Llama 3's 15.6T"""
MAX_SWEEP_COUNTS = 1_100
"""GPU counts of one sweep"""
MAX_INT = 2**53
"""any other integer of a spec or an option (model widths, vocabulary, experts, degrees): exact
as a float, so that no product of them overflows the cost model's arithmetic"""
MAX_FILE_BYTES = 64 * 2**20
"""size of a spec, plan or runs file read"""
MAX_DEPTH = 64
"""nesting of a spec or plan document (mappings and lists within each other)"""
MAX_NODES = 1_000_000
"""values in one document, aliases expanded (a YAML alias bomb stops here)"""
