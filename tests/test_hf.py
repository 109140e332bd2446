"""Hugging Face config.json -> ModelSpec (planner.spec.hf).

Fixtures in tests/data/hf/ are the config.json files of these Hub checkpoints. The Hub was not
reachable from where they were written, so each file was transcribed, and its values were checked
against copies of the same file quoted in public code where such a copy was found:

  file                     checkpoint                      checked against a quoted copy
  llama3-8b.json           meta-llama/Meta-Llama-3-8B      yes (the -Instruct copy; differs in eos_token_id)
  mistral-7b-v0.1.json     mistralai/Mistral-7B-v0.1       sizes, except intermediate_size
  mixtral-8x7b.json        mistralai/Mixtral-8x7B-v0.1     NO: transcribed only
  qwen2.5-7b.json          Qwen/Qwen2.5-7B                 yes
  qwen3-8b.json            Qwen/Qwen3-8B                   sizes; not max_position_embeddings (40960)
  qwen1.5-moe-a2.7b.json   Qwen/Qwen1.5-MoE-A2.7B          sizes; not max_position_embeddings (8192
                                                           here, 32768 in one copy); key order not the Hub's
  qwen3-30b-a3b.json       Qwen/Qwen3-30B-A3B              sizes
  qwen3-235b-a22b.json     Qwen/Qwen3-235B-A22B            sizes (qwen3-30b-a3b.json's keys, its sizes changed)
  deepseek-v3.json         deepseek-ai/DeepSeek-V3         yes (via DeepSeek-R1's identical architecture)
  gpt2.json                openai-community/gpt2           sizes (GPT2Config's defaults are gpt2's)
  pythia-1b.json           EleutherAI/pythia-1b            only the values all Pythia sizes share
  bloom-560m.json          bigscience/bloom-560m           yes
  opt-1.3b.json            facebook/opt-1.3b               first keys only; sizes transcribed
  bert-large-uncased.json  google-bert/bert-large-uncased  NO: transcribed only

Where an unchecked max_position_embeddings is >= 8192 the expected seq_len (the 8192 cap) does not
depend on it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.errors import SpecError
from planner.spec import hf
from planner.spec.hf import to_spec_dict
from planner.spec.model import MlaSpec, ModelSpec, MoeSpec, load_model

DATA = Path(__file__).parent / "data" / "hf"


def read(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def convert(config: dict, where: str = "config.json") -> ModelSpec:
    return ModelSpec.from_dict(to_spec_dict(config, where), where)


# file: (layers, hidden, heads, kv_heads, head_dim, ffn_hidden, vocab, other expected fields)
EXPECTED = {
    "llama3-8b.json": (32, 4096, 32, 8, 128, 14336, 128256, dict(
        ffn_act="swiglu", norm="rmsnorm", position_embedding="rope", tied_embeddings=False,
        linear_bias=False, seq_len=8192, dropout=0.0, rope_theta=500000.0, norm_eps=1e-5)),
    "mistral-7b-v0.1.json": (32, 4096, 32, 8, 128, 14336, 32000, dict(seq_len=8192, name="mistral")),
    "mixtral-8x7b.json": (32, 4096, 32, 8, 128, 14336, 32000, dict(
        moe=MoeSpec(experts=8, top_k=2, expert_ffn_hidden=14336, shared_ffn_hidden=14336), rope_theta=1e6)),
    "qwen2.5-7b.json": (28, 3584, 28, 4, 128, 18944, 152064, dict(seq_len=8192, tied_embeddings=False)),
    "qwen3-8b.json": (36, 4096, 32, 8, 128, 12288, 151936, dict(seq_len=8192)),
    "qwen1.5-moe-a2.7b.json": (24, 2048, 16, 16, 128, 5632, 151936, dict(
        moe=MoeSpec(experts=60, top_k=4, expert_ffn_hidden=1408, shared_experts=1, shared_ffn_hidden=5632))),
    # explicit head_dim 128, not hidden / heads = 64
    "qwen3-30b-a3b.json": (48, 2048, 32, 4, 128, 6144, 151936, dict(
        moe=MoeSpec(experts=128, top_k=8, expert_ffn_hidden=768, shared_ffn_hidden=768))),
    "qwen3-235b-a22b.json": (94, 4096, 64, 4, 128, 12288, 151936, dict(
        moe=MoeSpec(experts=128, top_k=8, expert_ffn_hidden=1536, shared_ffn_hidden=1536))),
    "deepseek-v3.json": (61, 7168, 128, 128, 192, 18432, 129280, dict(
        moe=MoeSpec(experts=256, top_k=8, expert_ffn_hidden=2048, shared_experts=1,
                    shared_ffn_hidden=2048, dense_layers=3, router_scoring="sigmoid", groups=8, group_topk=4),
        mla=MlaSpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                    q_lora_rank=1536),
        mtp_layers=1, seq_len=8192, tied_embeddings=False, rope_theta=10000.0, norm_eps=1e-6)),
    "gpt2.json": (12, 768, 12, 12, 64, 3072, 50257, dict(
        ffn_act="gelu", norm="layernorm", position_embedding="learned", linear_bias=True,
        tied_embeddings=True, seq_len=1024, max_position=1024, dropout=0.1, name="gpt2")),
    "pythia-1b.json": (16, 2048, 8, 8, 256, 8192, 50304, dict(
        ffn_act="gelu", norm="layernorm", position_embedding="rope", linear_bias=True,
        tied_embeddings=False, seq_len=2048, dropout=0.0)),
    "bloom-560m.json": (24, 1024, 16, 16, 64, 4096, 250880, dict(
        position_embedding="alibi", tied_embeddings=True, seq_len=2048, linear_bias=True)),
    "opt-1.3b.json": (24, 2048, 32, 32, 64, 8192, 50272, dict(
        ffn_act="relu", position_embedding="learned", tied_embeddings=True, max_position=2048,
        dropout=0.1, name="facebook/opt-1.3b")),
    "bert-large-uncased.json": (24, 1024, 16, 16, 64, 4096, 30522, dict(
        causal=False, ffn_act="gelu", norm="layernorm", position_embedding="learned",
        tied_embeddings=True, seq_len=512, max_position=512, dropout=0.1, norm_eps=1e-12, rope_theta=0.0)),
}


def test_every_supported_model_type_has_a_fixture():
    assert {read(name)["model_type"] for name in EXPECTED} == set(hf.FAMILIES)
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_converts(name):
    path = str(DATA / name)
    spec = convert(read(name), path)
    layers, hidden, heads, kv_heads, head_dim, ffn, vocab, other = EXPECTED[name]
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn_hidden,
            spec.vocab) == (layers, hidden, heads, kv_heads, head_dim, ffn, vocab)
    for field, value in other.items():
        assert getattr(spec, field) == value, field
    if "moe" not in other:
        assert spec.moe is None
    if "mla" not in other:
        assert spec.mla is None
    assert spec.source == f"Hugging Face config.json ({name})"  # the file name, not the path it was read by


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_model_reads_config_json(name):
    path = DATA / name
    assert load_model(str(path)) == convert(read(name), str(path))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_only_schema_keys_and_plain_data(name):
    d = to_spec_dict(read(name), name)
    assert json.loads(json.dumps(d)) == d
    assert {"name", "source", "layers", "hidden", "heads", "ffn_hidden", "vocab"} <= d.keys()


def test_torch_dtype_and_dtype_spellings_agree():
    old = read("llama3-8b.json")
    new = {k: v for k, v in old.items() if k != "torch_dtype"} | {"dtype": "bfloat16"}
    assert convert(old) == convert(new)


@pytest.mark.parametrize("name", ["mixtral-8x7b.json", "qwen1.5-moe-a2.7b.json", "qwen3-30b-a3b.json"])
def test_num_experts_and_num_local_experts_spellings_agree(name):
    config = read(name)
    key = "num_local_experts" if "num_local_experts" in config else "num_experts"
    other = "num_experts" if key == "num_local_experts" else "num_local_experts"
    swapped = {k: v for k, v in config.items() if k != key} | {other: config[key]}
    assert convert(swapped).moe == convert(config).moe


def test_old_bloom_spellings_n_embed_and_num_attention_heads():
    """An earlier revision of bigscience/bloom-560m's config.json used n_embed/num_attention_heads."""
    config = read("bloom-560m.json")
    old = {k: v for k, v in config.items() if k not in ("hidden_size", "n_head")}
    old |= {"n_embed": 1024, "num_attention_heads": 16}
    assert convert(old) == convert(config)


