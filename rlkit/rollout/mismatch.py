"""Engine-mismatch simulator: sample rollouts with a perturbed copy of the policy.

A real inference engine (vLLM, SGLang) computes the policy's logits with other kernels and often another
precision than the trainer, so the behaviour log-probs it reports, log π_infer(y_t), differ from the
trainer's log π_train(y_t) for the same weights. Off-policy corrections (truncated / masked importance
sampling on log ρ_t = log π_train - log π_infer) exist for that gap; to study them on a CPU we make the gap
ourselves, with a size and a shape we control. The sampler runs

  ℓ̃ = ℓ_dtype + ε,    ε = σ z (uniform)   or   ε_v = σ (1 - p_v) z_v (tail),    z ~ N(0, I_V) fresh per step,

where ℓ_dtype are the raw [B, V] logits of the policy computed in the mismatch's dtype (the same parameters:
"bfloat16" casts activations and matmul inputs as an engine serving bf16 weights does), σ = `noise_scale`,
and p = softmax(processed_logits(ℓ_dtype)) is the distribution the sampler would draw from without noise:
after temperature, top-k and top-p, as `rlkit.rollout.sampler` uses them (tokens outside the nucleus have
p = 0 and get the full σ). The processed p is what the calibrated-IS design calibrates on (`s_t = σ̂ (1 -
p_t)` with p_t = π_infer(y_t)), and with it a token the sampler is sure of keeps its logit almost exactly
while the tail moves by up to σ. Tokens are then drawn from processed_logits(ℓ̃) and the Rollout's
log-probs are those of the perturbed distribution: the trainer's re-score of the same tokens differs.

What to expect (first order in ε; at temperature T the processed logits move by ε / T): the sampled token's
log-prob moves by Δ = (ε_y - Σ_v π_v ε_v) / T, so for uniform noise Var Δ = (σ/T)² [(1 - π_y)² + Σ_{v≠y}
π_v²], and for tail noise (σ/T)² [(1 - π_y)⁴ + Σ_{v≠y} π_v² (1 - π_v)²]. Softmax alone already makes
uniform logit noise hit confident tokens less (a confident token's own noise is mostly cancelled by the
normaliser); tail noise adds a factor (1 - π_y) on that term, so the contrast between confident and
low-probability tokens is stronger, not categorically different. The competitors' noise is the same in both
kinds wherever their p is small. Measured in tests/rollout/test_mismatch.py (tiny model, T = 1, σ = 0.3):
mean |Δ| on tokens with trainer p > 0.9 / p < 0.3 is 0.014 / 0.25 for uniform noise and 0.006 / 0.21 for
tail noise; in units of (1 - p) uniform noise is flat (0.28 / 0.28), tail noise is not (0.11 / 0.24).

Cost: the noise needs V normals per row and decode step, which on CPU costs more than the sampler's own
draw (see `sample_categorical`); without noise (`noise_scale=0`) the sampler's loop is the plain one.

A limit of this model (measured in experiments/calibrated_is/results.md): the noise is drawn afresh at every
decode step, so the policy the tokens are drawn from *on average* is much closer to the trainer's than each
step's reported log-prob suggests (at uniform sigma 1.0, |log rho| 0.389 reported vs 0.095 for the averaged
distribution); uncorrected training is then nearly unbiased and corrections mostly add variance. A real
engine's mismatch is a persistent shift per context: for that, sample from the sampler's own weight copy
(`rl.sync`: bf16, or fp8-rounded kernels with `rl.sync.quantizer=fp8`; experiments/calibrated_is).

Determinism: the noise of decode step i uses key_i = fold_in(noise_key, i), noise_key = fold_in(key,
`rlkit.rollout.sampler.NOISE_STREAM`) of the sampling key, so a run is a function of its key, and the
sampler's uniforms (drawn from `key` itself) are exactly those of an unperturbed run: with the same key,
rollouts with and without noise differ only through the noise.

Usage: `generate_with_mismatch(model, params, prompt, mask, key, cfg, Mismatch(dtype="bfloat16",
noise_scale=0.3, noise_kind="tail"))`, or in a run config the `rl.rollout_mismatch` section
(`mismatch_defaults`, `from_config`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections

from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.core.types import Rollout
from rlkit.models.transformer import Transformer, as_dtype
from rlkit.rollout.sampler import SamplingConfig, generate, processed_logprobs

Array = jax.Array

NOISE_KINDS = ("uniform", "tail")
DTYPES = ("", "float32", "bfloat16", "float16")   # "" = the policy's own compute dtype


@dataclasses.dataclass(frozen=True)
class Mismatch:
  """How the sampler's copy of the policy differs from the trainer's. Hashable (frozen)."""
  dtype: str = ""               # compute dtype of the sampler's copy; "" = the policy's own
  noise_scale: float = 0.0      # σ: std of the Gaussian noise on the raw logits of every decode step
  noise_kind: str = "uniform"   # "uniform": σ z_v on every entry; "tail": σ (1 - p_v) z_v

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"Unknown rollout mismatch dtype={self.dtype!r}; use one of {list(DTYPES)} "
                       f"(\"\" keeps the policy's compute dtype).")
    scale = self.noise_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
      raise ValueError(f"rollout mismatch noise_scale={scale!r} must be a finite number >= 0 (0: no noise).")
    if self.noise_kind not in NOISE_KINDS:
      raise ValueError(f"Unknown rollout mismatch noise_kind={self.noise_kind!r}; use one of {list(NOISE_KINDS)}.")

  @property
  def active(self) -> bool:
    """Whether sampling may differ from the policy's own: another dtype requested, or noise."""
    return self.dtype != "" or self.noise_scale > 0

  def logits_hook(self, cfg: SamplingConfig) -> Optional[LogitNoise]:
    """The sampler's `perturb` hook for sampling with `cfg` (None without noise: the plain hot loop)."""
    if self.noise_scale == 0:
      return None
    return LogitNoise(float(self.noise_scale), self.noise_kind, cfg)


