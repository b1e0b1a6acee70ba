"""Online RL methods for a conditional flow generator (registry GEN_METHODS, `<gen_rl stage>.method`; methods/
embodied.md §1.1-1.2): how one iteration samples, scores and updates. The stage (rlkit/diffusion/gen_rl_stage.py)
draws the prompts, counts the network evaluations and logs; a method plugs in by registering a `GenMethod`:

  sections       {section name: defaults()}: the method's own fields of the stage section (shared by name)
  validate(section, name)               ConfigError for bad fields
  update_steps(section) -> int          optimizer steps per iteration (what learning-rate schedules span)
  init(ref, setup, key) -> (state, nfe) the method's own state (a dict, {} for none) and what making it cost
  build(setup) -> iteration(state, ids [P], key) -> (state, Outcome)   the jitted pieces, built once per run

Every method samples `group_size` rows for each of the iteration's `prompts` conditions and counts its network
evaluations (NFEs) per sample row: a forward is 1, a backward 2.

  flow_grpo    Flow-GRPO (Liu et al. 2025; its release read, not copied): K SDE steps (rlkit/diffusion/sde.py) from
               independent noise, the per-step Gaussian log-densities (averaged over the D dims when `dim_mean`,
               as the release does: it sets the clip's scale), z-scored group advantages clipped to +-adv_clip, and
               `epochs` x `minibatches` steps of the shared clipped loss (ppo_clip, one ratio per denoising step)
               through `flow_grpo_policy` and the shared update step. No KL term (the release's default beta=0).
  dance_grpo   DanceGRPO (Xue et al. 2025; its public training script read): as flow_grpo, but every group starts
               from one shared initial noise, each trajectory trains a random subset of round-down(K x
               `timestep_fraction`) of its K steps (its other steps cost nothing), and the SDE's noise is the
               release's constant sigma = `eta` per sqrt(step) instead of Flow-GRPO's a sqrt((1-s)/s).
  nft          DiffusionNFT (rlkit/diffusion/nft.py): Euler (ODE) samples of the sampling copy theta_old, the
               optimality r from the clipped group advantage, `epochs` x `minibatches` steps of the negative-aware
               loss at `draws` fresh (s, eps) per sample; theta_old <- decay theta_old + (1 - decay) theta after.
  draft        DRaFT-K (rlkit/diffusion/draft.py): one step of -mean r(x) through the Euler sampler, the gradient
               through its last `k` steps only; needs a differentiable reward (a ConfigError otherwise).
  art          DiffusionART, OUR DESIGN (rlkit/diffusion/art.py, methods/embodied.md §1.2): see gen_art.py.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from rlkit.core.errors import ConfigError
from rlkit.core.registry import Registry
from rlkit.core.types import Metric, TrainBatch
from rlkit.diffusion.art import group_advantage
from rlkit.diffusion.draft import draft_sample
from rlkit.diffusion.flow_grpo import SdeConfig, flow_grpo_policy, sde_sample
from rlkit.diffusion.gen_rewards import GEN_REWARDS
from rlkit.diffusion.nft import nft_loss, optimality
from rlkit.diffusion.sde import gaussian_logp, step_moments
from rlkit.models.flow import FlowConfig, FlowExpert, sample
from rlkit.optim.trainable import GradientPath
from rlkit.train.phases.update import reduce_over_steps
from rlkit.train.policy import PolicyAdapter
from rlkit.train.rl_config import rl_defaults
from rlkit.train.steps import combine_metrics, default_step_inputs, make_policy_step, make_update_step

Array = jax.Array


class GenSetup(NamedTuple):
  section: ml_collections.ConfigDict
  flow: FlowConfig
  conditions: int
  score: Callable[[Array, Array], Array]        # the reward: (x [N, D], cond [N]) -> [N]
  tx: optax.GradientTransformation
  path: GradientPath


class Outcome(NamedTuple):
  x: Array                      # [P, G, D] the iteration's samples
  rewards: Array                # [P, G] their rewards
  metrics: dict                 # {name: float}
  skipped: list                 # per update step: was it skipped (non-finite)
  nfe: int                      # network evaluations of the iteration (forward-equivalents)


class GenMethod(NamedTuple):
  sections: dict
  validate: Callable
  update_steps: Callable[[Any], int]
  init: Callable
  build: Callable


GEN_METHODS: Registry[GenMethod] = Registry("generative RL method")


# ------------------------------------------------------------------------------------------------ shared pieces

def one_hot_rows(ids: Array, group: int, conditions: int) -> tuple[Array, Array]:
  """(condition ids [P G], their one-hots [P G, C]) of prompts ids [P], each repeated for its group."""
  rows = jnp.repeat(ids, group)
  return rows, jax.nn.one_hot(rows, conditions, dtype=jnp.float32)


def copy_tree(tree: Any) -> Any:
  """Fresh buffers (the update steps donate their states: a copy shared with another entry would die with it)."""
  return jax.tree.map(jnp.copy, tree)


@jax.jit
def soft_update(old: Any, new: Any, decay) -> Any:
  return jax.tree.map(lambda o, n: decay * o + (1.0 - decay) * n, old, new)


def advantages(rewards: Array, clip: float) -> tuple[Array, Array]:
  """(group z-scores [P, G] clipped to +-clip, the number of groups whose rewards are all equal)."""
  adv, zero = group_advantage(rewards)
  return jnp.clip(adv, -clip, clip), zero


def shuffled_updates(step_fn, train, batch, key, epochs: int, minibatches: int, inputs: dict):
  """`epochs` passes of `minibatches` shuffled steps: (train state, metrics {name: float} combined over the steps,
  per-step skipped flags, the first step's metrics {name: float}: the update before any change, whose ratio is 1
  when the sampler and the trainer agree)."""
  n = jax.tree.leaves(batch)[0].shape[0]
  sums, first, skipped = None, None, []
  for epoch in range(epochs):
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 7_000 + epoch), n))
    for part in np.split(perm, minibatches):
      train, m = step_fn(train, jax.tree.map(lambda x: x[part], batch), inputs)
      skipped.append(m["skipped_updates"].value)
      first = reduce_over_steps(m, 1) if first is None else first
      sums = m if sums is None else combine_metrics(sums, m)
  return train, reduce_over_steps(sums, epochs * minibatches), [int(s) for s in jax.device_get(skipped)], first


def _positive(section, name: str, keys: tuple, minimum=1) -> None:
  for key in keys:
    if section[key] < minimum:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= {minimum}.")


def check_groups(section, name: str, method: str) -> None:
  if section.group_size < 2:
    raise ConfigError(f"{name}.group_size={section.group_size}: {method} normalises rewards within a prompt's "
                      "group, which needs at least 2 samples; set group_size >= 2.")


def _splits(rows: int, minibatches: int, name: str, what: str) -> None:
  if rows % minibatches:
    raise ConfigError(f"{name}: {what} = {rows} rows do not split into {minibatches} equal minibatches; make them "
                      "a multiple.")


# ------------------------------------------------------------------------------------------- flow_grpo, dance_grpo

def grpo_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.noise_level = 0.7           # flow_grpo: a of the SDE's sigma = a sqrt((1 - s) / s) (the release's 0.7)
  c.clip = 1e-4                 # the ratio's clip range, both sides (the release's clip_range 1e-4)
  c.adv_clip = 5.0              # advantages clipped to +-this (the release's adv_clip_max)
  c.dim_mean = True             # log-densities averaged over the sample's D dims (the release), else summed
  c.epochs = 1                  # passes over the iteration's rows (the release's num_inner_epochs)
  c.minibatches = 2             # update steps per pass
  return c


def dance_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.eta = 0.3                   # the SDE's constant noise sigma (DanceGRPO's eta; 0.3 is our default)
  c.timestep_fraction = 0.6     # share of each trajectory's K steps trained, drawn at random per trajectory
  return c


def _grpo_validate(section, name: str) -> None:
  g = section.grpo
  check_groups(section, name, section.method)
  _positive(g, f"{name}.grpo", ("epochs", "minibatches"))
  _splits(section.prompts * section.group_size, g.minibatches, f"{name}.grpo", "prompts x group_size")
  if g.noise_level <= 0 or g.clip <= 0 or g.adv_clip <= 0:
    raise ConfigError(f"{name}.grpo: noise_level, clip and adv_clip must be > 0 (the SDE needs noise for its "
                      f"log-densities), got {g.to_dict()}.")


def _dance_validate(section, name: str) -> None:
  _grpo_validate(section, name)
  d = section.dance
  if d.eta <= 0 or not 0 < d.timestep_fraction <= 1:
    raise ConfigError(f"{name}.dance: eta > 0 and 0 < timestep_fraction <= 1, got {d.to_dict()}.")


def dance_steps(section) -> int:
  """T, the steps each DanceGRPO trajectory trains (at least 1)."""
  return max(1, int(section.rollout_steps * section.dance.timestep_fraction))


def constant_sigma_level(s: Array, ds: float, eta: float) -> Array:
  """The noise level a with which sde.py's sigma_at(s) = a sqrt((1 - s) / max(s, ds)) equals eta (DanceGRPO's
  constant sigma) at every s < 1."""
  return eta * jnp.sqrt(jnp.maximum(s, ds) / (1.0 - s))


def dance_chain(params, flow: FlowConfig, cond: Array, start: Array, key: Array, steps: int, eta: float):
  """(samples [B, 1, D], chain [B, K + 1, 1, D], log-densities [B, K]) of the constant-sigma SDE from `start`."""
  model, ds, x = FlowExpert(flow), 1.0 / steps, start
  links, logps = [x], []
  for k, kk in enumerate(jax.random.split(key, steps)):
    s = jnp.full((x.shape[0],), k, jnp.float32) / steps
    u = model.apply({"params": params}, x, s, cond)
    sc = s[:, None, None]
    mean, std = step_moments(x, u, sc, ds, constant_sigma_level(sc, ds, eta))
    x = mean + std * jax.random.normal(kk, x.shape)
    links.append(x)
    logps.append(gaussian_logp(x, mean, std, 2))
  return x, jnp.stack(links, axis=1), jnp.stack(logps, axis=1)


def dance_policy(flow: FlowConfig, steps: int, eta: float) -> PolicyAdapter:
  """Log-densities [N, T] of the chain's steps extras["steps"] [N, T] (their transitions from extras["chain"])."""
  model, ds = FlowExpert(flow), 1.0 / steps

  def forward(params, mb, keys):
    chain, idx, cond = mb.extras["chain"], mb.extras["steps"], mb.extras["cond"]
    n, t = idx.shape
    at = lambda i: jnp.take_along_axis(chain, i[:, :, None, None], axis=1).reshape((n * t,) + chain.shape[2:])  # noqa
    x, nxt = at(idx), at(idx + 1)
    s = idx.reshape(-1).astype(jnp.float32) / steps
    u = model.apply({"params": params}, x, s, jnp.repeat(cond, t, axis=0))
    sc = s[:, None, None]
    mean, std = step_moments(x, u, sc, ds, constant_sigma_level(sc, ds, eta))
    return gaussian_logp(nxt, mean, std, 2).reshape(n, t), {}
  return PolicyAdapter("dance_grpo", forward)


