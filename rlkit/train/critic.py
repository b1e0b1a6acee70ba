"""The PPO critic: a value model (the decoder plus a linear value head) with its own optimizer, trained in
the `rl` stage beside the policy when `rl.advantage = "gae"` (methods/llm.md §12; verl's `critic`).

  values  V(s_t) = w . h_t + b,   h_t the decoder's final-norm hidden state at the position that predicts
          response token t (the state "prompt + response[:t]"), so V is aligned with the policy's logits
  GAE     advantages and returns from the outcome reward on each row's last token and V (objectives.returns)
  loss    0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), token-mean over the loss mask

The decoder starts as `models.critic` when the run declares that role (e.g. a reward-model checkpoint),
else as a copy of the stage's initial policy (verl's default: the critic loads the actor's checkpoint). The
value head starts at zero, so the first values are exactly 0 and the first GAE advantages are the
(discounted) reward-to-go: the critic learns from the first update without injecting random values.

`Critic` is built once per stage: `init(policy_params)` gives the `TrainState` the stage checkpoints as
`state["critic"]`, `add_values(state, batch)` puts the values of a scored `TrainBatch` in its
extras["values"] (the GAE estimator and the value clip read them), `update(state, batch, key)` runs the same
epochs x minibatches as the policy over the same permutations (the same key), through the shared update step
(`steps.make_update_step`: micro-batching, the non-finite guard, any optimizer). It is registered as the
scorer `critic` (registry SCORERS, phases/score.py) with an update and a state of its own, built only when the
advantage estimator reads values: a stage without a critic has none, and no critic branch.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from rlkit.core.types import Metric, TrainBatch
from rlkit.models.transformer import Transformer
from rlkit.objectives import aggregate
from rlkit.objectives.returns import clipped_value_loss, explained_variance
import ml_collections

from rlkit.core.errors import ConfigError
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.optim.optimizers import check as check_optimizer
from rlkit.optim.optimizers import gradient_path, make_optimizer, optimizer_defaults
from rlkit.train.phases.advantages import needs_values
from rlkit.train.phases.score import SCORERS, Scorer, ScorerSpec
from rlkit.train.phases.update import ppo_updates
from rlkit.train.steps import init_train_state, make_update_step, rl_counts

Array = jax.Array


def value_forward(module: Transformer, params: Any, tokens: Array, attention_mask: Array, response_len: int) -> Array:
  """[N, R] float32 values of the states before each response token (0 where the attention mask is False)."""
  out = module.apply({"params": params["decoder"]}, tokens, None, attention_mask, logits="none",
                     method=Transformer.forward)
  p = tokens.shape[1] - response_len
  hidden = out.hidden[:, p - 1:p + response_len - 1].astype(jnp.float32)
  head = params["value_head"]
  values = hidden @ head["w"] + head["b"]
  return jnp.where(attention_mask[:, -response_len:], values, 0.0)


def init_value_params(decoder_params: Any, hidden_size: int) -> dict:
  return {"decoder": jax.tree.map(jnp.copy, decoder_params),
          "value_head": {"w": jnp.zeros((hidden_size,), jnp.float32), "b": jnp.zeros((), jnp.float32)}}


class Critic:
  """The value model of one stage (see the module docstring). `cfg` is the RL stage section."""

  def __init__(self, module: Transformer, cfg, decoder_params: Optional[Any] = None):
    self.module, self.cfg, self.section = module, cfg, cfg.critic
    self.decoder_params = decoder_params          # None: start from the policy's parameters
    self.tx = make_optimizer(self.section.optimizer, cfg.steps * cfg.ppo_epochs * cfg.minibatches)
    self.values = jax.jit(lambda params, batch: value_forward(module, params, batch.tokens, batch.attention_mask,
                                                              batch.response_len))
    self.path = gradient_path(self.section.optimizer)
    self.step = make_update_step(self._loss, self.tx, cfg.micro_batches, rl_counts, self.path)

  def init(self, policy_params: Any):
    start = policy_params if self.decoder_params is None else self.decoder_params
    return init_train_state(init_value_params(start, self.module.cfg.hidden_size), self.tx, self.path)

  def _loss(self, params, mb: TrainBatch, step_inputs):
    values = value_forward(self.module, params, mb.tokens, mb.attention_mask, mb.response_len)
    per_tok, m = clipped_value_loss(values, mb.extras["values"], mb.extras["returns"], mb.loss_mask,
                                    self.section.value_clip)
    share = jnp.sum(mb.loss_mask.astype(jnp.float32)) / step_inputs["num_tokens"]
    loss = aggregate(per_tok, mb.loss_mask, "token-mean", num_tokens_global=step_inputs["num_tokens"])
    return loss, {k: Metric(v * share) for k, v in m.items()}

  def add_values(self, state: dict, batch: TrainBatch) -> TrainBatch:
    """The batch with extras["values"]: the critic's values before this iteration's updates."""
    return batch.replace(extras=dict(batch.extras, values=self.values(state["critic"].params, batch)))

  def update(self, state: dict, batch: TrainBatch, key: Array) -> tuple[dict, dict]:
    """One iteration of critic updates over `batch` (which carries extras "values" and "returns")."""
    train, metrics, _ = ppo_updates(self.step, state["critic"], batch, key, self.cfg.ppo_epochs,
                                    self.cfg.minibatches, {})
    metrics = {f"critic/{k}": v for k, v in metrics.items()}
    values = batch.extras["values"]
    mask = batch.loss_mask
    metrics["critic/vf_explained_var"] = float(explained_variance(values, batch.extras["returns"], mask))
    metrics["critic/values_mean"] = float(jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(mask.sum(), 1))
    return dict(state, critic=train), metrics


def build_critic(ctx, cfg, module: Optional[Transformer] = None) -> Optional[Critic]:
  """The stage's `Critic` if its advantage estimator reads values (`rl.advantage = "gae"`), else None.
  `module`: the critic of another policy than the stage's (GRAFT's peer), started from that policy."""
  if not needs_values(cfg.advantage):
    return None
  role = ctx.models.get("critic")
  if module is not None or role is None:
    return Critic(ctx.model if module is None else module, cfg)
  if role.module.cfg.vocab_size != ctx.model.cfg.vocab_size:
    raise ConfigError(f"models.critic has a vocabulary of {role.module.cfg.vocab_size}, the policy "
                      f"{ctx.model.cfg.vocab_size}: the critic reads the policy's tokens, so it needs the policy's "
                      "tokenizer.")
  return Critic(role.module, cfg, role.params)


def critic_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.value_clip = 0.5            # clip of the new values around the old ones in the value loss (verl's default)
  c.optimizer = optimizer_defaults()
  return c


def check(stage, name: str) -> None:
  section = stage.critic
  if section.value_clip <= 0:
    raise ConfigError(f"{name}.critic.value_clip={section.value_clip} must be > 0.")
  check_optimizer(section.optimizer, f"{name}.critic.optimizer")
  if section.optimizer.kl_target:
    raise ConfigError(f"{name}.critic.optimizer.kl_target={section.optimizer.kl_target}: a value model has no "
                      "policy KL to predict; set it to 0.")


RL_SECTIONS.add("critic", Section(critic_defaults, check, doc="the value model of advantage=gae", trains=("critic",)))


def _other_policy(env) -> Optional[Transformer]:
  return None if env.model is env.ctx.model else env.model


def _scorer(env) -> Optional[Scorer]:
  critic = build_critic(env.ctx, env.cfg, _other_policy(env))
  if critic is None:
    return None
  return Scorer(lambda state, batch, samples: (critic.add_values(state, batch), {}), critic.update)


def _state(ctx, cfg, params, module) -> dict:
  critic = build_critic(ctx, cfg, module)
  return {} if critic is None else {"critic": critic.init(params)}


SCORERS.add("critic", ScorerSpec(_scorer, order=60, init=_state))
