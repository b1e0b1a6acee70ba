"""The `gen_pretrain` stage: a class- or prompt-conditioned flow-matching generator pretrained on a dataset of
GEN_DATA (rlkit/diffusion/gen_data.py: toy2d's mixtures, the 8x8 digits), the reference model the `gen_rl`
stage fine-tunes (methods/embodied.md §1.4).

The generator is rlkit/models/flow.py's velocity network with one chunk of one "action" of D floats (a sample is
[1, D]) and the condition's one-hot as its observation (s = 0 noise, s = 1 data). At the start the stage draws its
data set (`dataset_size` draws for toy2d, the fixed images for digits; the numpy seed derived from the stage's key,
so a resumed stage draws the same) and a fresh network. One iteration: `batch_size` (x, cond) pairs drawn with the
iteration's key, one step of the conditional flow-matching loss (fresh (s, eps), the mean over the batch)
through the shared update step. Evaluation (every `eval_every`, and at the end): `eval_samples` Euler samples
(`sample_steps`) per condition from fixed noise, scored by the dataset's quality (eval/mmd, eval/class_accuracy).

State: {"train": the generator's TrainState}. The section's `data`, `toy2d` and `flow` fields (`gen_fields`) are
the RL stage's too: `flow_config(section, data)` rebuilds the network's shape from them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.errors import ConfigError
from rlkit.core.registry import choice
from rlkit.diffusion.gen_data import GEN_DATA, GenData, toy2d_defaults
from rlkit.embodied.bc_stage import flow_matching_loop
from rlkit.models.flow import FlowConfig, init_flow, sample
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.stages import Stage, register_stage
from rlkit.train.steps import init_train_state


def gen_fields(c: ml_collections.ConfigDict) -> None:
  """The fields every generative stage section has: what it generates and the generator's shape."""
  c.data = "toy2d"              # registry GEN_DATA: toy2d (2-D prompt mixtures) | digits (8x8, class-conditioned)
  c.toy2d = toy2d_defaults()    # the toy2d task (a gen_rl stage's must equal its gen_pretrain stage's)
  c.flow = ml_collections.ConfigDict()
  c.flow.hidden = 128           # trunk width
  c.flow.blocks = 3             # adaLN-Zero blocks
  c.flow.time_dim = 64          # width of the time embedding and its MLP (the timestep module)
  c.flow.mlp_ratio = 2          # block MLP width / hidden
  c.sample_steps = 10           # Euler steps of the evaluations' deterministic sampler (and gen_rl's opt_mmd)
  c.eval_samples = 64           # samples per condition at each evaluation (fixed noise)


def gen_pretrain_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "gen_pretrain"       # stage kind (registry STAGES)
  c.steps = 2000                # optimizer steps
  c.batch_size = 256            # (x, cond) pairs per step
  gen_fields(c)
  c.dataset_size = 20_000       # toy2d: points drawn for pretraining (digits: its 1797 images, always)
  c.eval_every = 0              # evaluate every N steps (0: only at the end of the stage)
  c.max_skipped_updates = 10    # stop after this many steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  return c


def dataset(section) -> GenData:
  return GEN_DATA.get(section.data)(section)


def flow_config(section, data: GenData) -> FlowConfig:
  return FlowConfig(action_dim=data.dim, horizon=1, **section.flow.to_dict())


def check_gen_fields(section, name: str) -> None:
  """The checks of `gen_fields` (and of the optimizer's, which every generative stage has)."""
  choice(section.data, GEN_DATA, f"{name}.data")
  t = section.toy2d
  if t.prompts < 1 or t.modes < 2 or t.std <= 0 or t.radius <= 0 or not 0 < t.rare_weight < 1:
    raise ConfigError(f"{name}.toy2d: prompts >= 1, modes >= 2, std > 0, radius > 0 and 0 < rare_weight < 1, got "
                      f"{t.to_dict()}.")
  if section.flow.hidden < 1 or section.flow.blocks < 0 or section.flow.time_dim < 2 or section.flow.mlp_ratio < 1:
    raise ConfigError(f"{name}.flow: hidden >= 1, blocks >= 0, time_dim >= 2 and mlp_ratio >= 1, got "
                      f"{section.flow.to_dict()}.")
  for key in ("sample_steps", "eval_samples"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  if section.optimizer.kl_target > 0:
    raise ConfigError(f"{name}.optimizer.kl_target={section.optimizer.kl_target}: predicted-KL control measures a "
                      "step on a token decoder's logits, which a flow generator has not; set it to 0.")


def validate(section, name: str) -> None:
  check_gen_fields(section, name)
  for key in ("batch_size", "dataset_size"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")


def one_hot(cond, conditions: int):
  return jax.nn.one_hot(cond, conditions, dtype=jnp.float32)


def condition_samples(params, fc: FlowConfig, conditions: int, per: int, key, steps: int) -> np.ndarray:
  """[C, per, D] Euler samples of every condition from the noise of `key`."""
  cond = one_hot(jnp.repeat(jnp.arange(conditions), per), conditions)
  x = sample(params, fc, cond, key, steps)
  return np.asarray(x).reshape(conditions, per, fc.action_dim)


def eval_key(ctx, index: int):
  """The fixed noise of a stage's evaluations: the same at every evaluation, so their differences are the model's."""
  return jax.random.fold_in(jax.random.fold_in(ctx.key, 10_000 + index), 0)


def _init(ctx, cfg, params):
  data = dataset(cfg)
  fresh = init_flow(flow_config(cfg, data), data.conditions, jax.random.fold_in(ctx.key, 0x6E0))
  return {"train": init_train_state(fresh, make_optimizer(cfg.optimizer, cfg.steps), gradient_path(cfg.optimizer))}


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  cfg = ctx.config[ctx.config.stages[index]]
  data = dataset(cfg)
  x = condition_samples(params, flow_config(cfg, data), data.conditions, cfg.eval_samples, eval_key(ctx, index),
                        cfg.sample_steps)
  return {f"eval/{k}": v for k, v in data.quality(x, ctx.config.seed).items()}


def numpy_seed(key) -> int:
  """A numpy seed drawn from a JAX key (host-side data draws that follow the run's seed)."""
  return int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))


def _run(ctx, cfg, state, start: int, meta: dict):
  data = dataset(cfg)
  fc = flow_config(cfg, data)
  x, cond = data.arrays(cfg.dataset_size, numpy_seed(jax.random.fold_in(ctx.key, 0xDA7A + meta["stage_index"])))
  x, cond = jnp.asarray(x)[:, None, :], jnp.asarray(cond)
  ctx.logger.say(f"stage {meta['stage']}: {x.shape[0]} {cfg.data} samples of {data.dim} dims, "
                 f"{data.conditions} conditions")
  return flow_matching_loop(ctx, cfg, state, start, meta, fc, one_hot(cond, data.conditions), x)


register_stage("gen_pretrain", Stage(_init, _run, gen_pretrain_defaults, validate, needs=(), evaluate=evaluate))