def _scaled(adapter: PolicyAdapter, scale: float) -> PolicyAdapter:
  def forward(params, mb, keys):
    logp, aux = adapter.forward(params, mb, keys)
    return logp * scale, aux
  return adapter._replace(forward=forward)


def _policy_batch(logp: Array, adv: Array, extras: dict) -> TrainBatch:
  """Rows = samples, columns = their trained denoising steps, each with its row's advantage."""
  n, r = logp.shape
  ones = jnp.ones((n, r), bool)
  return TrainBatch(tokens=jnp.zeros((n, r), jnp.int32), attention_mask=ones, loss_mask=ones, old_logp=logp,
                    rollout_logp=logp, advantages=jnp.broadcast_to(adv[:, None], (n, r)),
                    token_weights=jnp.ones((n, r)), group_ids=jnp.arange(n, dtype=jnp.int32),
                    row_source=jnp.zeros(n, jnp.int32), extras=extras)


def _grpo_build(setup: GenSetup, dance: bool):
  cfg, fc, conditions = setup.section, setup.flow, setup.conditions
  g, k = cfg.grpo, cfg.rollout_steps
  p, group, dim = cfg.prompts, cfg.group_size, fc.action_dim
  trained = dance_steps(cfg) if dance else k
  scale = 1.0 / dim if g.dim_mean else 1.0
  adapter = dance_policy(fc, k, cfg.dance.eta) if dance else flow_grpo_policy(fc, SdeConfig(k, g.noise_level))
  lcfg = rl_defaults()
  lcfg.update(policy_loss="ppo_clip", eps_low=g.clip, eps_high=g.clip, aggregation="token-mean",
              max_new_tokens=trained)
  step_fn = make_policy_step(_scaled(adapter, scale), setup.tx, lcfg, path=setup.path)
  inputs = default_step_inputs(lcfg)

  @jax.jit
  def collect(params, ids, key):
    rows, cond = one_hot_rows(ids, group, conditions)
    k_start, k_chain, k_steps = jax.random.split(key, 3)
    if dance:                   # one initial noise per group
      start = jnp.repeat(jax.random.normal(k_start, (p, 1, dim)), group, axis=0)
      x, chain, logp = dance_chain(params, fc, cond, start, k_chain, k, cfg.dance.eta)
      idx = jnp.argsort(jax.random.uniform(k_steps, (p * group, k)), axis=1)[:, :trained].astype(jnp.int32)
      logp, extras = jnp.take_along_axis(logp, idx, axis=1), {"cond": cond, "chain": chain, "steps": idx}
    else:
      x, chain, logp = sde_sample(params, fc, SdeConfig(k, g.noise_level), cond, k_chain)
      extras = {"cond": cond, "chain": chain}
    return x[:, 0], logp * scale, extras, setup.score(x[:, 0], rows).reshape(p, group)

  def iteration(state, ids, key):
    k_collect, k_update = jax.random.split(key)
    x, logp, extras, rewards = collect(state["train"].params, ids, k_collect)
    adv, zero = advantages(rewards, g.adv_clip)
    train, metrics, skipped, first = shuffled_updates(step_fn, state["train"], _policy_batch(logp, adv.reshape(-1),
                                                      extras), k_update, g.epochs, g.minibatches, inputs)
    metrics.update({"first_ratio": first["ratio_mean"], "first_clip_frac": first["clip_frac"],
                    "zero_groups": int(zero)})
    nfe = p * group * (k + 3 * g.epochs * trained)
    return {**state, "train": train}, Outcome(x.reshape(p, group, dim), rewards, metrics, skipped, nfe)
  return iteration


