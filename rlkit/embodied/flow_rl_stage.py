"""The `flow_rl` stage: PPO with GAE for a flow-matching action expert on a control environment, with the policy
likelihood of a registered flow method (`method`: FLOW_METHODS, rlkit/embodied/flow_methods.py: reinflow | fpo)
through the shared update step (its clipped losses, aggregation, non-finite guard and optimizers).

It starts from the preceding stage's expert (a `flow_bc` stage with the same `flow` fields), or from a fresh one
when it is the run's first stage. One iteration:
  1. collect: `num_envs` environments continue from where the last iteration left them; `decisions` times the
     policy draws a chunk for every environment (the method's `act`), the environment takes its H actions
     (rewards summed over them; a decision whose chunk ended an episode is terminal; an episode that ends inside a
     chunk restarts there and the rest of the chunk acts on the new one), and the critic values each decision's
     observation;
  2. advantages: GAE over the decisions (`gamma` and `lam` per decision), normalised over the batch
     (`normalize_advantages`); returns = advantages + values before the normalisation;
  3. update: `epochs` x `minibatches` PPO steps of the policy (rows: the decisions, R log-likelihood columns of the
     method, every column with its row's advantage) and as many steps of the critic's squared error to the returns.
State: {"train": the policy's TrainState, "critic": its TrainState, "obs", "env": the environments' batch}, so
a resumed stage continues the same episodes. Metrics: reward (per decision), success (the share of the episodes
that ended this iteration in success; `episodes` counts them), the policy's loss and clip statistics, critic/loss.
Evaluation: the expert's deterministic sampler, as `flow_bc` reports it. With `expert_lora.rank` > 0 only LoRA
adapters of the expert's kernels train (`targets`: the timestep modules, every kernel, or a regex), the expert's
base weights frozen (`flow_method`, `policy_optimizer`).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.errors import ConfigError
from rlkit.core.types import Metric, TrainBatch
from rlkit.embodied.bc_stage import StepIterator, check_env_fields, env_fields, env_of, evaluate_expert, flow_config, \
    flow_defaults
from rlkit.embodied import flow_lora
from rlkit.embodied.expert_source import expert_params
from rlkit.embodied.flow_methods import FLOW_METHODS, FlowMethod
from rlkit.embodied.flow_rl import gae
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.phases.update import ppo_updates
from rlkit.train.rl_config import rl_defaults
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import default_step_inputs, init_train_state, make_policy_step, make_update_step


def flow_rl_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "flow_rl"            # stage kind (registry STAGES)
  c.steps = 100                 # iterations (collect, advantages, update)
  env_fields(c)
  c.flow = flow_defaults()       # the expert's shape: the preceding flow_bc stage's
  c.method = "reinflow"         # registry FLOW_METHODS: reinflow (noise-injected chain) | fpo (CFM-loss ratio)
  c.chain = ml_collections.ConfigDict()
  c.chain.steps = 4             # denoising steps when acting (reinflow: the chain's K; fpo: the sampler's)
  c.chain.sigma_min = 0.05      # reinflow: the noise head's bounds
  c.chain.sigma_max = 0.3
  c.chain.hidden = 64           # reinflow: the noise head's width
  c.fpo = ml_collections.ConfigDict()
  c.fpo.draws = 8               # fpo: (s, eps) draws per row for the CFM loss
  c.fpo.noise = 0.1             # fpo: std of the Gaussian exploration noise on the sampled chunk
  c.expert_lora = ml_collections.ConfigDict()   # LoRA on the expert instead of training it whole
  c.expert_lora.rank = 0        # > 0: only adapters of the expert's kernels train (its other parts as usual)
  c.expert_lora.alpha = 1.0     # the adapters' scale alpha / rank
  c.expert_lora.targets = "all"  # timestep (time MLP and modulations) | all (every Dense kernel) | a path regex
  c.num_envs = 32               # environments stepped in parallel
  c.decisions = 8               # chunks each environment takes per iteration
  c.gamma = 0.99                # discount per decision
  c.lam = 0.95                  # GAE lambda
  c.normalize_advantages = True
  c.policy_loss = "ppo_clip"    # the shared losses (rlkit/objectives): ppo_clip | gspo | ...
  c.eps_low = 0.2               # clip range below 1
  c.eps_high = 0.2              # clip range above 1
  c.aggregation = "token-mean"  # over the R log-likelihood columns of the rows
  c.epochs = 4                  # passes over the batch per iteration
  c.minibatches = 4             # update steps per pass (policy and critic each)
  c.critic_hidden = 64          # the critic MLP's width (two hidden layers)
  c.eval_every = 0              # evaluate every N iterations (0: only at the end of the stage)
  c.max_skipped_updates = 10    # stop after this many policy steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  c.optimizer.lr = 1e-4
  c.critic_optimizer = optimizer_defaults()
  return c


def validate(section, name: str) -> None:
  check_env_fields(section, name)
  if section.method not in FLOW_METHODS:
    raise ConfigError(f"{name}.method={section.method!r} is not a flow method; choose one of "
                      f"{', '.join(FLOW_METHODS.names())}.")
  for key in ("num_envs", "decisions", "epochs", "minibatches", "critic_hidden"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  if (section.num_envs * section.decisions) % section.minibatches:
    raise ConfigError(f"{name}: num_envs x decisions = {section.num_envs * section.decisions} rows do not split "
                      f"into {name}.minibatches={section.minibatches} equal minibatches.")
  if section.chain.steps < 1 or not 0 < section.chain.sigma_min <= section.chain.sigma_max:
    raise ConfigError(f"{name}.chain: steps >= 1 and 0 < sigma_min <= sigma_max, got {section.chain.to_dict()}.")
  if section.fpo.draws < 1 or section.fpo.noise < 0:
    raise ConfigError(f"{name}.fpo: draws >= 1 and noise >= 0, got {section.fpo.to_dict()}.")
  if section.expert_lora.rank < 0 or section.expert_lora.alpha <= 0:
    raise ConfigError(f"{name}.expert_lora: rank >= 0 (0: off) and alpha > 0, got {section.expert_lora.to_dict()}.")
  if not (0 <= section.gamma <= 1 and 0 <= section.lam <= 1):
    raise ConfigError(f"{name}: gamma={section.gamma} and lam={section.lam} must be in [0, 1].")


class Critic(nn.Module):
  """A scalar MLP of its input (two swish layers of `hidden`): the value of an observation, or (acob) of an
  observation and chunk."""
  hidden: int

  @nn.compact
  def __call__(self, x):
    x = nn.swish(nn.Dense(self.hidden)(x))
    x = nn.swish(nn.Dense(self.hidden)(x))
    return nn.Dense(1)(x)[..., 0]


def flow_method(section) -> FlowMethod:
  """The section's flow method; with `expert_lora.rank` > 0 the same method over params {"base": its params,
  "adapters": LoRA adapters of its expert} (rlkit/embodied/flow_lora.py), acting and scored with the merged
  expert."""
  method = FLOW_METHODS.get(section.method)
  lora = section.expert_lora
  if not lora.rank:
    return method

  def merged(params):
    base = params["base"]
    return method.with_expert(base, flow_lora.merge(method.expert(base), params["adapters"], lora.alpha, lora.rank))

  def init(flow_params, fc, cfg, obs_dim, key):
    base = method.init(flow_params, fc, cfg, obs_dim, key)
    return {"base": base, "adapters": flow_lora.init_adapters(method.expert(base), lora.targets, lora.rank,
                                                              jax.random.fold_in(key, 0x10BA))}

  def adapter(fc, cfg):
    inner = method.adapter(fc, cfg)
    return inner._replace(forward=lambda params, mb, keys: inner.forward(merged(params), mb, keys))
  return method._replace(init=init, act=lambda params, *a: method.act(merged(params), *a), adapter=adapter,
                         expert=lambda params: method.expert(merged(params)))


def policy_optimizer(section) -> ml_collections.ConfigDict:
  """The policy's optimizer section; with LoRA its expert's base weights are frozen (`optimizer.frozen`)."""
  if not section.expert_lora.rank:
    return section.optimizer
  c = ml_collections.ConfigDict(section.optimizer.to_dict())
  frozen = "^base/" + FLOW_METHODS.get(section.method).expert_path
  c.frozen = f"{c.frozen}|{frozen}" if c.get("frozen") else frozen
  return c


def update_steps(section) -> int:
  """Optimizer steps of the stage (each of policy and critic): what its learning-rate schedules span."""
  return section.steps * section.epochs * section.minibatches


def loss_config(section, columns: int) -> ml_collections.ConfigDict:
  """The RL-section fields the shared policy loss reads, from the stage's own."""
  c = rl_defaults()
  c.update(policy_loss=section.policy_loss, eps_low=section.eps_low, eps_high=section.eps_high,
           aggregation=section.aggregation, max_new_tokens=columns)
  return c