@dataclasses.dataclass(frozen=True)
class LogitNoise:
  """`perturb(logits [B, V] float32, key) -> logits`: the noise of one decode step. Hashable, so it can be a
  static argument of the jitted sampler. `sampling` is the sampler's config: "tail" weighs entry v by
  1 - p_v under the distribution it processes to (None: plain softmax)."""
  scale: float
  kind: str = "uniform"
  sampling: Optional[SamplingConfig] = None

  def __post_init__(self):
    Mismatch(noise_scale=self.scale, noise_kind=self.kind)   # the same checks, the same messages

  def __call__(self, logits: Array, key: Array) -> Array:
    x = logits.astype(jnp.float32)
    z = jax.random.normal(key, x.shape, jnp.float32)
    if self.kind == "uniform":
      return x + self.scale * z
    logp = jax.nn.log_softmax(x, axis=-1) if self.sampling is None else processed_logprobs(x, self.sampling)
    # The weight is part of the simulated engine, not of any objective: no gradient through p.
    return x + self.scale * (1.0 - jax.lax.stop_gradient(jnp.exp(logp))) * z


def sampling_model(model: Transformer, mismatch: Mismatch) -> Transformer:
  """The module the sampler runs: `model` itself, or a copy computing in `mismatch.dtype`.

  Only the compute dtype changes; `param_dtype` stays, so the trainer's params tree (shapes and dtypes) is
  used as is: every weight is cast to the compute dtype where it is used, as with bf16-served weights (the
  KV cache follows the compute dtype too). Logits come out in float32 either way.
  """
  if mismatch.dtype in ("", model.cfg.dtype):
    return model
  as_dtype(mismatch.dtype)
  return Transformer(model.cfg.replace(dtype=mismatch.dtype))


def generate_with_mismatch(model: Transformer, params: Any, prompt: Array, prompt_mask: Array, key: Array,
                           cfg: SamplingConfig, mismatch: Mismatch,
                           group_ids: Optional[Array] = None) -> Rollout:
  """`rlkit.rollout.sampler.generate` with the perturbed copy of the policy; the Rollout's log-probs are the
  perturbed distribution's (the behaviour policy). An inactive `mismatch` is exactly `generate`."""
  return generate(sampling_model(model, mismatch), params, prompt, prompt_mask, key, cfg, group_ids,
                  perturb=mismatch.logits_hook(cfg))


def mismatch_defaults() -> ml_collections.ConfigDict:
  """The `rl.rollout_mismatch` section: simulated trainer/engine mismatch of the sampler (off by default)."""
  c = ml_collections.ConfigDict()
  c.dtype = ""                  # sampler's compute dtype: "" (the policy's) | float32 | bfloat16 | float16
  c.noise_scale = 0.0           # std of Gaussian noise on the sampler's raw logits, every decode step (0: none)
  c.noise_kind = "uniform"      # uniform: same std on every token | tail: std x (1 - p), p = sampling prob
  return c


def from_config(section: ml_collections.ConfigDict) -> Mismatch:
  """The `Mismatch` of a `rl.rollout_mismatch` section (validated)."""
  return Mismatch(dtype=str(section.dtype), noise_scale=float(section.noise_scale),
                  noise_kind=str(section.noise_kind))


def _check_section(stage, name: str) -> None:
  try:
    from_config(stage.rollout_mismatch)
  except ValueError as e:
    raise ValueError(f"{name}.rollout_mismatch: {e}") from None


RL_SECTIONS.add("rollout_mismatch", Section(mismatch_defaults, _check_section,
                                            doc="a simulated inference engine: the sampler's perturbed copy"))
