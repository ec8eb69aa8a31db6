"""`jaxtrain-serve` under load: tokens/s and latency for 1, 8 and 32 concurrent streaming clients
(the official `openai` client over loopback), beside `jt.generate`'s own speed on the same
checkpoint and transformers' `generate` on the same model exported (its key-value cache).

    python benchmarks/serve_load.py --workdir=runs/nano --clients=1,8,32 --max-tokens=128

The server runs as a user starts it (`python -m jaxtrain.serve`, `--batch_size` = the most clients);
each level of concurrency gets a warm-up request, then its clients send `--requests` streamed
completions between them (at least two each), each client one after another, every request
`--max-tokens` tokens at temperature 0.8 from one of a few prompts; a level stops early at
`--level-s` seconds. Then, with the server stopped, `jt.generate` and transformers' `generate` (torch
on the same cores) make the same number of tokens for batches of 1, 8 and 32 prompts of one length,
each timed `--rounds` times after a warm-up. Tokens/s counts the new tokens of every stream
together; a request's latency runs from its send to its last event. Writes serve_load.{json,md,png}
to --out (default benchmarks/results/<date>-serve-<cpu kind>/).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "serve_load"
PROMPTS = ["ROMEO:\n", "First Citizen:\nBefore we proceed", "KING HENRY VI:\nWhat, ",
           "O, what a noble mind is here o'erthrown!\n"]
TEMPERATURE = 0.8


def start_server(workdir: str, batch: int, max_tokens: int) -> tuple[subprocess.Popen, str, list[str]]:
  """`python -m jaxtrain.serve` on a free port; (its process, its URL, its stderr lines)."""
  proc = subprocess.Popen([sys.executable, "-m", "jaxtrain.serve", f"--workdir={workdir}", "--port=0",
                           f"--batch_size={batch}", f"--queue={4 * batch}", f"--max_tokens={max_tokens}"],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
  lines: list[str] = []
  threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
  deadline = time.monotonic() + 600
  while not any(line.startswith("serving ") for line in lines):
    if proc.poll() is not None or time.monotonic() > deadline:
      raise SystemExit("the server did not start:\n" + "".join(lines))
    time.sleep(0.2)
  line = next(line for line in lines if line.startswith("serving "))
  reports.log(line.strip())
  return proc, line.split(" at ")[1].split("/v1")[0], lines


def one_request(client, model: str, prompt: str, max_tokens: int) -> dict:
  """A streamed completion: when its first text came, when its last event came, its tokens."""
  t0 = time.perf_counter()
  first, tokens = None, 0
  stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                     temperature=TEMPERATURE, stream=True,
                                     stream_options={"include_usage": True})
  for chunk in stream:
    if first is None and chunk.choices and chunk.choices[0].text:
      first = time.perf_counter() - t0
    if chunk.usage is not None:
      tokens = chunk.usage.completion_tokens
  return {"ttft_s": first, "latency_s": time.perf_counter() - t0, "tokens": tokens}


def level(url: str, model: str, clients: int, requests: int, max_tokens: int, limit_s: float) -> dict:
  """`requests` streamed completions from `clients` concurrent clients, each one after another."""
  import openai

  made = [openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
          for _ in range(clients)]  # each its own connection, made before the clock starts
  one_request(made[0], model, PROMPTS[0], 8)  # warm-up
  taken, lock, records = [0], threading.Lock(), []
  t0 = time.perf_counter()

  def client_loop(i: int) -> None:
    client = made[i]
    while True:
      with lock:
        if taken[0] >= requests or time.perf_counter() - t0 > limit_s:
          return
        taken[0] += 1
        n = taken[0]
      record = one_request(client, model, PROMPTS[n % len(PROMPTS)], max_tokens)
      with lock:
        records.append(record)

  with ThreadPoolExecutor(clients) as pool:
    list(pool.map(client_loop, range(clients)))
  wall = time.perf_counter() - t0
  return summarize(records, wall, clients)


def quantile(values: list[float], q: float) -> float:
  values = sorted(values)
  return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summarize(records: list[dict], wall: float, clients: int) -> dict:
  latency = [r["latency_s"] for r in records]
  ttft = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
  tokens = sum(r["tokens"] for r in records)
  return {"clients": clients, "requests": len(records), "wall_s": round(wall, 3), "tokens": tokens,
          "tokens_per_s": tokens / wall,
          "stream_tokens_per_s_median": statistics.median(r["tokens"] / r["latency_s"] for r in records),
          "latency_p50_s": quantile(latency, 0.5), "latency_p99_s": quantile(latency, 0.99),
          "ttft_p50_s": quantile(ttft, 0.5), "ttft_p99_s": quantile(ttft, 0.99), "records": records}


def timed(fn, rounds: int) -> list[float]:
  fn()  # compiles (jax) or warms up (torch)
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return times


def generate_speed(workdir: str, batches: list[int], max_tokens: int, rounds: int) -> dict:
  """jt.generate: `max_tokens` new tokens for a batch of b copies of one prompt."""
  import numpy as np

  import jaxtrain as jt

  state, tok = jt.load_state(workdir), jt.load_tokenizer(workdir)
  ids = np.asarray(tok.encode(PROMPTS[1]), np.int32)
  out = {}
  for b in batches:
    prompts = np.stack([ids] * b)
    times = timed(lambda p=prompts: jt.generate(state, p, max_tokens, temperature=TEMPERATURE), rounds)
    out[b] = {"batch": b, "times_s": times, "tokens_per_s": b * max_tokens / statistics.median(times)}
    reports.log(f"jt.generate batch {b}: {out[b]['tokens_per_s']:,.0f} tokens/s")
  return out


def transformers_speed(workdir: str, batches: list[int], max_tokens: int, rounds: int) -> dict:
  """transformers' generate on the run's export, the same tokens to make, sampling as the others."""
  import torch
  import transformers

  from jaxtrain.tools import export

  torch.set_num_threads(common.available_cores())
  with tempfile.TemporaryDirectory() as tmp:
    where = export.export(workdir, str(Path(tmp) / "hf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(where), trust_remote_code=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(where), trust_remote_code=True)
  arch = model.config.architectures[0]
  ids = tok(PROMPTS[1], return_tensors="pt").input_ids
  out = {}
  for b in batches:
    prompts = ids.repeat(b, 1)

    def run(prompts=prompts) -> None:
      with torch.no_grad():
        made = model.generate(prompts, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0,
                              attention_mask=torch.ones_like(prompts), pad_token_id=tok.eos_token_id)
      assert made.shape == (prompts.shape[0], prompts.shape[1] + max_tokens), made.shape

    times = timed(run, rounds)
    out[b] = {"batch": b, "times_s": times, "tokens_per_s": b * max_tokens / statistics.median(times)}
    reports.log(f"transformers ({arch}) batch {b}: {out[b]['tokens_per_s']:,.0f} tokens/s")
  return {"architecture": arch, "torch_threads": torch.get_num_threads(), "batches": out}


def markdown(report: dict, machine: dict) -> str:
  a = report["args"]
  rows = []
  for r in report["server"]:
    rows.append([f"jaxtrain-serve, {r['clients']} streaming client{'s' * (r['clients'] > 1)}",
                 r["requests"], f"{r['tokens_per_s']:,.0f}", f"{r['stream_tokens_per_s_median']:,.0f}",
                 f"{r['latency_p50_s']:.2f} / {r['latency_p99_s']:.2f}",
                 f"{r['ttft_p50_s']:.3f} / {r['ttft_p99_s']:.3f}"])
  for name, runs in (("jt.generate", report["generate"]),
                     (f"transformers generate ({report['transformers']['architecture']})",
                      report["transformers"]["batches"])):
    for b, r in runs.items():
      rows.append([f"{name}, batch {b}", a["rounds"], f"{r['tokens_per_s']:,.0f}",
                   f"{r['tokens_per_s'] / int(b):,.0f}",
                   f"{statistics.median(r['times_s']):.2f} (whole batch)", "-"])
  table = reports.markdown_table(["what", "requests or rounds", "tokens/s, all streams",
                                  "tokens/s per stream (median)", "latency p50 / p99 (s)",
                                  "first token p50 / p99 (s)"], rows)
  m = report["model"]
  return (f"# jaxtrain-serve under load ({report['when']})\n\n"
          f"- {reports.cpu_line(machine)}; python {machine['python']}, jax {machine['versions']['jax']}, "
          f"torch {machine['versions']['torch']}; {report['versions']}\n"
          f"- run: {a['workdir']} at step {m['step']} ({m['n_layers']} layers x {m['d_model']}, "
          f"seq_len {m['seq_len']}, {m['params'] / 1e6:.2f}M params, {m['vocab_size']}-token vocabulary)\n"
          f"- every request and batch: {a['max_tokens']} new tokens at temperature {TEMPERATURE}; the "
          f"server with --batch_size={report['server_batch']}, its compile at start-up "
          f"{report['server_compile']}; load: {reports.load_line(report['load'])}\n\n{table}\n\n"
          "A server level's tokens/s is every stream's new tokens over the level's wall time (its "
          "clients send one request after another); a stream's latency runs from the request to "
          "its last event, its first token from the request to the first text. jt.generate and "
          "transformers make the same tokens for a batch of copies of one prompt, timed whole "
          "(no HTTP, no streaming); transformers runs torch on the same cores.\n")


def chart(report: dict):
  values = {}
  for r in report["server"]:
    values[f"{r['clients']} at once"] = {"serve": r["tokens_per_s"]}
  for b, r in report["generate"].items():
    values.setdefault(f"{b} at once", {})["jt.generate"] = r["tokens_per_s"]
  for b, r in report["transformers"]["batches"].items():
    values.setdefault(f"{b} at once", {})["transformers"] = r["tokens_per_s"]
  return lambda path: reports.bar_chart(path, values, "new tokens/s, all streams",
                                        f"jaxtrain-serve against generate ({report['when'][:10]})")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--workdir", required=True, help="a trained run (a Llama-layout one exports "
                 "with transformers' key-value cache, e.g. nano)")
  p.add_argument("--clients", default="1,8,32", help="comma list of concurrent clients")
  p.add_argument("--requests", type=int, default=16, help="requests per level (at least 2 per client)")
  p.add_argument("--max-tokens", type=int, default=128)
  p.add_argument("--level-s", type=float, default=120.0, help="a level stops starting requests after this")
  p.add_argument("--rounds", type=int, default=3, help="timed rounds of generate per batch")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  clients = [int(c) for c in args.clients.split(",")]
  proc, url, lines = start_server(args.workdir, max(clients), args.max_tokens)
  model = Path(args.workdir).resolve().name
  loadavg_before = os.getloadavg()
  with common.LoadSampler(lambda: [os.getpid(), proc.pid]) as sampler:
    server = []
    for c in clients:
      sampler.label = f"serve {c}"
      server.append(level(url, model, c, max(args.requests, 2 * c), args.max_tokens, args.level_s))
      reports.log(f"{c} clients: {server[-1]['tokens_per_s']:,.0f} tokens/s, latency p50 "
                  f"{server[-1]['latency_p50_s']:.2f}s p99 {server[-1]['latency_p99_s']:.2f}s")
    proc.terminate()
    proc.wait(120)
    sampler.label = "generate"
    generate = generate_speed(args.workdir, clients, args.max_tokens, args.rounds)
    sampler.label = "transformers"
    peer = transformers_speed(args.workdir, clients, args.max_tokens, args.rounds)
  import jaxtrain as jt

  state = jt.load_state(args.workdir)
  c = state.model_cfg
  machine = reports.machine_info()
  compiled = next((line.split("compiled in ")[1].split(";")[0] for line in lines
                   if "compiled in" in line), "?")
  report = {"when": reports.timestamp(), "args": vars(args), "server_batch": max(clients),
            "server_compile": compiled, "server_lines": lines,
            "model": {"step": int(state.step), "n_layers": c.n_layers, "d_model": c.d_model,
                      "seq_len": c.seq_len, "vocab_size": c.vocab_size, "params": jt.param_count(c)},
            "versions": ", ".join(f"{p} {metadata.version(p)}" for p in ("fastapi", "uvicorn", "openai",
                                                                        "transformers")),
            "server": server, "generate": generate, "transformers": peer, "machine": machine,
            "load": reports.load_record(loadavg_before, sampler)}
  md = markdown(report, machine)
  print(md)
  out = Path(args.out) if args.out else reports.results_dir(f"serve-{reports.cpu_tag(machine)}")
  reports.write(out, NAME, report, md, chart(report))


if __name__ == "__main__":
  main()
