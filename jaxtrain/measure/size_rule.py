"""The model for a time budget (`model.size="auto"`, docs/time-budget.md): a pure function of the
budget, this machine's measured speed (`SpeedModel`, from measure/speed_probe.py), the corpus's
unique train tokens U and a loss law fitted offline (`LAW`), so it is tested without timing
anything. Each candidate shape (`candidates`) gets the steps its time left holds after its compile
(`SpeedModel.steps`), so the tokens D it trains; the law predicts its final val bits per byte from
its parameters N (block matrices and the output head: the ones that cost FLOPs) and D:

    bpb = E + A / N^alpha + B / D'^beta,   D' = D                               (D <= U)
                                           D' = U (1 + R (1 - exp(-(D/U - 1) / R)))  (D > U)

D' is Muennighoff et al.'s effective data (arXiv 2305.16264): each further epoch is worth less
than the one before, and D' never exceeds (1 + R) U. D and U are counted in bytes of text (the
tokens times the corpus's bytes per token: 1 for characters of ASCII text, ~2 for a small BPE),
so that tokenizers compare. The pick is the lowest prediction; where
another shape is predicted within `FLAT` of it (the valley is flat: Kaplan et al. Fig. 5), the one
with fewer parameters (fewer epochs' overfitting, a cheaper compile).
"""

import dataclasses
import math

from jaxtrain.core import model as model_lib
from jaxtrain.core import optim

WIDTHS = (64, 96, 128, 160, 192, 256, 320, 384, 512, 768)
DEPTHS = (2, 3, 4, 5, 6, 8, 10, 12)
ASPECT = (32, 64)  # width / depth of a candidate where neither is set: around nanochat's 64 and
#                    the recipe's 48 (configs/shakespeare_char.py: 2 x 96)
FLAT = 0.002  # relative bpb within which a smaller candidate is preferred
OVERHEAD = 0.05  # evaluations and saves, a share of the training time
SHAPE_FIELDS = ("model.n_layers", "model.d_model", "model.n_heads", "model.seq_len",
                "train.batch_size")


@dataclasses.dataclass(frozen=True)
class Shape:
  n_layers: int
  d_model: int
  n_heads: int
  seq_len: int
  batch_size: int

  @property
  def name(self) -> str:
    return f"{self.n_layers}x{self.d_model}"

  def fields(self) -> dict[str, int]:
    """{SHAPE_FIELDS name: value}: the shape as config overrides."""
    return {f: getattr(self, f.split(".")[1]) for f in SHAPE_FIELDS}


@dataclasses.dataclass(frozen=True)
class LossLaw:
  """Final val bits per byte from N params, D trained tokens and U unique tokens."""

  e: float
  a: float
  alpha: float
  b: float
  beta: float
  r: float  # epochs past the first after which repeats are worth 1 - 1/e of new tokens

  def effective_tokens(self, d: float, u: float) -> float:
    if d <= u:
      return d
    return u * (1 + self.r * (1 - math.exp(-(d / u - 1) / self.r)))

  def bpb(self, n: float, d: float, u: float) -> float:
    return self.e + self.a / n**self.alpha + self.b / self.effective_tokens(d, u)**self.beta


# Fitted by benchmarks/auto_size_fit.py to benchmarks/results/2026-11-28-auto_size-zen4/runs.jsonl
# (fit.json there); tests/test_auto_size.py checks that the fit gives these.
LAW = LossLaw(e=1.855, a=57.95, alpha=0.4778, b=1328.0, beta=0.5915, r=30.0)


def features(base: model_lib.ModelConfig, shape: Shape, muon_ns_steps: int) -> tuple:
  """What a step's time is modelled from: (1, layers, the model's training FLOPs of a
  micro-batch, Muon's FLOPs of a step, the activations' size B*T*L*D)."""
  mc = model_config(base, shape)
  tokens = shape.batch_size * shape.seq_len
  muon = 0
  if muon_ns_steps:
    d, k = mc.d_model, mc.head_dim
    mats = [(d, (mc.n_heads + 2 * mc.kv_heads) * k), (d, d)]
    mats += [(d, mc.mlp_hidden)] * (3 if mc.mlp == "swiglu" else 2)
    muon = mc.n_layers * sum(optim.newton_schulz_flops(m, muon_ns_steps) for m in mats)
  return (1.0, float(mc.n_layers), float(model_lib.flops_per_token(mc) * tokens), float(muon),
          float(tokens * mc.n_layers * mc.d_model))


