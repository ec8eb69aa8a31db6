"""jaxtrain's params under Hugging Face transformers' names, both ways: the mapping that export
writes and `init_from` reads.

Two layouts have an exact transformers class: RoPE + RMSNorm + SwiGLU is `LlamaForCausalLM` (the
same rotate-half RoPE, so no permutation of q and k), learned positions + LayerNorm + GELU is
`GPT2LMHeadModel` (with zero biases: jaxtrain's layers have none). Every other model (QK-norm,
ReLU^2, x0-mix, convolutions, ...) is `JaxtrainForCausalLM`, whose code (hf_modeling.py) the
export writes beside the weights, which keep jaxtrain's names. Torch's Linear stores [out, in],
jaxtrain's kernels [in, out]; GPT-2's Conv1D stores [in, out] as jaxtrain does.
Params here are flat: {"blocks/0/attn/qkv/kernel": array} (`flatten`).
"""

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np

from jaxtrain.checkpoints import targets
from jaxtrain.core.model import ModelConfig
from jaxtrain.system.errors import UserError

LLAMA, GPT2 = "LlamaForCausalLM", "GPT2LMHeadModel"
CUSTOM = "JaxtrainForCausalLM"  # hf_modeling.py, written into the export as MODELING_FILE
MODELING_FILE = "modeling_jaxtrain.py"
# The ModelConfig fields that hf_modeling.JaxtrainConfig takes (with mlp_hidden, derived).
CUSTOM_FIELDS = ("vocab_size", "n_layers", "n_heads", "d_model", "seq_len", "norm", "pos", "mlp",
                 "tie_embeddings", "rope_theta", "n_kv_heads", "qk_norm",
                 "x0_mix", "canon", "doc_mask", "eot_id")
EPS = 1e-5  # jaxtrain's norms' epsilon
# The ModelConfig fields a config.json fixes where it has them (model_fields adds kv_heads too).
FIXED = ("n_layers", "n_heads", "d_model", "norm", "pos", "mlp", "tie_embeddings", "rope_theta",
         "qk_norm", "x0_mix", "canon")


def read_dir(source: Path) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json, tensors) of a Hugging Face model directory: one model.safetensors or its
  shards."""
  from safetensors.numpy import load_file

  hf_cfg = json.loads((source / "config.json").read_text(encoding="utf-8"))
  if not hf_cfg.get("architectures"):
    raise UserError(f"{source / 'config.json'} names no architecture; is it a transformers model "
                    "directory?")
  tensors = {}
  for part in sorted(source.glob("model*.safetensors")):
    tensors.update(load_file(str(part)))
  return hf_cfg, tensors


def flatten(params) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(x)
          for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def fill(template, flat: dict[str, np.ndarray], source: str):
  """`template`'s tree with each leaf taken from `flat` by name, its shape checked."""
  missing = sorted(set(flatten(template)) - set(flat))
  if missing:
    raise UserError(f"init_from: {source} has no tensor for {missing[0]}; its model has fewer "
                    "layers or other switches than this config: match --config.model.* to it")

  def take(path, x):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    value = flat[name]
    if tuple(value.shape) != tuple(x.shape):
      raise UserError(f"init_from: tensor {name} of {source} has shape {tuple(value.shape)}, this "
                      f"config's model needs {tuple(x.shape)}; match --config.model.* to it")
    return np.asarray(value, np.float32)

  return jax.tree_util.tree_map_with_path(take, template)


def blockers(c: ModelConfig) -> list[str]:
  """The switches of `c` that neither Llama nor GPT-2 has (empty: one of them is exact)."""
  name, needs = ("Llama", (("norm", "rmsnorm"), ("mlp", "swiglu"))) if c.pos == "rope" else \
      ("GPT-2", (("norm", "layernorm"), ("mlp", "gelu")))
  found = [f"model.{field}={getattr(c, field)}" for field in ("qk_norm", "x0_mix", "canon")
           if getattr(c, field) != getattr(ModelConfig, field)]
  if c.pos != "rope" and c.kv_heads != c.n_heads:
    found.append(f"model.n_kv_heads={c.n_kv_heads} with model.pos=learned")
  found += [f"model.{field}={getattr(c, field)} with model.pos={c.pos} ({name} has "
            f"model.{field}={want})" for field, want in needs if getattr(c, field) != want]
  return found


def architecture(c: ModelConfig) -> str:
  """LLAMA or GPT2 where one computes what `c` does; else CUSTOM, jaxtrain's own modeling file
  (the table of targets.py)."""
  # (an extension component's options are not fields: its name is a value no architecture takes)
  return targets.choose("hf", {k: v for k, v in dataclasses.asdict(c).items() if k != "options"})


