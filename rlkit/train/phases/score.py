"""Phase 5, score: the `TrainBatch` the update consumes, and the registered scorers that fill it in
(registry `SCORERS`): every number a later phase reads of the rows besides the rollout itself.

A scorer is registered as `ScorerSpec(build, order, when, init)`. `build(env: ScoreEnv) -> Scorer | None` builds
it once per learner, or returns None when the stage section does not use it (so an unused scorer costs
nothing and has no branch in the loop); `init(ctx, cfg, params, module) -> dict` adds the state it owns to
the learner's checkpointed state (the critic's value model). A `Scorer` is

  score(state, batch, samples) -> (batch, metrics)      fills fields or extras of the batch
  update(state, batch, key) -> (state, metrics)         optional: after the policy's update (the critic)

Scorers run in (`order`, name) order, at one of two points of the iteration (`when`): "score", before the
off-policy correction (log-probs, values), or "advantages", after the advantages (weighing foreign rows,
e.g. GRAFT's peer rows, whose weights read the advantages). The built-in ones:

  policy        old_logp: the policy before this iteration's updates (the PPO ratio's denominator)   here
  reference     ref_logp (kl_beta > 0): the stage's initial policy, or `models.reference`             here
  roles         extras["<role>_logp"] of every `rl.score_roles` model (e.g. a teacher)                here
  teacher       distillation's teacher: extras["<t>_logp"], ["<t>_dist_logp"], ["<t>_dist_ids"]     train/distill.py
  xtok_teacher  a teacher with another tokenizer: the aligned advantage and positions               train/distill.py
  critic        extras["values"] of the value model; its update after the policy's                  train/critic.py
  graft         the weights and rejections of GRAFT's peer rows (when: advantages)                  train/graft_stage.py
  hindsight     SRD's retrospective teacher: the policy's log-probs with hindsight (when: advantages) train/srd.py

All are taken under the sampler's processing (temperature, top-k, top-p), so the mismatch metric
(`rl_metrics.mismatch`: trainer old_logp vs the sampler's `rollout_logp`, policy rows) measures numerics
alone: a mismatch well above float rounding means the trainer and the sampler compute different
distributions.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.core.types import TrainBatch
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.scoring import make_scorer, replay_mode
from rlkit.train.phases.collect import Samples


def train_batch(samples: Samples, advantages, put_batch: Callable[[dict], dict],
                token_weights: Optional[jax.Array] = None) -> TrainBatch:
  """The update's batch from the selected, augmented rows (old/ref log-probs still zero: see `score`;
  `advantages` [n, R] host-side, or None: zeros, filled in by the advantage phase after scoring). Token
  weights: `token_weights`, else each row's `samples.weight` on all its positions, else ones."""
  ro = samples.rollout
  # This process's rows -> global arrays, sharded like the rollout.
  host = {"row_source": samples.row_source.astype(np.int32), "valid": samples.valid}
  if samples.weight is not None and token_weights is None:
    host["weight"] = samples.weight.astype(np.float32)
  if advantages is not None:
    host["advantages"] = np.asarray(advantages, np.float32)
  host = put_batch(host)
  valid = host["valid"][:, None]
  loss_mask = ro.loss_mask & valid            # trained: the tokens the policy sampled
  attention_mask = ro.attention_mask & valid  # attended: every real token, observations included
  zeros = jnp.zeros_like(ro.logprobs)
  return TrainBatch(tokens=ro.tokens, attention_mask=attention_mask, loss_mask=loss_mask, old_logp=zeros,
                    rollout_logp=jnp.where(loss_mask, ro.logprobs, 0.0),
                    advantages=host["advantages"] if advantages is not None else zeros,
                    token_weights=(token_weights if token_weights is not None else
                                   jnp.broadcast_to(host["weight"][:, None], zeros.shape) if "weight" in host
                                   else jnp.ones_like(zeros)),
                    group_ids=ro.group_ids, row_source=host["row_source"], extras=dict(ro.extras),
                    segment_ids=ro.segment_ids, turn_ids=ro.turn_ids)


