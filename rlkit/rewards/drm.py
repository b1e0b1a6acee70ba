"""Diffusion reward model (DRM): the reward of a response as a conditional density, learned by DDPM on
multi-annotator ratings, sampled in a few deterministic DDIM steps.

DESIGN, ../shared/methods/llm.md §11: this model is our proposal, not a paper's method (the point, Gaussian and
quantile heads it is compared with, rlkit/rewards/reward_heads.py, are the FOUND baselines). With z = (r -
rating_mean) / rating_std a rating in unit scale, cond e [N, D] a pooled embedding of (prompt, response) and
ᾱ_τ a noise schedule over τ = 0..T-1:

  forward   z_τ = √ᾱ_τ z_0 + √(1 - ᾱ_τ) ε,          ε ~ N(0, 1),  τ ~ U{0..T-1}
  loss      E ‖ε − ε_φ(z_τ, τ, e)‖²                  over every observed rating of every row
  DDIM      ẑ_0 = (z_τ − √(1-ᾱ_τ) ε̂) / √ᾱ_τ,  z_τ' = √ᾱ_τ' ẑ_0 + √(1-ᾱ_τ') ε̂     (η = 0; ᾱ after the last step: 1)

ε_φ is `DiffusionRewardHead`: an MLP on [z_τ, sinusoidal embedding of τ] whose every hidden layer is modulated
by FiLM from e, h ← silu(W h · (1 + γ(e)) + β(e)). Registered as REWARD_HEADS["diffusion"]; its samples feed
the same metrics and risk functionals (mean, quantile, CVaR, std penalty) as every other head.

Choices (ours):
- Schedules end at ᾱ_{T-1} = alpha_bar_min (default 0.01), not at ≈0. With ε-prediction, DDIM turns an error δ
  in ε̂ into an error (σ_τ − σ_τ') δ in the unit-scale rating, σ = √((1−ᾱ)/ᾱ). From the textbook end point
  (cosine, β capped at 0.999: ᾱ ≈ 2e-7, σ ≈ 2000) a 10-step sampler put 80% of the mass in one of two equal
  modes (W1 1.5 on the bimodal test data); the same training with σ_max = 10 sampled both (W1 0.15). Starting
  from N(0, 1) then costs little in unit scale: z_{T-1} has variance ᾱ·Var z_0 + 1 − ᾱ ≈ 1, mean √ᾱ·E z_0 ≈ 0.
- "cosine" (default) is Nichol & Dhariwal's ᾱ with its time axis shortened to reach alpha_bar_min; "linear" is
  DDPM's linear β, its start rescaled by 1000/T, its end solved for alpha_bar_min.
- The sampler visits `steps` timesteps evenly spaced from T-1 down to 0 and clips ẑ_0 to ±clip_z unit scales
  (then re-derives ε̂ from it), a guard for conditions far from the training data, where ε̂ extrapolates.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.rewards.reward_heads import (RATING_BATCH, SCALE_CHECKS, masked_mean, observed_ratings,
                                        one_of, positive_float, positive_int, register_head)

SCHEDULES = ("cosine", "linear")


def alphas_bar_schedule(kind: str, num_timesteps: int, alpha_bar_min: float = 0.01) -> np.ndarray:
  """ᾱ_τ for τ = 0..T-1 (float32 [T]), decreasing from ≈1 to ᾱ_{T-1} = alpha_bar_min.

  cosine  ᾱ(u) = f(u · u_max) / f(0), f(u) = cos²((u + s)/(1 + s) · π/2), u = (τ + 1)/T, s = 0.008 (Nichol &
          Dhariwal 2021), with u_max < 1 solved so that ᾱ(1) = alpha_bar_min
  linear  ᾱ_τ = Π_{k<=τ} (1 − β_k), β linear from 1e-4 · 1000/T (DDPM's start, rescaled to T steps) up to the end
          value that gives ᾱ_{T-1} = alpha_bar_min (bisection)
  """
  if kind not in SCHEDULES:
    raise ValueError(f"noise schedule {kind!r} is not one of {list(SCHEDULES)}.")
  if not 0.0 < alpha_bar_min < 1.0:
    raise ValueError(f"alpha_bar_min={alpha_bar_min!r} must lie in (0, 1).")
  if num_timesteps == 1:
    return np.array([alpha_bar_min], np.float32)
  if kind == "cosine":
    s = 0.008                       # keeps β_0 from vanishing
    f0 = np.cos(s / (1 + s) * np.pi / 2) ** 2
    u_max = 2 / np.pi * np.arccos(np.sqrt(alpha_bar_min * f0)) * (1 + s) - s
    u = np.arange(1, num_timesteps + 1, dtype=np.float64) / num_timesteps
    alphas_bar = np.cos((u * u_max + s) / (1 + s) * np.pi / 2) ** 2 / f0
  elif kind == "linear":
    beta_start = min(1e-4 * 1000 / num_timesteps, 0.5 * (1 - alpha_bar_min ** (1 / num_timesteps)))
    betas = lambda end: np.linspace(beta_start, end, num_timesteps)
    lo, hi = beta_start, 1.0
    for _ in range(100):            # log ᾱ_{T-1} decreases in the end value: bisect to alpha_bar_min
      mid = (lo + hi) / 2
      lo, hi = (mid, hi) if np.log1p(-betas(mid)).sum() > np.log(alpha_bar_min) else (lo, mid)
    alphas_bar = np.cumprod(1.0 - betas((lo + hi) / 2))
  return alphas_bar.astype(np.float32)


def ddim_timesteps(num_timesteps: int, steps: int) -> np.ndarray:
  """The `steps` timesteps DDIM visits, evenly spaced from T-1 down to 0 (int32, strictly decreasing)."""
  return np.round(np.linspace(num_timesteps - 1, 0, steps)).astype(np.int32)


def timestep_embedding(t: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
  """Sinusoidal embedding [N, dim] of (possibly fractional) timesteps t [N]: [cos(t ω_k), sin(t ω_k)] with
  ω_k = max_period^(-k / (dim/2)), k < dim/2 (odd dim: a zero column pads)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  angles = jnp.asarray(t, jnp.float32)[:, None] * freqs[None, :]
  emb = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
  return jnp.pad(emb, ((0, 0), (0, dim - 2 * half)))


class NoiseSchedule(NamedTuple):
  """What the loss and the sampler need from a head's config, as arrays (constants under jit)."""
  alphas_bar: jax.Array          # [T]
  timesteps: jax.Array           # [steps] int32, the DDIM path
  rating_mean: float
  rating_std: float
  clip_z: float


class DiffusionRewardHead(nn.Module):
  """ε_φ(z_τ [N], τ [N] int, cond [N, D]) -> ε̂ [N], the DRM denoiser, plus its fixed config: `num_timesteps`
  T and `schedule` define ᾱ, `steps` the DDIM sampler, (`rating_mean`, `rating_std`) the unit scale."""
  hidden: int = 128
  depth: int = 3
  time_dim: int = 32
  num_timesteps: int = 100
  schedule: str = "cosine"
  alpha_bar_min: float = 0.01
  steps: int = 10
  clip_z: float = 5.0
  rating_mean: float = 0.0
  rating_std: float = 1.0

  @nn.compact
  def __call__(self, z_t: jax.Array, t: jax.Array, cond: jax.Array) -> jax.Array:
    cond = jnp.asarray(cond, jnp.float32)
    # τ on a 0..1000 grid whatever T is, so the embedding's frequencies cover the same range for every T.
    t_emb = timestep_embedding(jnp.asarray(t, jnp.float32) * (1000.0 / self.num_timesteps), self.time_dim)
    h = jnp.concatenate([jnp.asarray(z_t, jnp.float32)[:, None], t_emb], axis=-1)
    for _ in range(self.depth):
      # FiLM at every layer: the rating density is a different function of z_τ for each condition, and
      # modulating only the input layer would leave later layers shared across conditions.
      gamma, beta = jnp.split(nn.Dense(2 * self.hidden)(cond), 2, axis=-1)
      h = nn.silu(nn.Dense(self.hidden)(h) * (1.0 + gamma) + beta)
    return nn.Dense(1)(h)[:, 0]

  def noise_schedule(self) -> NoiseSchedule:
    return NoiseSchedule(jnp.asarray(alphas_bar_schedule(self.schedule, self.num_timesteps, self.alpha_bar_min)),
                         jnp.asarray(ddim_timesteps(self.num_timesteps, self.steps)),
                         self.rating_mean, self.rating_std, self.clip_z)


def drm_loss(params, apply, key, batch):
  """ε-prediction loss E‖ε − ε_φ(z_τ, τ, e)‖² with one (τ, ε) draw per observed rating of `batch`."""
  sched = apply(params, method="noise_schedule")
  ratings, mask = observed_ratings(batch)
  cond = jnp.asarray(batch["cond"], jnp.float32)
  n, a = ratings.shape
  t_key, eps_key = jax.random.split(key)
  t = jax.random.randint(t_key, (n * a,), 0, sched.alphas_bar.shape[0])
  eps = jax.random.normal(eps_key, (n * a,))
  z0 = (ratings.reshape(-1) - sched.rating_mean) / sched.rating_std
  ab = sched.alphas_bar[t]
  z_t = jnp.sqrt(ab) * z0 + jnp.sqrt(1.0 - ab) * eps
  eps_hat = apply(params, z_t, t, jnp.repeat(cond, a, axis=0))
  loss = masked_mean(jnp.square(eps - eps_hat), mask.reshape(-1))
  return loss, {"eps_mse": loss}


def ddim_sample(params, apply, key, cond: jax.Array, n: int) -> jax.Array:
  """n reward samples per row of cond [N, D] -> [N, n] in rating units: deterministic DDIM (η = 0) along the
  head's `steps` timesteps, one `lax.scan`; the key only draws the starting noise z_{T-1}."""
  sched = apply(params, method="noise_schedule")
  cond = jnp.repeat(jnp.asarray(cond, jnp.float32), n, axis=0)           # row i's samples: rows i·n..i·n+n-1
  ts = sched.timesteps
  alpha_now = sched.alphas_bar[ts]
  alpha_next = jnp.concatenate([alpha_now[1:], jnp.ones((1,), jnp.float32)])

  def ddim_step(z, xs):
    t, ab, ab_next = xs
    eps_hat = apply(params, z, jnp.full(z.shape, t), cond)
    z0_hat = jnp.clip((z - jnp.sqrt(1.0 - ab) * eps_hat) / jnp.sqrt(ab), -sched.clip_z, sched.clip_z)
    eps_hat = (z - jnp.sqrt(ab) * z0_hat) / jnp.sqrt(1.0 - ab)         # consistent with the clipped ẑ_0
    return jnp.sqrt(ab_next) * z0_hat + jnp.sqrt(1.0 - ab_next) * eps_hat, None

  z, _ = jax.lax.scan(ddim_step, jax.random.normal(key, (cond.shape[0],)), (ts, alpha_now, alpha_next))
  return (sched.rating_mean + sched.rating_std * z).reshape(-1, n)


def init_diffusion(module: nn.Module, key: jax.Array, cond: jax.Array) -> dict:
  n = cond.shape[0]
  return module.init(key, jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.int32), jnp.asarray(cond, jnp.float32))


def unit_interval(value):
  return None if positive_float(value) is None and value < 1 else "a number in (0, 1)"


def steps_within_timesteps(config) -> tuple[str, str] | None:
  if config["steps"] > config["num_timesteps"]:
    return "steps", (f"is {config['steps']}, more than num_timesteps={config['num_timesteps']}; DDIM visits a "
                     "subset of the training timesteps, so give steps <= num_timesteps")
  return None


register_head(
    "diffusion", DiffusionRewardHead,
    checks={"hidden": positive_int, "depth": positive_int, "time_dim": positive_int,
            "num_timesteps": positive_int, "schedule": one_of(*SCHEDULES), "alpha_bar_min": unit_interval,
            "steps": positive_int, "clip_z": positive_float, **SCALE_CHECKS},
    init=init_diffusion, loss=drm_loss, samples=ddim_sample, batch_keys=RATING_BATCH,
    validate=steps_within_timesteps)