def hf_config(c: ModelConfig, eos_id: int | None, bos_id: int | None = None) -> dict:
  """config.json for `c` (float32 weights) with the tokenizer's end-of-text token as eos (and
  its beginning-of-sequence token, where it has one)."""
  common = {"vocab_size": c.vocab_size, "tie_word_embeddings": c.tie_embeddings,
            "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": None,
            "dtype": "float32"}
  arch = architecture(c)
  if arch == CUSTOM:
    return {"architectures": [CUSTOM], "model_type": "jaxtrain",
            "auto_map": {"AutoConfig": f"{MODELING_FILE[:-3]}.JaxtrainConfig",
                         "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.{CUSTOM}"},
            **{f: getattr(c, f) for f in CUSTOM_FIELDS}, "mlp_hidden": c.mlp_hidden,
            **common, "tie_word_embeddings": False, "use_cache": False}
  if arch == LLAMA:
    return {"architectures": [LLAMA], "model_type": "llama", "hidden_size": c.d_model,
            "intermediate_size": c.mlp_hidden, "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads,
            "head_dim": c.head_dim, "hidden_act": "silu", "max_position_embeddings": c.seq_len,
            "rms_norm_eps": EPS, "rope_parameters": {"rope_type": "default",
                                                     "rope_theta": c.rope_theta},
            "attention_bias": False, "mlp_bias": False, **common}
  return {"architectures": [GPT2], "model_type": "gpt2", "n_embd": c.d_model,
          "n_inner": c.mlp_hidden, "n_layer": c.n_layers, "n_head": c.n_heads,
          "n_positions": c.seq_len, "activation_function": "gelu_new",  # tanh GELU, as jaxtrain's
          "layer_norm_epsilon": EPS, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
          "scale_attn_weights": True, **common}


def _names(arch: str, c: ModelConfig) -> list[tuple[str, str, slice | None, bool]]:
  """(HF name, jaxtrain name, columns of the jaxtrain kernel, transposed) of each tensor."""
  if arch == LLAMA:
    D, KV, F = c.d_model, c.kv_heads * c.head_dim, c.mlp_hidden  # KV: the width of the keys
    names = [("model.embed_tokens.weight", "wte/embedding", None, False),
             ("model.norm.weight", "norm_f/scale", None, False)]
    for i in range(c.n_layers):
      hf, jt = f"model.layers.{i}.", f"blocks/{i}/"
      names += [(hf + "input_layernorm.weight", jt + "norm1/scale", None, False),
                (hf + "self_attn.q_proj.weight", jt + "attn/qkv/kernel", slice(0, D), True),
                (hf + "self_attn.k_proj.weight", jt + "attn/qkv/kernel", slice(D, D + KV), True),
                (hf + "self_attn.v_proj.weight", jt + "attn/qkv/kernel", slice(D + KV, D + 2 * KV), True),
                (hf + "self_attn.o_proj.weight", jt + "attn/out/kernel", None, True),
                (hf + "post_attention_layernorm.weight", jt + "norm2/scale", None, False),
                (hf + "mlp.gate_proj.weight", jt + "mlp/up/kernel", slice(0, F), True),
                (hf + "mlp.up_proj.weight", jt + "mlp/up/kernel", slice(F, 2 * F), True),
                (hf + "mlp.down_proj.weight", jt + "mlp/down/kernel", None, True)]
  else:
    names = [("transformer.wte.weight", "wte/embedding", None, False),
             ("transformer.wpe.weight", "wpe", None, False),
             ("transformer.ln_f.weight", "norm_f/scale", None, False)]
    for i in range(c.n_layers):
      hf, jt = f"transformer.h.{i}.", f"blocks/{i}/"
      names += [(hf + "ln_1.weight", jt + "norm1/scale", None, False),
                (hf + "attn.c_attn.weight", jt + "attn/qkv/kernel", None, False),
                (hf + "attn.c_proj.weight", jt + "attn/out/kernel", None, False),
                (hf + "ln_2.weight", jt + "norm2/scale", None, False),
                (hf + "mlp.c_fc.weight", jt + "mlp/up/kernel", None, False),
                (hf + "mlp.c_proj.weight", jt + "mlp/down/kernel", None, False)]
  if not c.tie_embeddings:
    names.append(("lm_head.weight", "lm_head/kernel", None, True))
  return names


def _biases(arch: str, c: ModelConfig) -> list[str]:
  """GPT-2's bias tensors, which jaxtrain's layers lack (written as zeros): one beside the weight
  of each of its norms and linear layers."""
  return [name.replace(".weight", ".bias") for name, *_ in _names(arch, c)
          if arch == GPT2 and name.startswith(("transformer.h.", "transformer.ln_f."))]