def score(batch: TrainBatch, scorers: dict[str, tuple[Callable, Any]]) -> TrainBatch:
  """Fills old_logp ("policy"), ref_logp ("reference") and extras["<role>_logp"] for every other role.

  :param scorers: role -> (jitted `score(params, batch) -> [N, R]`, params).
  """
  out, extras = {}, dict(batch.extras)
  for role, (fn, params) in scorers.items():
    out[role] = fn(params, batch)
    if role not in ("policy", "reference"):
      extras[f"{role}_logp"] = out[role]
  return batch.replace(old_logp=out.get("policy", batch.old_logp), ref_logp=out.get("reference", batch.ref_logp),
                       extras=extras)


@dataclasses.dataclass
class ScoreEnv:
  """What a scorer is built from: the run context, the stage section, the sampler's processing, the learner's
  policy module, and whether this learner keeps its own reference (its state's `ref_params`, the stage's
  initial policy) rather than reading `models.reference`."""
  ctx: Any
  cfg: Any
  sampling: SamplingConfig
  model: Any
  own_reference: bool

  @functools.cached_property
  def policy_logp(self) -> Callable:
    """The jitted `score(params, batch)` of the learner's policy module, built once: the policy scorer and a
    reference kept as this learner's initial params run the same program."""
    return make_scorer(self.model, self.sampling, replay_mode(self.cfg))


class Scorer(NamedTuple):
  score: Callable[[dict, TrainBatch, Samples], tuple[TrainBatch, dict]]
  update: Optional[Callable[[dict, TrainBatch, jax.Array], tuple[dict, dict]]] = None


def _no_state(ctx, cfg, params, module) -> dict:
  return {}


class ScorerSpec(NamedTuple):
  build: Callable[[ScoreEnv], Optional[Scorer]]
  order: int = 50
  when: str = "score"           # "score" (before the correction) | "advantages" (after the advantages)
  init: Callable[..., dict] = _no_state


SCORERS: Registry[ScorerSpec] = Registry("scorer")
WHEN = ("score", "advantages")


def build_scorers(env: ScoreEnv) -> dict[str, list[tuple[str, Scorer]]]:
  """{when: [(name, scorer)]} of the scorers active for `env.cfg`, in run order."""
  out = {when: [] for when in WHEN}
  for name in sorted(SCORERS, key=lambda n: (SCORERS.get(n).order, n)):
    spec = SCORERS.get(name)
    scorer = spec.build(env)
    if scorer is not None:
      out[spec.when].append((name, scorer))
  return out


def scorer_state(ctx, cfg, params, module=None) -> dict:
  """The state entries every registered scorer owns for a learner of `params` (e.g. {"critic": ...})."""
  state = {}
  for name in SCORERS:
    state.update(SCORERS.get(name).init(ctx, cfg, params, module))
  return state


def run_scorers(scorers: list[tuple[str, Scorer]], state: dict, batch: TrainBatch,
                samples: Samples) -> tuple[TrainBatch, dict]:
  metrics = {}
  for _, scorer in scorers:
    batch, m = scorer.score(state, batch, samples)
    metrics.update(m)
  return batch, metrics


def _logp_scorer(fn: Callable, params_of: Callable[[dict], Any], write: Callable) -> Scorer:
  def run(state, batch, samples):
    del samples
    return write(batch, fn(params_of(state), batch)), {}
  return Scorer(run)


def _policy(env: ScoreEnv) -> Scorer:
  return _logp_scorer(env.policy_logp, lambda state: state["train"].params, lambda b, logp: b.replace(old_logp=logp))


def _reference(env: ScoreEnv) -> Optional[Scorer]:
  if env.cfg.kl_beta <= 0:
    return None
  models, write = env.ctx.models, (lambda b, logp: b.replace(ref_logp=logp))
  if "reference" in models and not env.own_reference:
    ref = models["reference"]
    return _logp_scorer(make_scorer(ref.module, env.sampling), lambda state: ref.params, write)
  return _logp_scorer(env.policy_logp, lambda state: state["ref_params"], write)


def _roles(env: ScoreEnv) -> Optional[Scorer]:
  if not env.cfg.score_roles:
    return None
  models = env.ctx.models
  fns = {role: (make_scorer(models[role].module, env.sampling), models[role].params) for role in env.cfg.score_roles}

  def run(state, batch, samples):
    return score(batch, fns), {}
  return Scorer(run)


SCORERS.add("policy", ScorerSpec(_policy, order=0))
SCORERS.add("reference", ScorerSpec(_reference, order=10))
SCORERS.add("roles", ScorerSpec(_roles, order=20))