def _init(ctx, cfg, params):
  env, task = env_of(cfg)
  fc, method = flow_config(cfg, env), flow_method(cfg)
  key = jax.random.fold_in(ctx.key, 0xF1)
  policy = method.init(expert_params(params, cfg, env, fc, key), fc, cfg, env.obs_dim, jax.random.fold_in(key, 1))
  critic = Critic(cfg.critic_hidden).init(jax.random.fold_in(key, 2), jnp.zeros((1, env.obs_dim)))["params"]
  obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.fold_in(key, 3), cfg.num_envs),
                                                           task)
  return {"train": init_train_state(policy, make_optimizer(policy_optimizer(cfg), update_steps(cfg)),
                                    gradient_path(cfg.optimizer)),
          "critic": init_train_state(critic, make_optimizer(cfg.critic_optimizer, update_steps(cfg))),
          "obs": obs, "env": env_state}


def collect_fn(env, task, method, fc, cfg):
  """The jitted collection of one iteration (module docstring, 1)."""
  critic = Critic(cfg.critic_hidden)
  step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

  @jax.jit
  def collect(policy, critic_params, obs, env_state, key):
    def decide(carry, k):
      obs, env_state = carry
      k_act, k_env = jax.random.split(k)
      chunk, extras, logp = method.act(policy, fc, cfg, obs, k_act)
      value = critic.apply({"params": critic_params}, obs)

      def one(c, h):
        o, s, reward, done, success = c
        o, s, r, d, info = step(jax.random.split(jax.random.fold_in(k_env, h), cfg.num_envs), s, chunk[:, h], task)
        return (o, s, reward + r, done | d, success + (d & info["success"])), d
      zeros = jnp.zeros(cfg.num_envs)
      (nobs, nstate, reward, done, success), ends = jax.lax.scan(
          one, (obs, env_state, zeros, jnp.zeros(cfg.num_envs, bool), zeros), jnp.arange(fc.horizon))
      record = {"obs": obs, "extras": extras, "logp": logp, "reward": reward, "done": done, "value": value,
                "success": success, "ends": ends.sum(0)}
      return (nobs, nstate), record
    (obs, env_state), traj = jax.lax.scan(decide, (obs, env_state), jax.random.split(key, cfg.decisions))
    return traj, obs, env_state, critic.apply({"params": critic_params}, obs)
  return collect


