"""DiffusionART as a `gen_rl` method (`method='art'`; OUR DESIGN, methods/embodied.md §1.2, the pure pieces in
rlkit/diffusion/art.py; KlingAI's paper was not available to us). One iteration:

  1. sample: G Euler (ODE) samples per prompt from the sampling copy theta_old (an EMA of theta, `old_decay`)
  2. advantages: rewards z-scored within each prompt's group, clipped to +-adv_clip (zero groups counted)
  3. `updates` steps, each: per-prompt directions d_c = -grad sum_i A_ci FM(theta; x_ci, c, s, eps) at `draws`
     fresh (s, eps) per sample (the advantage split over them), capped at norm `kappa`, PCGrad'ed when `pcgrad`,
     averaged to D; the shared update step takes -D as the gradient (a linear surrogate -<sg(D), theta>, so the
     optimizer chain, clipping and non-finite guard are the shared ones)
  4. theta_old <- old_decay theta_old + (1 - old_decay) theta
  5. every `drift_every` iterations: delta = the relative velocity gap to the reference on a fixed probe (made
     at the start from `probe_samples` reference samples per condition, s ~ U(0, 1)); h = the gain of the mean
     reward since the last check (the first: over the reference's first batch) per unit of drift added since then
     (infinite when the drift did not grow);
     with `restore`, alpha = restoration_alpha(delta, h, ...) < 1 moves theta and theta_old to
     theta_ref + alpha (theta - theta_ref) and scales Adam's moments (m by alpha, v by alpha^2), and the drift is
     measured again. `restore=False` is the no-restoration arm: the drift is measured and logged, never acted on.

That theta_old restores with theta is our choice (Elastic Reset resets its EMA too). NFEs per sample row: the
K sampler steps, 3 per draw per update (forward and backward), 2 per probe row per drift measurement (theta's
and the reference's forward), and the probe's K sampler steps once at the start.
Metrics: art/drift (the last measured), art/gain_per_drift, art/alpha, art/restorations, art/clipped,
art/conflicts, art/direction_norm, zero_groups.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import optax

from rlkit.core.errors import ConfigError
from rlkit.core.types import Metric
from rlkit.diffusion import art
from rlkit.diffusion.gen_methods import (GEN_METHODS, GenMethod, GenSetup, Outcome, advantages, check_groups,
                                         copy_tree, one_hot_rows, soft_update)
from rlkit.models.flow import interpolate, sample
from rlkit.train.phases.update import reduce_over_steps
from rlkit.train.steps import combine_metrics, make_update_step


def art_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.updates = 1                 # optimizer steps per iteration (fresh (s, eps) draws each)
  c.draws = 4                   # (s, eps) draws per sample in a direction
  c.kappa = 1.0                 # per-prompt direction norm cap
  c.pcgrad = False              # remove conflicting components between prompts (PCGrad)
  c.old_decay = 0.5             # theta_old <- decay theta_old + (1 - decay) theta (0: sample with theta)
  c.adv_clip = 5.0              # advantages clipped to +-this
  c.restore = True              # drift-adaptive restoration (False: the no-restoration arm, drift only logged)
  c.drift_every = 5             # iterations between drift checks
  c.probe_samples = 16          # reference samples per condition in the fixed drift probe
  c.tau_hi = 0.5                # restore when the drift delta exceeds this ...
  c.h_min = float("-inf")       # ... or the reward gained per unit of drift falls below this (-inf: never; a
                                # batch's reward is noisy: 0 fired on half the checks of a toy2d run)
  c.tau_target = 0.25           # alpha = clip(sqrt(tau_target / delta), alpha_min, 1)
  c.alpha_min = 0.2             # a restoration keeps at least this share of theta - theta_ref
  return c


def _validate(section, name: str) -> None:
  a = section.art
  check_groups(section, name, "art")
  for key in ("updates", "draws", "drift_every", "probe_samples"):
    if a[key] < 1:
      raise ConfigError(f"{name}.art.{key}={a[key]} must be >= 1.")
  if a.kappa <= 0 or a.adv_clip <= 0 or a.tau_hi <= 0 or a.tau_target <= 0 or not 0 < a.alpha_min <= 1 \
      or not 0 <= a.old_decay < 1:
    raise ConfigError(f"{name}.art: kappa, adv_clip, tau_hi and tau_target > 0, 0 < alpha_min <= 1 and "
                      f"0 <= old_decay < 1, got {a.to_dict()}.")


def _init(ref, setup: GenSetup, key):
  cfg, fc, conditions = setup.section, setup.flow, setup.conditions
  n = conditions * cfg.art.probe_samples
  k_x, k_s, k_eps = jax.random.split(key, 3)
  cond = jax.nn.one_hot(jnp.repeat(jnp.arange(conditions), cfg.art.probe_samples), conditions, dtype=jnp.float32)
  x = sample(ref, fc, cond, k_x, cfg.rollout_steps)
  s = jax.random.uniform(k_s, (n,))
  probe = {"a_s": interpolate(x, jax.random.normal(k_eps, x.shape), s), "s": s, "cond": cond}
  f32 = lambda v: jnp.asarray(v, jnp.float32)          # noqa: E731
  return {"old": copy_tree(ref), "probe": probe, "drift": f32(0.0), "check_drift": f32(0.0),
          "check_reward": f32(math.nan), "window": f32(0.0), "window_n": jnp.int32(0),
          "restorations": jnp.int32(0), "alpha": f32(1.0), "gain": f32(math.inf)}, n * cfg.rollout_steps


def _build(setup: GenSetup):
  cfg, fc, conditions = setup.section, setup.flow, setup.conditions
  a, k, p, group, dim = cfg.art, cfg.rollout_steps, cfg.prompts, cfg.group_size, fc.action_dim
  m = group * a.draws

  def loss_fn(params, mb, step_inputs):
    dirs = art.prompt_directions(params, fc, mb["cond"], mb["x0"], mb["adv"], mb["s"], mb["eps"])
    d, stats = art.aggregate(dirs, a.kappa, a.pcgrad)
    d = jax.lax.stop_gradient(d)
    inner = sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(d), jax.tree.leaves(params)))
    loss = jax.lax.stop_gradient(inner) - inner        # value 0, gradient -D
    return loss, {"art/clipped": Metric(stats["clipped"]), "art/conflicts": Metric(stats["conflicts"]),
                  "art/direction_norm": Metric(optax.global_norm(d))}
  step_fn = make_update_step(loss_fn, setup.tx, 1, lambda b: {}, setup.path)

  @jax.jit
  def collect(old, ids, key):
    rows, cond = one_hot_rows(ids, group, conditions)
    x = sample(old, fc, cond, key, k)
    return x, setup.score(x[:, 0], rows).reshape(p, group)

  @jax.jit
  def draws(x, adv, ids, key):
    k_s, k_eps = jax.random.split(key)
    x0 = jnp.repeat(x.reshape(p, group, 1, dim), a.draws, axis=1)                     # [P, G M, 1, D]
    return {"cond": jax.nn.one_hot(ids, conditions, dtype=jnp.float32), "x0": x0,
            "adv": jnp.repeat(adv, a.draws, axis=1) / a.draws, "s": jax.random.uniform(k_s, (p, m)),
            "eps": jax.random.normal(k_eps, x0.shape)}

  drift = jax.jit(lambda params, ref, probe: art.drift(params, ref, fc, probe))
  probe_rows = conditions * a.probe_samples

  def iteration(state, ids, key):
    k_collect, k_update = jax.random.split(key)
    ms = dict(state["method"])
    x, rewards = collect(ms["old"], ids, k_collect)
    adv, zero = advantages(rewards, a.adv_clip)
    train, sums, skipped = state["train"], None, []
    for u in range(a.updates):
      train, out = step_fn(train, draws(x, adv, ids, jax.random.fold_in(k_update, u)), {})
      skipped.append(int(jax.device_get(out["skipped_updates"].value)))
      sums = out if sums is None else combine_metrics(sums, out)
    metrics = reduce_over_steps(sums, a.updates)
    nfe = p * group * (k + 3 * a.draws * a.updates)
    ms["old"] = soft_update(ms["old"], train.params, a.old_decay)
    reward = float(jnp.mean(rewards))
    if math.isnan(float(ms["check_reward"])):          # the first batch: the reference's reward, the baseline
      ms["check_reward"] = jnp.float32(reward)
    ms["window"], ms["window_n"] = ms["window"] + reward, ms["window_n"] + 1
    if int(ms["window_n"]) >= a.drift_every:
      delta = float(drift(train.params, state["ref"], ms["probe"]))
      nfe += 2 * probe_rows
      mean_reward = float(ms["window"]) / int(ms["window_n"])
      grown = delta - float(ms["check_drift"])
      gain = (mean_reward - float(ms["check_reward"])) / grown if grown > 0 else math.inf
      alpha = art.restoration_alpha(delta, gain, a.tau_hi, a.tau_target, a.h_min, a.alpha_min) if a.restore else 1.0
      if alpha < 1.0:
        params, opt_state = art.restore(train.params, state["ref"], train.opt_state, alpha)
        train = train._replace(params=params, opt_state=opt_state)
        ms["old"] = jax.tree.map(lambda o, r: r + alpha * (o - r), ms["old"], state["ref"])
        ms["restorations"] = ms["restorations"] + 1
        delta = float(drift(train.params, state["ref"], ms["probe"]))
        nfe += 2 * probe_rows
      ms.update(drift=jnp.float32(delta), check_drift=jnp.float32(delta), check_reward=jnp.float32(mean_reward),
                window=jnp.float32(0.0), window_n=jnp.int32(0), alpha=jnp.float32(alpha), gain=jnp.float32(gain))
    metrics.update({"zero_groups": int(zero), "art/drift": float(ms["drift"]), "art/alpha": float(ms["alpha"]),
                    "art/restorations": int(ms["restorations"])})
    if math.isfinite(float(ms["gain"])):               # infinite while the drift has not grown: left out of the row
      metrics["art/gain_per_drift"] = float(ms["gain"])
    return {**state, "train": train, "method": ms}, Outcome(x.reshape(p, group, dim), rewards, metrics, skipped, nfe)
  return iteration


GEN_METHODS.add("art", GenMethod(sections={"art": art_defaults}, validate=_validate,
                                 update_steps=lambda section: section.art.updates, init=_init, build=_build))