def _no_state(ref, setup, key):
  return {}, 0


GEN_METHODS.add("flow_grpo", GenMethod(
    sections={"grpo": grpo_defaults}, validate=_grpo_validate,
    update_steps=lambda section: section.grpo.epochs * section.grpo.minibatches,
    init=_no_state, build=lambda setup: _grpo_build(setup, dance=False)))
GEN_METHODS.add("dance_grpo", GenMethod(
    sections={"grpo": grpo_defaults, "dance": dance_defaults}, validate=_dance_validate,
    update_steps=lambda section: section.grpo.epochs * section.grpo.minibatches,
    init=_no_state, build=lambda setup: _grpo_build(setup, dance=True)))


# ------------------------------------------------------------------------------------------------------------ nft

def nft_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.beta = 1.0                  # the implicit policies' step beta (Flow-Factory's nft_beta default)
  c.adv_max = 5.0               # advantages clipped to +-this, r = A / adv_max / 2 + 1/2
  c.draws = 4                   # (s, eps) draws per sample per pass (the release trains several timesteps)
  c.epochs = 1                  # passes over the rows
  c.minibatches = 1             # update steps per pass
  c.old_decay = 0.5             # theta_old <- decay theta_old + (1 - decay) theta after each iteration (0: on-policy)
  return c