def heads(width: int) -> int:
  """A candidate's heads: of 32 below width 192, of 64 from there on."""
  return max(width // 32 if width < 192 else width // 64, 1)


def model_config(base: model_lib.ModelConfig, shape: Shape) -> model_lib.ModelConfig:
  return dataclasses.replace(base, n_layers=shape.n_layers, d_model=shape.d_model,
                             n_heads=shape.n_heads, seq_len=shape.seq_len, n_kv_heads=0)


@dataclasses.dataclass(frozen=True)
class SpeedModel:
  """Seconds a step takes (a linear model of `features`, fitted to this machine's probe) and
  what a run spends before its first step and after its last: start-up and compiles
  (`fixed_s + compile_per_layer_s x layers`), and the share of the time its evaluations and
  saves take (`overhead`). A probe cut short holds for steps of up to `max_flops` FLOPs (the
  largest it measured)."""

  coef: tuple[float, ...]
  fixed_s: float
  compile_per_layer_s: float
  overhead: float = OVERHEAD
  muon_ns_steps: int = 5
  max_flops: float = math.inf

  def step_s(self, base: model_lib.ModelConfig, shape: Shape) -> float:
    x = features(base, shape, self.muon_ns_steps)
    return max(sum(c * v for c, v in zip(self.coef, x, strict=True)), 1e-6)

  def steps(self, base: model_lib.ModelConfig, shape: Shape, left_s: float) -> int:
    """The optimizer steps that `left_s` seconds hold after start-up and compiles."""
    train_s = (left_s - self.fixed_s - self.compile_per_layer_s * shape.n_layers) \
        / (1 + self.overhead)
    return max(0, int(train_s / self.step_s(base, shape)))


@dataclasses.dataclass(frozen=True)
class Option:
  """A candidate with what the rule predicts for it."""

  shape: Shape
  params: int  # block matrices and the output head (the loss law's N)
  steps: int
  tokens: int
  epochs: float
  tokens_per_s: float
  bpb: float


def candidates(fixed: dict, seq_len: int, batch_size: int) -> list[Shape]:
  """The shapes to choose from, every field in `fixed` (a SHAPE_FIELDS name: value) as given.
  Depth and width both free: widths ASPECT[0]..ASPECT[1] times the depth."""
  depths = [fixed["model.n_layers"]] if "model.n_layers" in fixed else DEPTHS
  widths = [fixed["model.d_model"]] if "model.d_model" in fixed else WIDTHS
  both_free = "model.n_layers" not in fixed and "model.d_model" not in fixed
  out = []
  for n_layers in depths:
    for d in widths:
      if both_free and not ASPECT[0] <= d / n_layers <= ASPECT[1]:
        continue
      h = fixed.get("model.n_heads") or heads(d)
      if d % h or (d // h) % 2:  # RoPE needs an even head size
        continue
      out.append(Shape(n_layers, d, h, fixed.get("model.seq_len", seq_len),
                       fixed.get("train.batch_size", batch_size)))
  return out


def options(base: model_lib.ModelConfig, shapes: list[Shape], speed: SpeedModel, left_s: float,
            unique_tokens: int, law: LossLaw = LAW, bytes_per_token: float = 1.0) -> list[Option]:
  """Every shape that trains at least one step in `left_s`, with its prediction (the law reads
  tokens as bytes of text: `bytes_per_token` of the corpus's tokenizer)."""
  out = []
  for s in shapes:
    steps = speed.steps(base, s, left_s)
    if steps < 1 or features(base, s, 0)[2] > speed.max_flops:
      continue
    tokens = steps * s.batch_size * s.seq_len
    params = model_lib.matmul_param_count(model_config(base, s))
    out.append(Option(s, params, steps, tokens, tokens / unique_tokens,
                      s.batch_size * s.seq_len / speed.step_s(base, s),
                      law.bpb(params, tokens * bytes_per_token, unique_tokens * bytes_per_token)))
  return out


def choose(opts: list[Option]) -> tuple[Option, list[Option]]:
  """(the pick, the nearest rejected: the best with fewer params and the best with more)."""
  best = min(o.bpb for o in opts)
  pick = min((o for o in opts if o.bpb <= best * (1 + FLAT)), key=lambda o: (o.params, o.bpb))
  smaller = [o for o in opts if o.params < pick.params]
  larger = [o for o in opts if o.params > pick.params]
  near = [min(side, key=lambda o: o.bpb) for side in (smaller, larger) if side]
  return pick, near


def repayable_s(base: model_lib.ModelConfig, shapes: list[Shape], speed: SpeedModel,
                left_s: float, unique_tokens: int, fallback: Shape, at_most: float,
                law: LossLaw = LAW, bytes_per_token: float = 1.0) -> float:
  """The most seconds (up to `at_most`) a speed probe may take of `left_s` and still pay for
  itself, as `speed` predicts: the best of `shapes` trained in the time the probe leaves is
  predicted lower, by more than FLAT, than the `fallback` shape trained in all of `left_s`
  (what a run that measures nothing trains). 0 where none is even with no probe."""
  def best(t: float) -> float:
    return min((o.bpb for o in options(base, shapes, speed, t, unique_tokens, law,
                                       bytes_per_token)), default=math.inf)

  kept = options(base, [fallback], speed, left_s, unique_tokens, law, bytes_per_token)
  if not kept:  # the fallback trains no step: whatever is measured is worth it
    return at_most
  target = kept[0].bpb * (1 - FLAT)
  if best(left_s) >= target:
    return 0.0
  if best(left_s - at_most) < target:
    return at_most
  lo, hi = 0.0, at_most  # best(left_s - lo) < target <= best(left_s - hi)
  while hi - lo > 0.05:
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if best(left_s - mid) < target else (lo, mid)
  return lo