def test_gpt2_new_spellings_and_n_inner():
    config = read("gpt2.json")
    renamed = {k: v for k, v in config.items() if k not in ("n_layer", "n_embd", "n_head")}
    renamed |= {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12}
    assert convert(renamed) == convert(config)
    assert convert(config | {"n_inner": 1000}).ffn_hidden == 1000
    assert convert(config | {"resid_pdrop": 0.0, "attn_pdrop": 0.2, "embd_pdrop": 0.05}).dropout == 0.2


def test_name_is_name_or_path_else_model_type():
    assert convert(read("opt-1.3b.json") | {"_name_or_path": ""}).name == "opt"
    assert convert(read("llama3-8b.json") | {"_name_or_path": "meta-llama/Meta-Llama-3-8B"}).name == (
        "meta-llama/Meta-Llama-3-8B")


def test_missing_head_dim_and_kv_heads_default():
    config = read("llama3-8b.json")
    del config["num_key_value_heads"]
    spec = convert(config | {"head_dim": None})
    assert (spec.kv_heads, spec.head_dim) == (32, 128)


def test_seq_len_is_capped_and_follows_short_windows():
    config = read("qwen2.5-7b.json")
    assert convert(config).seq_len == 8192
    assert convert(config | {"max_position_embeddings": 4096}).seq_len == 4096


def test_deepseek_null_q_lora_rank_means_full_rank():
    spec = convert(read("deepseek-v3.json") | {"q_lora_rank": None})
    assert spec.mla.q_lora_rank == 0