def _nft_validate(section, name: str) -> None:
  n = section.nft
  check_groups(section, name, "nft")
  _positive(n, f"{name}.nft", ("draws", "epochs", "minibatches"))
  _splits(section.prompts * section.group_size * n.draws, n.minibatches, f"{name}.nft", "prompts x group_size x draws")
  if n.beta <= 0 or n.adv_max <= 0 or not 0 <= n.old_decay < 1:
    raise ConfigError(f"{name}.nft: beta > 0, adv_max > 0 and 0 <= old_decay < 1, got {n.to_dict()}.")


def _with_old(ref, setup, key):
  return {"old": copy_tree(ref)}, 0


def _nft_build(setup: GenSetup):
  cfg, fc, conditions = setup.section, setup.flow, setup.conditions
  n, k, p, group, dim = cfg.nft, cfg.rollout_steps, cfg.prompts, cfg.group_size, fc.action_dim
  rows_n = p * group * n.draws

  def loss_fn(params, mb, step_inputs):
    loss, m = nft_loss(params, mb["old"], fc, mb["cond"], mb["x0"], mb["r"], mb["s"], mb["eps"], n.beta)
    return loss, {"nft/positive": Metric(m["positive"]), "nft/negative": Metric(m["negative"])}
  step_fn = make_update_step(loss_fn, setup.tx, 1, lambda b: {}, setup.path)

  @jax.jit
  def collect(old, ids, key):
    rows, cond = one_hot_rows(ids, group, conditions)
    x = sample(old, fc, cond, key, k)
    return x, cond, setup.score(x[:, 0], rows).reshape(p, group)

  @jax.jit
  def training_rows(x, cond, r, key):
    k_s, k_eps = jax.random.split(key)
    rep = lambda a: jnp.repeat(a, n.draws, axis=0)      # noqa: E731
    return {"x0": rep(x), "cond": rep(cond), "r": rep(r), "s": jax.random.uniform(k_s, (rows_n,)),
            "eps": jax.random.normal(k_eps, (rows_n,) + x.shape[1:])}

  def iteration(state, ids, key):
    k_collect, k_rows, k_update = jax.random.split(key, 3)
    old = state["method"]["old"]
    x, cond, rewards = collect(old, ids, k_collect)
    adv, zero = advantages(rewards, n.adv_max)
    batch = training_rows(x, cond, optimality(adv, n.adv_max).reshape(-1), k_rows)
    train, metrics, skipped, _ = shuffled_updates(lambda t, mb, i: step_fn(t, {**mb, "old": old}, i), state["train"],
                                                  batch, k_update, n.epochs, n.minibatches, {})
    metrics["zero_groups"] = int(zero)
    nfe = p * group * k + 4 * n.epochs * rows_n        # per draw: theta and theta_old forward, theta's backward
    state = {**state, "train": train, "method": {"old": soft_update(old, train.params, n.old_decay)}}
    return state, Outcome(x.reshape(p, group, dim), rewards, metrics, skipped, nfe)
  return iteration


