"""Every model preset reproduces its published total parameter count to within 1 %.

The count is the main model only: DeepSeek-V3's multi-token-prediction module is left out, as in
the report's "671B total". Exact figures are Hugging Face safetensors totals where they exist.
"""

import pytest

from planner.graph import model_params
from planner.spec.model import load_model

PUBLISHED = [
    # (preset, total parameters, where the number comes from)
    ("gpt3-175b", 175_000_000_000, "Brown et al. 2020, Table 2.1: 175.0B"),
    ("llama2-7b", 6_738_415_616, "meta-llama/Llama-2-7b-hf safetensors total"),
    ("llama2-70b", 68_976_648_192, "meta-llama/Llama-2-70b-hf safetensors total"),
    ("llama3-8b", 8_030_261_248, "HF safetensors total of Llama-3.1-8B (same shapes as Llama-3-8B)"),
    ("llama3-70b", 70_553_706_496, "HF safetensors total of Llama-3.1-70B (same shapes as Llama-3-70B)"),
    ("llama3-405b", 405_853_388_800, "meta-llama/Llama-3.1-405B safetensors total"),
    ("mixtral-8x7b", 46_702_792_704, "mistralai/Mixtral-8x7B-v0.1 safetensors total (model card: 46.7B)"),
    ("deepseek-v3", 671_000_000_000, "DeepSeek-V3 report: 671B total without MTP (HF 685B includes the MTP module)"),
    ("qwen2.5-72b", 72_700_000_000, "Qwen/Qwen2.5-72B model card: 72.7B"),
    ("bert-large", 335_141_888, "google-bert/bert-large-uncased as HF BertModel (includes pooler)"),
]


@pytest.mark.parametrize("preset, published, source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_preset_matches_published_parameter_count(preset, published, source):
    counted = model_params(load_model(preset))
    assert abs(counted - published) / published <= 0.01, (
        f"{preset}: {counted:,} parameters vs {published:,} published ({source})")