def test_deepseek_ignores_hf_head_dim_key():
    """transformers writes head_dim = qk_rope_head_dim for DeepSeek; ours is the full q/k head."""
    assert convert(read("deepseek-v3.json") | {"head_dim": 64}).head_dim == 192


def test_qwen_mlp_only_layers_prefix_becomes_dense_layers():
    assert convert(read("qwen3-30b-a3b.json") | {"mlp_only_layers": [0, 1]}).moe.dense_layers == 2


@pytest.mark.parametrize("name, change, words", [
    ("qwen3-30b-a3b.json", {"mlp_only_layers": [3, 7]}, ["mlp_only_layers", "[3, 7]"]),
    ("qwen3-30b-a3b.json", {"decoder_sparse_step": 2}, ["decoder_sparse_step", "2"]),
    ("deepseek-v3.json", {"moe_layer_freq": 2}, ["moe_layer_freq"]),
    ("opt-1.3b.json", {"word_embed_proj_dim": 512}, ["word_embed_proj_dim", "512", "2048"]),
    ("gpt2.json", {"activation_function": "tanh"}, ["activation_function", "tanh"]),
    ("llama3-8b.json", {"hidden_size": 0}, ["hidden_size", "positive", "0"]),
    ("llama3-8b.json", {"num_hidden_layers": -2}, ["num_hidden_layers", "positive", "-2"]),
    ("llama3-8b.json", {"intermediate_size": "big"}, ["intermediate_size", "integer", "big"]),
    ("mixtral-8x7b.json", {"num_local_experts": 0}, ["num_local_experts", "positive"]),
    ("gpt2.json", {"resid_pdrop": 1.5}, ["resid_pdrop", "probability"]),
    ("llama3-8b.json", {"tie_word_embeddings": "no"}, ["tie_word_embeddings", "true or false"]),
])
def test_bad_values_name_the_file_and_key(name, change, words):
    with pytest.raises(SpecError) as e:
        to_spec_dict(read(name) | change, "models/x/config.json")
    message = str(e.value)
    assert message.startswith("models/x/config.json: ") and "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("name, key, aliases", [
    ("llama3-8b.json", "num_hidden_layers", ["n_layer"]),
    ("llama3-8b.json", "hidden_size", ["n_embd", "n_embed"]),
    ("llama3-8b.json", "num_attention_heads", ["n_head"]),
    ("llama3-8b.json", "intermediate_size", []),
    ("llama3-8b.json", "vocab_size", []),
    ("opt-1.3b.json", "ffn_dim", []),
    ("mixtral-8x7b.json", "num_local_experts", ["num_experts"]),
    ("qwen1.5-moe-a2.7b.json", "moe_intermediate_size", []),
    ("deepseek-v3.json", "kv_lora_rank", []),
])
def test_missing_required_key_names_file_key_and_aliases(name, key, aliases):
    config = read(name)
    if key == "hidden_size" or key == "num_attention_heads":  # old spellings would stand in
        config = {k: v for k, v in config.items() if k not in ("n_embd", "n_embed", "n_head")}
    del config[key]
    with pytest.raises(SpecError) as e:
        to_spec_dict(config, "ckpt/config.json")
    message = str(e.value)
    assert message.startswith("ckpt/config.json: ") and "\n" not in message
    assert f"required key {key} is missing" in message
    for alias in aliases:
        assert alias in message


def test_unsupported_model_type_lists_supported_ones():
    with pytest.raises(SpecError) as e:
        to_spec_dict(read("llama3-8b.json") | {"model_type": "falcon"}, "tiiuae/config.json")
    message = str(e.value)
    assert message.startswith("tiiuae/config.json: ") and "'falcon'" in message
    for model_type in hf.FAMILIES:
        assert model_type in message


def test_missing_model_type():
    config = read("llama3-8b.json")
    del config["model_type"]
    with pytest.raises(SpecError, match=r"^a/config\.json: model_type is missing; supported model types: bert, "):
        to_spec_dict(config, "a/config.json")


def test_load_model_error_names_the_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(read("llama3-8b.json") | {"num_attention_heads": 0}))
    with pytest.raises(SpecError, match=rf"^{path}: num_attention_heads: expected a positive integer, got 0$"):
        load_model(str(path))


def test_docstring_lists_every_key_read():
    """The module docstring is the user-facing list of keys read; keep it in step with the table."""
    keys = set(hf.LAYERS + hf.HIDDEN + hf.HEADS + hf.KV_HEADS + hf.HEAD_DIM + hf.VOCAB + hf.TIED
               + (hf.NAME,) + hf.MLA_KEYS + ("q_lora_rank", "model_type"))
    for family in hf.FAMILIES.values():
        for part in (family, family.moe):
            for field in dataclasses.fields(part) if part else ():
                value = getattr(part, field.name)
                if isinstance(value, tuple):
                    keys.update(value)
    missing = sorted(k for k in keys if k not in hf.__doc__)
    assert not missing