GEN_METHODS.add("nft", GenMethod(
    sections={"nft": nft_defaults}, validate=_nft_validate,
    update_steps=lambda section: section.nft.epochs * section.nft.minibatches, init=_with_old, build=_nft_build))


# ---------------------------------------------------------------------------------------------------------- draft

def draft_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.k = 1                       # the last K Euler steps carry the gradient (1: DRaFT-1; rollout_steps: full DRaFT)
  return c


def _draft_validate(section, name: str) -> None:
  reward = section.reward.name
  spec = GEN_REWARDS.get(reward)
  if not spec.differentiable:
    usable = ", ".join(r for r in GEN_REWARDS.names() if GEN_REWARDS.get(r).differentiable)
    raise ConfigError(f"{name}.method='draft' backpropagates the reward, and {name}.reward.name={reward!r} has no "
                      f"gradient ({spec.why_not}); choose a differentiable reward ({usable}) or a method that only "
                      "scores samples (flow_grpo, dance_grpo, nft, art).")
  if not 0 <= section.draft.k <= section.rollout_steps:
    raise ConfigError(f"{name}.draft.k={section.draft.k} must be in [0, rollout_steps={section.rollout_steps}].")


def _draft_build(setup: GenSetup):
  cfg, fc, conditions = setup.section, setup.flow, setup.conditions
  k, p, group, dim, kk = cfg.rollout_steps, cfg.prompts, cfg.group_size, fc.action_dim, cfg.draft.k

  def loss_fn(params, mb, step_inputs):
    x = draft_sample(params, fc, mb["cond"], mb["eps"], k, kk)[:, 0]
    r = setup.score(x, mb["rows"])
    # the samples and rewards ride out as metrics (one step, nothing combines them): the stage logs them
    return -jnp.mean(r), {"samples": Metric(jax.lax.stop_gradient(x), "sum"),
                          "rewards": Metric(jax.lax.stop_gradient(r), "sum")}
  step_fn = make_update_step(loss_fn, setup.tx, 1, lambda b: {}, setup.path)

  def iteration(state, ids, key):
    rows, cond = one_hot_rows(ids, group, conditions)
    eps = jax.random.normal(key, (p * group, 1, dim))
    train, m = step_fn(state["train"], {"rows": rows, "cond": cond, "eps": eps}, {})
    x, r = m.pop("samples").value, m.pop("rewards").value
    skipped = [int(jax.device_get(m["skipped_updates"].value))]
    nfe = p * group * (k + 2 * kk)
    return {**state, "train": train}, Outcome(x.reshape(p, group, dim), r.reshape(p, group),
                                              reduce_over_steps(m, 1), skipped, nfe)
  return iteration


GEN_METHODS.add("draft", GenMethod(sections={"draft": draft_defaults}, validate=_draft_validate,
                                   update_steps=lambda section: 1, init=_no_state, build=_draft_build))