def _batch(traj, adv) -> TrainBatch:
  """Rows = decisions (D x E), R columns of the method's log-likelihood, each with its row's advantage."""
  flat = lambda x: x.reshape((-1,) + x.shape[2:])                  # noqa: E731  [D, E, ...] -> [D E, ...]
  logp = flat(traj["logp"])
  n, r = logp.shape
  return TrainBatch(tokens=jnp.zeros((n, r), jnp.int32), attention_mask=jnp.ones((n, r), bool),
                    loss_mask=jnp.ones((n, r), bool), old_logp=logp, rollout_logp=logp,
                    advantages=jnp.broadcast_to(flat(adv)[:, None], (n, r)), token_weights=jnp.ones((n, r)),
                    group_ids=jnp.arange(n, dtype=jnp.int32), row_source=jnp.zeros(n, jnp.int32),
                    extras={"obs": flat(traj["obs"]), **jax.tree.map(flat, traj["extras"])})


def _run(ctx, cfg, state, start: int, meta: dict):
  env, task = env_of(cfg)
  fc, method = flow_config(cfg, env), flow_method(cfg)
  lcfg = loss_config(cfg, method.steps(cfg))
  tx, critic_tx = (make_optimizer(c, update_steps(cfg)) for c in (policy_optimizer(cfg), cfg.critic_optimizer))
  policy_step = make_policy_step(method.adapter(fc, cfg), tx, lcfg, path=gradient_path(cfg.optimizer))
  critic = Critic(cfg.critic_hidden)

  def critic_loss(params, mb, step_inputs):
    err = critic.apply({"params": params}, mb["obs"]) - mb["returns"]
    loss = jnp.sum(err ** 2) / step_inputs["num_rows"]
    return loss, {"critic/loss": Metric(loss)}
  critic_step = make_update_step(critic_loss, critic_tx, 1, lambda b: {"num_rows": b["obs"].shape[0]})
  collect = collect_fn(env, task, method, fc, cfg)
  inputs = default_step_inputs(lcfg)

  def iteration(state, _, key, iterator, step):
    k_collect, k_update = jax.random.split(key)
    traj, obs, env_state, last_value = collect(state["train"].params, state["critic"].params, state["obs"],
                                               state["env"], k_collect)
    adv, returns = gae(traj["reward"], traj["value"], traj["done"], last_value, cfg.gamma, cfg.lam)
    if cfg.normalize_advantages:
      adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    batch = _batch(traj, adv)
    train, metrics, skipped = ppo_updates(policy_step, state["train"], batch, k_update, cfg.epochs, cfg.minibatches,
                                          inputs)
    rows = {"obs": batch.extras["obs"], "returns": returns.reshape(-1)}
    critic_state, sums = state["critic"], None
    for epoch in range(cfg.epochs):
      perm = np.asarray(jax.random.permutation(jax.random.fold_in(k_update, 9_000 + epoch), batch.num_rows))
      for part in np.split(perm, cfg.minibatches):
        critic_state, m = critic_step(critic_state, jax.tree.map(lambda x: x[part], rows), {})
        sums = m["critic/loss"].value if sums is None else sums + m["critic/loss"].value
    episodes = float(traj["ends"].sum())
    metrics.update({"reward": float(traj["reward"].mean()), "episodes": episodes,
                    "success": float(traj["success"].sum()) / episodes if episodes else 0.0,
                    "value": float(traj["value"].mean()),
                    "critic/loss": float(sums) / (cfg.epochs * cfg.minibatches)})
    return ({"train": train, "critic": critic_state, "obs": obs, "env": env_state}, metrics,
            [int(x) for x in skipped])

  return loop(ctx, cfg, state, start, meta, StepIterator(), iteration, ("reward", "success"))


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  cfg = ctx.config[ctx.config.stages[index]]
  return evaluate_expert(ctx, cfg, flow_method(cfg).expert(params), global_step, index)


register_stage("flow_rl", Stage(_init, _run, flow_rl_defaults, validate, needs=(), evaluate=evaluate))