def to_hf(flat: dict[str, np.ndarray], c: ModelConfig) -> dict[str, np.ndarray]:
  """jaxtrain's flat params -> HF's state dict (float32, contiguous)."""
  arch = architecture(c)
  if arch == CUSTOM:  # jaxtrain's own names and layouts
    return {name.replace("/", "."): np.ascontiguousarray(x, np.float32) for name, x in flat.items()}
  out = {}
  for hf_name, jt_name, cols, transposed in _names(arch, c):
    x = np.asarray(flat[jt_name], np.float32)
    x = x[:, cols] if cols is not None else x
    out[hf_name] = np.ascontiguousarray(x.T if transposed else x)
  for name in _biases(arch, c):
    width = out[name.replace(".bias", ".weight")].shape[-1]
    out[name] = np.zeros(width, np.float32)
  return out


def model_fields(hf_cfg: dict) -> dict:
  """The model.* fields of jaxtrain's config that an HF config.json fixes (for checks)."""
  arch = (hf_cfg.get("architectures") or [None])[0]
  if arch == CUSTOM:
    return {**{f: hf_cfg[f] for f in FIXED}, "mlp_hidden": hf_cfg["mlp_hidden"],
            "kv_heads": hf_cfg.get("n_kv_heads") or hf_cfg["n_heads"]}
  tied = bool(hf_cfg.get("tie_word_embeddings", arch == GPT2))
  if arch == LLAMA:
    rope = hf_cfg.get("rope_parameters") or {}
    return {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_heads": hf_cfg["num_attention_heads"],
            "n_layers": hf_cfg["num_hidden_layers"], "d_model": hf_cfg["hidden_size"],
            "mlp_hidden": hf_cfg["intermediate_size"], "tie_embeddings": tied,
            "rope_theta": float(rope.get("rope_theta", hf_cfg.get("rope_theta", 10000.0))),
            "kv_heads": hf_cfg.get("num_key_value_heads") or hf_cfg["num_attention_heads"]}
  if arch == GPT2:
    d = hf_cfg["n_embd"]
    return {"pos": "learned", "norm": "layernorm", "mlp": "gelu", "n_heads": hf_cfg["n_head"],
            "n_layers": hf_cfg["n_layer"], "d_model": d, "mlp_hidden": hf_cfg.get("n_inner") or 4 * d,
            "tie_embeddings": tied}
  raise UserError(f"init_from: the Hugging Face model is a {arch}; jaxtrain reads {LLAMA}, "
                  f"{GPT2} and its own exports ({CUSTOM})")


def from_hf(hf_cfg: dict, tensors: dict[str, np.ndarray], c: ModelConfig,
            source: str) -> dict[str, np.ndarray]:
  """HF's state dict -> jaxtrain's flat params for a model of config `c`; a model that does not
  fit `c` is refused with one line naming the field or the tensor."""
  fields = model_fields(hf_cfg)
  mine = {f: getattr(c, f) for f in (*FIXED, "kv_heads")}
  for field, theirs in fields.items():
    if field in mine and mine[field] != theirs:
      name = "n_kv_heads" if field == "kv_heads" else field
      raise UserError(f"init_from: {source} has model.{name}={theirs}, this config "
                      f"{mine[field]}; pass --config.model.{name}={theirs}")
  for field in ("qk_norm", "x0_mix", "canon"):  # Llama and GPT-2 have none
    if field not in fields and mine[field] != getattr(ModelConfig, field):
      raise UserError(f"init_from: {source} is a {hf_cfg['architectures'][0]}, which has no "
                      f"model.{field}; pass --config.model.{field}={getattr(ModelConfig, field)}")
  if hf_cfg["architectures"][0] == CUSTOM:  # jaxtrain's own names: fill() checks each shape
    return {name.replace(".", "/"): np.asarray(x, np.float32) for name, x in tensors.items()}
  arch = LLAMA if c.pos == "rope" else GPT2
  biases = set(_biases(arch, c))
  known = {hf for hf, *_ in _names(arch, c)} | biases
  if c.tie_embeddings:
    known.add("lm_head.weight")  # some savers write the tied copy too
  for name, x in tensors.items():
    if name not in known and not name.endswith(".attn.bias"):  # GPT-2's old causal-mask buffer
      raise UserError(f"init_from: tensor {name} of {source} has no place in jaxtrain's model")
    if name in biases and np.any(np.asarray(x) != 0):
      raise UserError(f"init_from: tensor {name} of {source} is a nonzero bias; jaxtrain's layers "
                      "have none, so this model cannot be loaded exactly")
  parts: dict[str, list] = {}
  for hf_name, jt_name, _, transposed in _names(arch, c):
    if hf_name not in tensors:
      raise UserError(f"init_from: {source} has no tensor {hf_name}; match --config.model.* to "
                      "its config.json")
    x = np.asarray(tensors[hf_name], np.float32)
    parts.setdefault(jt_name, []).append(x.T if transposed else x)
  # Kernels split over several HF tensors (q, k, v; gate, up) join along their columns.
  return {name: xs[0] if len(xs) == 1 else np.concatenate(xs, axis=1) for name, xs in parts.items()}
