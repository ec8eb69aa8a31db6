"""GGUF exports run by llama.cpp itself (llama-cpp-python 0.3.36, built from source here): greedy
tokens and logits against jaxtrain's on trained runs of each GGUF architecture.

    python benchmarks/results/2026-12-07-gguf-llamacpp/run.py OUT_DIR [--train] > log.txt

Three runs are trained (short, so that the proof takes minutes): nano (llama), nano with QK-norm
and a BPE vocabulary (qwen3), and nanoGPT's character recipe on Tiny Shakespeare (gpt2). Each is
exported in float32, float16 and bfloat16. For each file: llama.cpp's tokenizer on a text against
jaxtrain's ids; 64 greedy tokens from llama.cpp's logits (argmax at each step, its KV cache)
against `jt.generate(..., temperature=0)`; the largest |logit| difference over the 64 positions
(llama.cpp given jaxtrain's tokens); and llama.cpp's own completion (its tokenizer, its end-of-text
prefix, its greedy sampler) against jaxtrain's text. Writes results.json beside the log.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

import jaxtrain as jt
from jaxtrain.generation import complete
from jaxtrain.tools import export

TEXT = "/work/shared/data/tinyshakespeare.txt"
RUNS = {  # name: (recipe, overrides, prompt)
    "nano-llama": ("nano", {"train.max_steps": 600}, "def "),
    "nano-qk-bpe-qwen3": ("nano", {"train.max_steps": 400, "model.qk_norm": True,
                                   "data.tokenizer": "bpe", "data.vocab_size": 512}, "class "),
    "char-gpt2": ("shakespeare_char_nanogpt", {"train.max_steps": 500, "data.path": TEXT,
                                               "model.seq_len": 128},
                  "ROMEO:"),
}


def greedy_llama_cpp(llm, prompt: list[int], n: int) -> list[int]:
  llm.reset()
  llm.eval(prompt)
  made = list(prompt)
  for _ in range(n):
    made.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    llm.eval([made[-1]])
  return made


def train(name: str, root: Path) -> None:
  recipe, over, _ = RUNS[name]
  workdir = root / name
  if not (workdir / "run.json").exists():
    cfg = jt.load_config(recipe, **{"workdir": str(workdir), "headless": True,
                                    "sample.num_samples": 0, **over})
    t0 = time.time()
    jt.run(cfg)
    print(f"{name}: trained {over['train.max_steps']} steps in {time.time() - t0:.0f}s", flush=True)


def one(name: str, root: Path) -> list[dict]:
  import llama_cpp

  train(name, root)
  _, _, prompt = RUNS[name]
  workdir = root / name
  state, tok = jt.load_state(str(workdir)), jt.load_tokenizer(str(workdir))
  ids = complete.context_ids(state, tok, prompt)  # after end-of-text, as a document starts
  ours = jt.generate(state, ids, 64, temperature=0.0)
  our_logits = np.asarray(state.model()(ours[None, :-1]))[0]
  sample = Path(TEXT).read_text()[:400] if "char" in name else Path(jt.__file__).read_text()[:400]
  rows = []
  for dtype in ("float32", "float16", "bfloat16"):
    path = root / f"{name}-{dtype}.gguf"
    if not path.exists():
      export.export_gguf(str(workdir), str(path), dtype=dtype)
    # Keys and values cached in float32 (llama.cpp's default cache is float16).
    llm = llama_cpp.Llama(str(path), n_ctx=state.model_cfg.seq_len, logits_all=True,
                          verbose=False, n_threads=2, seed=0, type_k=0, type_v=0)
    theirs = greedy_llama_cpp(llm, ids.tolist(), 64)
    llm.reset()
    llm.eval(ours[:-1].tolist())
    gap = float(np.abs(np.asarray(llm.scores[:len(ours) - 1]) - our_logits).max())
    tokenized = llm.tokenize(sample.encode(), add_bos=False, special=False)
    done = llm.create_completion(prompt, max_tokens=64, temperature=0.0, top_k=1)
    text = done["choices"][0]["text"]
    want = tok.decode(ours[len(ids):])
    cut = want.split("<|endoftext|>")[0]
    row = {"run": name, "arch": llm.metadata.get("general.architecture"), "dtype": dtype,
           "greedy_tokens_equal": theirs == ours.tolist(),
           "first_differing_token": next((i - len(ids) for i, (a, b) in enumerate(zip(theirs, ours))
                                          if a != b), None),
           "max_logit_gap": gap, "logit_scale": float(np.abs(our_logits).max()),
           "tokenizer_ids_equal": tokenized == tok.encode(sample).tolist(),
           "completion_text_equal": text == cut, "jaxtrain_text": want, "llama_cpp_text": text}
    rows.append(row)
    print(f"{name} {row['arch']} {dtype}: greedy 64 tokens equal {row['greedy_tokens_equal']} "
          f"(first difference at {row['first_differing_token']}), max |logit gap| {gap:.3g} "
          f"(logits up to {row['logit_scale']:.1f}), tokenizer ids equal "
          f"{row['tokenizer_ids_equal']}, llama.cpp's own completion equal "
          f"{row['completion_text_equal']}", flush=True)
  print(f"  jaxtrain: {want!r}\n  llama.cpp ({rows[0]['dtype']}): {rows[0]['llama_cpp_text']!r}",
        flush=True)
  return rows


def main() -> None:
  root = Path(sys.argv[1])
  root.mkdir(parents=True, exist_ok=True)
  if sys.argv[2:] == ["--train"]:  # the runs alone (while llama.cpp builds)
    for name in RUNS:
      train(name, root)
    return
  import llama_cpp

  print(f"llama-cpp-python {llama_cpp.__version__}, jaxtrain {jt.__version__}", flush=True)
  rows = [row for name in RUNS for row in one(name, root)]
  out = Path(__file__).with_name("results.json")
  out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
  main()
