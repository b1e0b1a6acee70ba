"""The RL stage in-process, one iteration at a time: every stage switch changes what an iteration does (no
dead flags), and the stage-level contracts of the phases (padding rows, demonstration rows, dynamic-sampling
group ids, a hanging verifier, the non-finite guard, sampler/trainer mismatch under truncated sampling).

Speed: a run builds a fresh jitted update step and scorer, and compiling them is most of an iteration's cost
on CPU. `run_stage` hands the stage step functions and scorers memoised by everything they are built from
(the RL section minus the fields only the host-side phases read), so a flip of a reward, filter or advantage
field reuses the baseline's compiled step; it compiles with XLA's optimisation passes off (`_fast_compile`,
about half the compile time; tests/train/test_phases.py checks the mismatch under the default passes). Runs
are memoised by their overrides (`one_iteration`), so a flip's context is run once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rlkit.core.types import ROW_SOURCE, SEGMENT_KINDS
from rlkit.data.tasks import make_task
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.objectives.loss_terms import LOSS_TERMS
from rlkit.optim.optimizers import make_optimizer, optimizer_defaults
from rlkit.rewards import RewardOutput, register_reward
from rlkit.train import critic as critic_module, rl_stage, stages
from rlkit.train.phases import score as score_phase
from rlkit.train.config import base_config
from rlkit.train.rl_config import rl_defaults
from rlkit.train.phases.collect import sampling_config
from rlkit.train.models import Model
from rlkit.train.phases.augment import AUGMENTERS, Augmenter, AugmenterSpec, interleave_groups
from rlkit.core.errors import TrainingError
from rlkit.train.catalog import STAGES
from rlkit.train.stages import Context
from tests.fast_compile import fast_compile as _fast_compile
from tests.xla_flags import default_emitters

TOK = CharTokenizer()
# (A width no other test module uses, so no jitted sampler is shared with them: see `_fast_compile`.)
MODEL = Transformer(TransformerConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=40,
                                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                                      tie_word_embeddings=True, rope_theta=10_000.0))
TASK = make_task("arithmetic", ops="+", min_digits=1, max_digits=1)
GROUP, PROMPTS, MAX_NEW = 4, 4, 3


# ----------------------------------------------------------------------------------- test components

@register_reward("test_stages_digits")
def _make_digits_reward(task, executor):
  """Digits in the completion (+0.5 if it ended with EOS) for prompts with an odd first operand, else 0.

  Computed in-process. Every odd-prompt group of an untrained model has reward variance, every even-prompt
  group is flat: the advantages have something to act on, and dynamic sampling has groups to drop.
  """
  del task, executor

  def reward_fn(batch):
    digits = np.array([sum(c.isdigit() for c in text) for text in batch.completions], np.float64)
    odd = np.array([int(p[0]) % 2 == 1 for p in batch.prompts])
    r = np.where(odd, digits + 0.5 * batch.finished, 0.0)
    return RewardOutput(rewards=r, correct=r > 1.0, components={"digits": r.copy()}, failures={})
  return reward_fn


@register_reward("test_stages_hang")
def _make_hanging_reward(task, executor):
  """Scores every 8th row with a verifier that sleeps forever (tests/rewards/_verifiers.py: `misbehave`, which
  the executor's spawn worker can import), the rest with their length."""
  from tests.rewards._verifiers import misbehave
  del task

  def reward_fn(batch):
    rows = [("sleep" if i % 8 == 0 else str(int(n)), "0") for i, n in enumerate(batch.lengths)]
    out = executor.map(misbehave, rows)
    return RewardOutput(rewards=out.values, correct=None, components={}, failures=out.failures)
  return reward_fn


@LOSS_TERMS.register("test_stages_nll")
def _nll_term(cfg):
  """-logp of the sampled tokens: an extra term that pulls every row (so it changes any update)."""
  del cfg
  return lambda logp, logits, batch, step_inputs: (-logp, {})


@LOSS_TERMS.register("test_stages_nan")
def _nan_term(cfg):
  """A NaN per-token loss: every update that includes it has a non-finite loss and gradient."""
  del cfg
  return lambda logp, logits, batch, step_inputs: (logp * jnp.nan, {})


PAD_REWARD = 1e3     # what a padding row claims; it would dominate every statistic it entered


def _pad_augmenter(cfg, env):
  """One padding row per group: `valid` False, every mask False, tokens and reward that would change the
  group's advantage, the loss and the gradient if anything used them."""
  group_size = cfg.group_size

  def add(samples, rewards, key, step):
    del key, step
    first = np.arange(0, len(samples), group_size)
    base = samples.take(first)
    ro = base.rollout
    garbage = (ro.response + 7) % TOK.vocab_size
    rollout = dataclasses.replace(ro, prompt_mask=jnp.zeros_like(ro.prompt_mask), response=garbage,
                                  response_mask=jnp.zeros_like(ro.response_mask), logprobs=jnp.full(
                                      ro.logprobs.shape, -3.0), lengths=jnp.zeros_like(ro.lengths))
    n = len(first)
    pad = dataclasses.replace(base, rollout=rollout, row_source=np.full(n, ROW_SOURCE["padding"], np.int32),
                              valid=np.zeros(n, bool))
    pad_rewards = RewardOutput(rewards=np.full(n, PAD_REWARD), correct=None if rewards.correct is None
                               else np.zeros(n, bool), components={k: np.zeros(n) for k in rewards.components},
                               failures={})
    return interleave_groups(samples, rewards, pad, pad_rewards, group_size, 1)

  return Augmenter(1, add)


AUGMENTERS.add("test_stages_pad", AugmenterSpec(_pad_augmenter, lambda cfg: 1))


# ------------------------------------------------------------------------------------ running a stage

class _Log:
  def __init__(self):
    self.rows = []
    self.lines = []

  def say(self, text):
    self.lines.append(text)

  def log(self, step, stage, metrics, show=()):
    self.rows.append(dict(metrics, step=step, stage=stage))

  def log_samples(self, step, stage, rows):
    self.samples = getattr(self, "samples", []) + [dict(r, step=step, stage=stage) for r in rows]

  def start_stage(self, *a, **k):
    pass

  def advance(self, n=1):
    pass

  def close_bar(self):
    pass


class _NoCkpt:
  directory = "<none>"

  def should_save(self, step):
    return False

  def save(self, *a):
    pass


# RL fields that only the host-side phases and the loop read: two sections that differ only here build the
# same update step, so `run_stage` reuses the compiled one.
HOST_ONLY = ("kind", "steps", "prompts_per_step", "group_size", "reward", "advantage", "adv_eps", "filter",
             "correction", "rollout_mismatch", "gamma", "gae_lambda", "whiten_advantages", "critic",
             "max_sampling_rounds", "augment", "overlong_cache", "overlong_factor", "eval_every",
             "max_skipped_updates", "ppo_epochs", "minibatches", "sync")
# Fields of nested sections that no step reads either (the opd advantage's, computed before the step; the
# cross-tokenizer mode only reaches the step through the divergence terms, which then read the aligned mask).
HOST_ONLY_NESTED = {"distill": ("reward_weight", "reward_advantage", "cross_tokenizer")}
DIVERGENCE_TERMS = ("reverse_kl", "forward_kl", "jsd")
_STEPS: dict = {}
_SCORERS: dict = {}


def _arguments(make, *args, **kwargs) -> dict:
  """`make`'s arguments by name, defaults filled in (so `f(m, s)` and `f(m, s, False)` are one key)."""
  bound = inspect.signature(make).bind(*args, **kwargs)
  bound.apply_defaults()
  return dict(bound.arguments)


def _memo_step(make):
  def make_step(*args, **kwargs):
    arguments = _arguments(make, *args, **kwargs)
    cfg = arguments.pop("cfg")
    section = {k: v for k, v in cfg.to_dict().items() if k not in HOST_ONLY}
    for name, fields in HOST_ONLY_NESTED.items():
      if name in section:
        keep = ("cross_tokenizer",) if set(DIVERGENCE_TERMS) & set(cfg.loss_terms.keys()) else ()
        section[name] = {k: v for k, v in section[name].items() if k not in fields or k in keep}
    if cfg.optimizer.schedule != "constant":     # decaying schedules depend on the number of updates
      section["total_updates"] = cfg.steps * cfg.ppo_epochs * cfg.minibatches
    arguments.pop("tx")                          # built from cfg.optimizer (and the number of updates)
    key = (json.dumps(section, sort_keys=True, default=str), repr(arguments))
    if key not in _STEPS:
      _STEPS[key] = make(*args, **kwargs)
    return _STEPS[key]
  return make_step


def _memo_scorer(make):
  def make_scorer(*args, **kwargs):
    key = repr(_arguments(make, *args, **kwargs))
    if key not in _SCORERS:
      _SCORERS[key] = make(*args, **kwargs)
    return _SCORERS[key]
  return make_scorer


_CRITICS: dict = {}


def _memo_critic(make):
  """A `Critic` holds no state (it is passed in): one per module, decoder start and the fields it reads, so a
  flip that leaves them alone does not compile the critic's value pass and update step again."""
  def critic(module, cfg, decoder_params=None):
    key = (module, id(decoder_params), json.dumps(cfg.critic.to_dict(), sort_keys=True),
           cfg.steps * cfg.ppo_epochs * cfg.minibatches, cfg.ppo_epochs, cfg.minibatches, cfg.micro_batches)
    if key not in _CRITICS:
      _CRITICS[key] = make(module, cfg, decoder_params)
    return _CRITICS[key]
  return critic


class Run(NamedTuple):
  rows: list            # logged metrics, one dict per iteration
  delta: np.ndarray     # final - initial parameters, flattened
  state: Any            # the stage's final state
  batches: list         # the TrainBatch of every iteration (host copies)
  eval_steps: list      # global steps the loop evaluated at
  optimizers: list      # (optimizer section, total steps) of every `make_optimizer` call of the stage

  @property
  def metrics(self) -> dict:
    return self.rows[0]


def _config(overrides: dict) -> ml_collections.ConfigDict:
  cfg = rl_defaults()
  cfg.update(dict(steps=1, prompts_per_step=PROMPTS, group_size=GROUP, max_new_tokens=MAX_NEW, ppo_epochs=2))
  # Inline rewards (no worker process to start per run); the worker path: test_hanging_verifier_times_out.
  cfg.reward.name, cfg.reward.timeout_s = "test_stages_digits", 0.0
  STAGES.get("rl").validate(override(cfg, overrides), "rl")
  return cfg


def override(cfg, overrides: dict):
  """`cfg` with each dotted key of `overrides` set (a dict value becomes a ConfigDict section)."""
  for key, value in overrides.items():
    *path, leaf = key.split(".")
    section = cfg
    for p in path:
      section = section[p]
    section[leaf] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value
  return cfg


@functools.lru_cache(maxsize=1)
def _initial_params():
  return init_params(MODEL.cfg, jax.random.key(0))


@functools.lru_cache(maxsize=1)
def _roles() -> dict:
  """Every run holds a frozen `teacher` (another init of the policy's architecture); only `score_roles` uses it."""
  return {"teacher": Model(MODEL, init_params(MODEL.cfg, jax.random.key(5)), TOK, False)}


def run_stage(overrides: dict, patches=(), logger=None, task=TASK, source=None, max_prompt_len=5) -> Run:
  """Runs the `rl` stage of `_config(overrides)` in-process; `patches`: (module, name, wrap(original)); `source`:
  the training examples (default: 64 of `task`'s)."""
  config = base_config()
  config.data.max_prompt_len = max_prompt_len
  config.eval.update(batch_size=8, max_new_tokens=MAX_NEW, pass_k=0)
  rng = np.random.default_rng(0)
  source = source or [dict(task.make_example(rng)) for _ in range(64)]
  cfg = _config(overrides)
  with _fast_compile():
    params, models = _initial_params(), _roles()
  ctx = Context(config=config, model=MODEL, tokenizer=TOK, task=task, train_source=source, eval_records=[],
                logger=logger or _Log(), checkpointer=_NoCkpt(), key=jax.random.key(1), put_batch=lambda b: b,
                models=models)
  batches, eval_steps, optimizers = [], [], []

  def capture(ppo_updates):
    def wrapped(step_fn, train, batch, *args, **kwargs):
      batches.append(jax.device_get(batch))
      return ppo_updates(step_fn, train, batch, *args, **kwargs)
    return wrapped

  def record_eval(maybe_eval):
    def wrapped(ctx, params, name, global_step, index, **kwargs):
      eval_steps.append(global_step)
      return maybe_eval(ctx, params, name, global_step, index, **kwargs)
    return wrapped

  def record_optimizer(make_optimizer):
    def wrapped(section, total_steps):
      optimizers.append((section.to_dict(), total_steps))
      return make_optimizer(section, total_steps)
    return wrapped

  stage = STAGES.get("rl")
  all_patches = [(rl_stage, "make_rl_step", _memo_step), (score_phase, "make_scorer", _memo_scorer),
                 (critic_module, "Critic", _memo_critic),
                 (rl_stage, "ppo_updates", capture), (stages, "maybe_eval", record_eval),
                 (rl_stage, "make_optimizer", record_optimizer), *patches]
  with contextlib.ExitStack() as stack:
    stack.enter_context(_fast_compile())
    for module, name, wrap in all_patches:
      original = getattr(module, name)
      stack.callback(setattr, module, name, original)
      setattr(module, name, wrap(original))
    # The step donates its state, so the stage gets its own copy of the initial parameters.
    state = stage.init(ctx, cfg, jax.tree.map(jnp.copy, params))
    state = stage.run(ctx, cfg, state, 0, {"stage": "rl", "stage_index": 0, "offset": 0})
  delta = np.concatenate([np.ravel(a - b) for a, b in zip(jax.tree.leaves(state["train"].params),
                                                          jax.tree.leaves(params))])
  return Run(ctx.logger.rows, delta, state, batches, eval_steps, optimizers)


def score_env(cfg):
  """The `ScoreEnv` the stage's learner builds its scorers from, for `cfg` (no reference of its own)."""
  from rlkit.train.phases.score import ScoreEnv
  ctx = Context(config=base_config(), model=MODEL, tokenizer=TOK, task=TASK, train_source=[], eval_records=[],
                logger=_Log(), checkpointer=_NoCkpt(), key=jax.random.key(1), put_batch=lambda b: b, models=_roles())
  return ScoreEnv(ctx, cfg, sampling_config(cfg, TOK), MODEL, False)


def _key(overrides: dict) -> str:
  return json.dumps(overrides, sort_keys=True)


_RUNS: dict = {}


def one_iteration(**overrides) -> Run:
  """`run_stage(overrides)`, memoised (keys with dots name nested fields: `reward.name`)."""
  key = _key(overrides)
  if key not in _RUNS:
    _RUNS[key] = run_stage(overrides)
  return _RUNS[key]


# ----------------------------------------------------------------------------------------- no dead flags

# The corrections act on a sampler/trainer mismatch: every correction flip runs with simulated engine noise.
MISMATCH = {"rollout_mismatch.noise_scale": 1.0}
GENTLE = {"rollout_mismatch.noise_scale": 0.2}
# OnePO's recipe with guidance on (the test reward's even-prompt groups are all-fail: they are guided).
ONEPO = {"augment": "onepo", "onepo.anneal_steps": 4, "advantage": "mixed_group",
         "loss_terms": {"shaped_offpolicy": 1.0}, "surrogate_rows": ("policy",)}
# The released rule (onepo.rule=huatuo) with the verifier reward: an untrained policy solves no sum and the
# scripted teacher every one, so the teacher beats every group it is offered.
HUATUO = {"augment": "onepo", "onepo.rule": "huatuo", "onepo.anneal_steps": 4, "advantage": "group",
          "loss_terms": {"floored_teacher": 1.0}, "surrogate_rows": ("policy",), "reward.name": "verifier"}
CORRECTION_CONTEXT = {
    "name": MISMATCH,
    **{k: {**MISMATCH, "correction.name": "rollout_correction"}
       for k in ("rollout_is", "rollout_rs", "rollout_token_veto_threshold")},
    **{k: {**MISMATCH, "correction.name": "rollout_correction", "correction.rollout_is": "token"}
       for k in ("rollout_is_threshold", "rollout_is_batch_normalize")},
    "rollout_rs_threshold": {**MISMATCH, "correction.name": "rollout_correction", "correction.rollout_rs": "token_k1",
                             "correction.rollout_rs_threshold": "5.0"},
    "rollout_rs_k1_bounds": {**MISMATCH, "correction.name": "rollout_correction", "correction.rollout_rs": "token_k1",
                             "correction.rollout_rs_threshold": "0.8_3.0"},
    **{k: {**MISMATCH, "correction.name": "icepop"} for k in ("icepop_low", "icepop_high")},
    # Weaker noise for calibrated IS: at 1.0 every 3-token row has a rejected token, and the whole batch goes.
    **{k: {**GENTLE, "correction.name": "calibrated"}
       for k in ("calibrated_tau_hi", "calibrated_tau_lo", "calibrated_sigma_init")},
    "calibrated_eps": {**GENTLE, "correction.name": "calibrated", "correction.calibrated_sigma_init": 0.001},
    "calibrated_max_masked_frac": {**GENTLE, "correction.name": "calibrated", "correction.calibrated_tau_lo": 1.0},
    **{k: {**MISMATCH, "correction.name": "cis"} for k in ("cis_lambda", "cis_kappa")},
}
CORRECTION_FLIPS = {
    "correction.name": {"correction.name": "calibrated"},
    "correction.rollout_is": {"correction.rollout_is": "token"},
    "correction.rollout_is_threshold": {"correction.rollout_is_threshold": "1.1"},
    "correction.rollout_rs_k1_bounds": {"correction.rollout_rs_k1_bounds": "ratio"},
    "correction.rollout_is_batch_normalize": {"correction.rollout_is_batch_normalize": True},
    "correction.rollout_rs": {"correction.rollout_rs": "token_k1", "correction.rollout_rs_threshold": "2.0"},
    "correction.rollout_rs_threshold": {"correction.rollout_rs_threshold": "1.2"},
    "correction.rollout_token_veto_threshold": {"correction.rollout_token_veto_threshold": 0.5},
    "correction.icepop_low": {"correction.icepop_low": 0.9},
    "correction.icepop_high": {"correction.icepop_high": 1.1},
    "correction.calibrated_tau_hi": {"correction.calibrated_tau_hi": 0.01},
    "correction.calibrated_tau_lo": {"correction.calibrated_tau_lo": 0.01},
    "correction.calibrated_eps": {"correction.calibrated_eps": 0.001},      # tighter bounds: more truncation
    "correction.calibrated_max_masked_frac": {"correction.calibrated_max_masked_frac": 1.0},  # no row rule
    "correction.calibrated_sigma_init": {"correction.calibrated_sigma_init": 0.001},
    "correction.cis_lambda": {"correction.cis_lambda": 0.0},                # min(rho, 1)
    "correction.cis_kappa": {"correction.cis_kappa": 1.0},                  # every cap 1 + lambda
}

# field -> the flip's overrides; CONTEXT[field]: what the flip needs to act (compared against the context run).
FLIPS = {
    "steps": {"steps": 2},
    **CORRECTION_FLIPS,
    "rollout_mismatch.dtype": {"rollout_mismatch.dtype": "bfloat16"},
    "rollout_mismatch.noise_scale": {"rollout_mismatch.noise_scale": 1.0},
    "rollout_mismatch.noise_kind": {"rollout_mismatch.noise_kind": "tail"},
    "gamma": {"gamma": 0.5},
    "gae_lambda": {"gae_lambda": 0.5},
    "whiten_advantages": {"whiten_advantages": False},
    "critic.value_clip": {"critic.value_clip": 1e-4},
    "policy_kwargs": {"policy_kwargs": {"tau_pos": 8.0, "tau_neg": 8.0}},
    "onepo.anneal_steps": {"onepo.anneal_steps": 4},
    "onepo.teacher_rows": {"onepo.teacher_rows": 2},
    "onepo.alpha0": {"onepo.alpha0": 0.3},
    "onepo.max_accuracy": {"onepo.max_accuracy": 1.0},
    "onepo.teacher_in_baseline": {"onepo.teacher_in_baseline": False},
    "onepo.gamma": {"onepo.gamma": 1.0},
    "onepo.rule": {"onepo.rule": "huatuo"},
    "onepo.retire": {"onepo.retire": "linear"},
    "onepo.floor": {"onepo.floor": 0.001},
    "surrogate_rows": {"surrogate_rows": ("policy",)},
    "prompts_per_step": {"prompts_per_step": 2},
    "group_size": {"group_size": 2},
    "max_new_tokens": {"max_new_tokens": 2},
    "temperature": {"temperature": 0.7},
    "top_k": {"top_k": 3},
    "top_p": {"top_p": 0.5},
    "reward.name": {"reward.name": "verifier"},
    "reward.kwargs": {"reward.kwargs": {"format_reward": 0.5}},
    "advantage": {"advantage": "rloo"},
    "adv_eps": {"adv_eps": 10.0},
    "policy_loss": {"policy_loss": "gspo"},
    "eps_low": {"eps_low": 0.0},
    "eps_high": {"eps_high": 0.0},
    "dual_clip": {"dual_clip": 1.01},
    "aggregation": {"aggregation": "seq-mean-token-sum"},
    "kl_beta": {"kl_beta": 0.5},
    "kl_estimator": {"kl_estimator": "k1"},
    "entropy_coef": {"entropy_coef": 0.1},
    "loss_terms": {"loss_terms": {"test_stages_nll": 0.5}},
    "ppo_epochs": {"ppo_epochs": 3},
    "minibatches": {"minibatches": 2},
    "micro_batches": {"micro_batches": 2},
    "filter": {"filter": "dynamic_sampling"},
    "max_sampling_rounds": {"max_sampling_rounds": 0},
    "augment": {"augment": "demonstration"},
    "overlong_cache": {"overlong_cache": 2},
    "overlong_factor": {"overlong_factor": 3.0},
    "eval_every": {"eval_every": 1},
    "optimizer.lr": {"optimizer.lr": 3e-3},
    "optimizer.name": {"optimizer.name": "sgd"},
    "score_roles": {"score_roles": ("teacher",)},
    "schedules": {"schedules": {"weight/policy": {"kind": "constant", "value": 0.5}}},
}
CONTEXT = {
    **{field: CORRECTION_CONTEXT[field.split(".")[1]] for field in CORRECTION_FLIPS},
    "rollout_mismatch.noise_kind": MISMATCH,
    "gamma": {"advantage": "reinforce_pp"},
    "gae_lambda": {"advantage": "gae"},
    "whiten_advantages": {"advantage": "gae"},
    "critic.value_clip": {"advantage": "gae"},     # ppo_epochs=2: the second epoch's values move, and are clipped
    "policy_kwargs": {"policy_loss": "sapo"},
    **{f"onepo.{k}": ONEPO for k in ("teacher_rows", "max_accuracy")},
    # The test reward is 0 on every even-prompt row, teacher rows included: guiding every group (accuracy <= 1)
    # gives teacher rows in groups with reward variance, where their advantages (and loss) are not 0.
    **{f"onepo.{k}": {**ONEPO, "onepo.max_accuracy": 1.0} for k in ("alpha0", "teacher_in_baseline", "gamma")},
    "onepo.anneal_steps": {"augment": "onepo"},
    "onepo.rule": ONEPO,
    # Step 1 of a horizon of 2: the cutoff offers the teacher to every group, the linear schedule to half.
    "onepo.retire": {**HUATUO, "onepo.anneal_steps": 2, "steps": 2},
    # A floor below every teacher token's probability (~1/84): no token is low-support, so the second epoch's
    # ratios are pi / pi_old (clipped), not pi / floor with the rescale. With one update (ratio 1) and A > 0,
    # the only teacher rows of one iteration, the floor changes nothing (tests/objectives/test_onepo.py).
    "onepo.floor": HUATUO,
    "surrogate_rows": {"augment": "demonstration"},
    # Dual clip caps the loss of negative-advantage tokens whose ratio rose above it; the nll term makes the
    # first epoch raise every sampled token, so the second epoch has such tokens.
    "dual_clip": {"loss_terms": {"test_stages_nll": 0.5}},
    "reward.kwargs": {"reward.name": "verifier_format"},
    "kl_estimator": {"kl_beta": 0.5},
    "max_sampling_rounds": {"filter": "dynamic_sampling"},
    "overlong_factor": {"overlong_cache": 2},
    "eval_every": {"steps": 2},
}
# The optimizer fields of LoGRA and predicted-KL control: flipped in tests/optim/test_logra_training.py.
LOW_RANK_FIELDS = tuple(k for k in optimizer_defaults() if k.startswith("logra_")) + ("kl_target",)
# Fields whose effect needs more than a one-iteration flip, and the test that shows it.
COVERED_ELSEWHERE = {
    "kind": "the stage kind itself (registry STAGES)",
    "collector": "tests/train/test_weight_sync.py (its runs sample through a registered collector of the test)",
    "policy": "tests/train/test_policy_adapter.py::test_rl_policy_selects_the_adapter_the_step_differentiates",
    "sync.quantizer": "tests/quant/test_quantizers.py (an RL run sampling from the int8 copy; bf16 bit-exact)",
    "sync.quant_layers": "tests/train/test_weight_sync.py::test_every_sync_field_changes_the_sampler_copy (the "
                         "copy's kernels of the other layers stay unquantized)",
    "task.name": "tests/train/test_run.py (the run driver builds the stage's Context from the stage's task)",
    "task.kwargs": "tests/train/test_run.py (as task.name)",
    "reward.timeout_s": "test_hanging_verifier_times_out",
    "max_skipped_updates": "test_max_skipped_updates_stops_the_stage",
    "reward.call_timeout_s": "test_stage_builds_the_executor_with_both_time_limits; the cap itself: "
                             "tests/rewards/test_executor.py::test_call_timeout_caps_a_call",
    **{k: "test_stage_passes_replay_routing_to_the_scorer_and_the_step, and its effect on an MoE model: "
          "tests/train/test_phases.py::test_routing_replay_*, tests/models/test_moe.py (weights), "
          "tests/optim/test_frozen.py (an RL run replaying experts, weights and FP4 rounding)"
       for k in ("replay_routing", "moe.replay_weights", "moe.trace")},
    "moe.aux_loss_coef": "tests/train/test_policy_adapter.py::test_the_moe_aux_loss_enters_the_update",
    **{f"optimizer.{k}": "test_every_optimizer_field_changes_the_updates" for k in optimizer_defaults()
       if k not in ("lr", "name") and k not in LOW_RANK_FIELDS},
    **{f"optimizer.{k}": "tests/optim/test_logra_training.py::test_every_logra_field_changes_the_updates"
       for k in LOW_RANK_FIELDS},
    **{f"critic.optimizer.{k}": "test_the_critic_trains_with_its_own_optimizer_section" for k in optimizer_defaults()},
    "onepo.teacher": "test_onepo_teacher_rows_join_guided_groups_only (a model teacher)",
    **{f"distill.{k}": "tests/train/test_distill_stage.py (each field against the teacher of every run)"
       for k in ("teacher", "top_k", "beta", "reward_weight", "reward_advantage")},
    "distill.cross_tokenizer": "tests/train/test_xtok_stage.py (each mode against a teacher of another tokenizer, "
                               "and the same-tokenizer limit)",
    "correction.calibrated_sigma_decay": "tests/objectives/test_correction.py (the sigma update over three "
                                         "batches; its first update is the batch median whatever the decay)",
    **{f"slca.{k}": "tests/objectives/test_segments.py::test_the_estimator_reads_the_reward_and_the_batch_and_"
                    "every_field_acts (single-turn runs have no tool-call or summary tokens)"
       for k in ("kinds", "weights", "scale", "gate", "gate_threshold")},
    **{f"srd.{k}": "tests/train/test_srd_stage.py::test_every_srd_field_acts (the hindsight scorer and the srd "
                   "terms on a key_door run's scored batch: single-turn runs have no episode to show)"
       for k in ("hindsight", "field", "template", "weight_hi", "weight_lo", "zero_tol", "top_k", "beta")},
    **{f"multi_turn.{k}": "tests/train/test_multi_turn_stage.py::test_every_multi_turn_field_acts (on the collector)"
       for k in ("env", "max_turns", "turn_tokens", "renderer", "chat_template", "observation_role")},
    "multi_turn.tools": "tests/agents/test_tools.py (user tools load by name and run as the calculator's do)",
    "multi_turn.tool_timeout_s": "tests/agents/test_tools.py::test_calls_become_results_or_error_observations_"
                                 "within_the_time_limit, and tests/agents/test_runner.py",
    **{f"async_rollout.{k}": "tests/train/test_async_collect.py::test_every_async_field_acts (on the scheduler "
                             "it builds and the elastic step; the runs in that file flip prefetch and elastic)"
       for k in ("backend", "workers", "items_per_call", "chunk_tokens", "max_staleness", "prefetch", "stale",
                 "timeout_s", "max_attempts", "address", "num_cpus", "fault_rate", "elastic", "max_workers",
                 "elastic_low", "elastic_high")},
    **{f"gar.{k}": "tests/rewards/test_graders.py::test_every_gar_field_acts (advantage=gar needs a reward with "
                   "a passing set and a quality component)"
       for k in ("quality", "lam_cap", "scale", "length_coef", "pass_rate_min", "anchor_quantile", "flag_kinds",
                 "amplify")},
    **{f"sync.{k}": "tests/train/test_weight_sync.py::test_every_sync_field_changes_the_sampler_copy (the "
                    "sampler copy needs a mesh; the RL runs with sync on are in that file too)"
       for k in ("kind", "dtype", "capacity_frac", "impl", "mesh.data", "mesh.fsdp", "mesh.tensor", "verify_dense")},
}
# Metrics a flip may change instead of the update (e.g. a reward scale, which group advantages normalise away).
COMPARED = ("reward", "loss", "entropy", "kl", "sampling_rounds", "response_len", "mismatch/mean", "grad_norm",
            "critic/loss")


def _fields(section, prefix=""):
  for key, value in section.items():
    if isinstance(value, ml_collections.ConfigDict) and key not in ("kwargs", "loss_terms", "policy_kwargs",
                                                                    "schedules"):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield prefix + key


def test_every_rl_field_has_a_flip_or_a_test():
  fields = set(_fields(rl_defaults()))
  missing = fields - set(FLIPS) - set(COVERED_ELSEWHERE)
  assert not missing, f"RL fields without a no-dead-switch check: {sorted(missing)}"
  assert not (set(FLIPS) | set(COVERED_ELSEWHERE)) - fields, "checks of fields that no longer exist"


@pytest.fixture(scope="module")
def baseline():
  run = one_iteration()
  m = run.metrics
  assert m["informative_groups"] > 0, "the baseline must have reward variance to test the switches"
  assert np.abs(run.delta).max() > 0
  return run


# The off-policy and OnePO switches run in tests/train/test_stage_switches.py (with their contexts): one file
# of every flip was the last file of the test run, alone on one worker for minutes.
OWN_FILE = ("correction.", "rollout_mismatch.", "onepo.")


def check_switch(baseline, field):
  """`FLIPS[field]` (run in its CONTEXT) changes the update, a compared metric, the loop or the inputs."""
  context = CONTEXT.get(field, {})
  base = one_iteration(**context) if context else baseline
  run = one_iteration(**{**context, **FLIPS[field]})
  if field == "micro_batches":   # the same maths by design: only the memory profile may differ
    np.testing.assert_allclose(run.delta, base.delta, atol=1e-6)
    return
  changed_update = run.delta.shape != base.delta.shape or not np.allclose(run.delta, base.delta, atol=1e-9)
  changed_metrics = [k for k in COMPARED if k in run.metrics and k in base.metrics
                     and not np.isclose(run.metrics[k], base.metrics[k], rtol=1e-6, atol=0)]
  changed_loop = len(run.rows) != len(base.rows) or run.eval_steps != base.eval_steps
  changed_inputs = sorted(run.batches[0].extras) != sorted(base.batches[0].extras)
  assert changed_update or changed_metrics or changed_loop or changed_inputs, field


@pytest.mark.parametrize("field", sorted(f for f in FLIPS if not f.startswith(OWN_FILE)))
def test_every_rl_stage_switch_changes_the_iteration(baseline, field):
  check_switch(baseline, field)


def test_every_optimizer_field_changes_the_updates():
  """The optimizer section (built by `make_optimizer` from `rl.optimizer`): each field changes the updates of
  three steps with large gradients (clip_norm acts), with the schedule fields under a decaying schedule."""
  params = {"w": jnp.linspace(-1.0, 1.0, 4)}
  grads = [{"w": jnp.asarray([3.0, -2.0, 1e-9, 0.5]) * s} for s in (1.0, -2.0, 0.5)]   # momentum matters

  def updates(**fields):
    cfg = optimizer_defaults()
    cfg.update(fields)
    tx = make_optimizer(cfg, total_steps=4)
    state, p, out = tx.init(params), params, []
    for g in grads:
      u, state = tx.update(g, state, p)
      p = optax.apply_updates(p, u)
      out.append(np.asarray(u["w"]))
    return np.stack(out)

  flips = {"name": ("sgd", {}), "lr": (3e-3, {}), "schedule": ("cosine", {}), "b1": (0.5, {}),
           "b2": (0.9, {}), "eps": (1.0, {}), "weight_decay": (0.1, {}), "clip_norm": (0.0, {}),
           "warmup_steps": (2, {}), "final_lr_frac": (0.5, {"schedule": "linear"}), "frozen": ("w", {})}
  assert set(flips) == set(optimizer_defaults()) - set(LOW_RANK_FIELDS)
  with _fast_compile():
    constant, linear = updates(), updates(schedule="linear")
    for field, (value, context) in flips.items():
      base = linear if context else constant
      assert not np.allclose(base, updates(**context, **{field: value}), rtol=1e-6, atol=0), field


def test_logra_with_predicted_kl_control_trains_the_rl_stage():
  """`rl.optimizer.name='logra'` (sketched RowAdam on the projections) with `kl_target`: the RL update runs
  through the sketch path, and each update, whose unscaled step predicts more KL on its batch than the
  target, is scaled down (alpha^2 q = target exactly: tests/optim/test_logra_training.py)."""
  run = one_iteration(**{"optimizer.name": "logra", "optimizer.logra_rank": 4, "optimizer.kl_target": 1e-5})
  m = run.metrics
  assert np.abs(run.delta).max() > 0 and m["skipped_updates"] == 0
  assert 0 < m["kl/scale"] < 1 and m["kl/predicted"] > 1e-5      # (means over the 2 updates) scaled down
  assert 0.5e-5 < m["kl/realised"] < 2e-5                          # the realised KL is near the target


def test_stage_passes_the_optimizer_section():
  """`rl.optimizer` reaches the stage's optimizer whole (the fields above act through `make_optimizer`), with
  the stage's number of updates (steps x ppo_epochs x minibatches) for the schedules."""
  run = one_iteration(**FLIPS["optimizer.lr"])
  want = _config(FLIPS["optimizer.lr"]).optimizer.to_dict()
  assert run.optimizers and all(section == want and total == 2 for section, total in run.optimizers)


# ------------------------------------------------------------------------- mismatch under truncated sampling

@pytest.mark.parametrize("flip", ["temperature", "top_k", "top_p"])
def test_mismatch_is_float_rounding_under_truncated_sampling(baseline, flip):
  """Identical weights: the trainer's old log-probs equal the sampler's under the processed distribution (before
  the rewrite: 0.68 nats under top_p=0.5 and 3.1 under top_k=3)."""
  for m in (baseline.metrics, one_iteration(**FLIPS[flip]).metrics):
    assert 0 <= m["mismatch/mean"] <= 1e-5, (flip, m["mismatch/mean"], m["mismatch/max"])
    assert m["mismatch/max"] <= 1e-4, (flip, m["mismatch/max"])


# ------------------------------------------------------------------------------------------ padding rows

def test_masked_padding_rows_change_no_advantage_loss_or_gradient(baseline):
  """A padding row per group (valid False, masks False, garbage tokens, a huge reward): the iteration's
  update and loss equal the run without it."""
  padded = one_iteration(augment="test_stages_pad")
  batch = padded.batches[0]
  pad = np.asarray(batch.row_source) == ROW_SOURCE["padding"]
  assert pad.sum() == PROMPTS and batch.num_rows == PROMPTS * (GROUP + 1)
  assert not np.asarray(batch.loss_mask)[pad].any() and not np.asarray(batch.attention_mask)[pad].any()
  assert np.all(np.asarray(batch.advantages)[pad] == 0)
  # The real rows' advantages are the unpadded run's, row for row.
  np.testing.assert_allclose(np.asarray(batch.advantages)[~pad], np.asarray(baseline.batches[0].advantages),
                             rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(padded.metrics["loss"], baseline.metrics["loss"], rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(padded.metrics["grad_norm"], baseline.metrics["grad_norm"], rtol=1e-5)
  # Updates are ~lr = 1e-3; the second epoch's Adam step amplifies float-rounding differences of the summation
  # order (20 rows instead of 16) to ~2e-7 on a few coordinates. A padding row that leaked changes them by ~lr.
  np.testing.assert_allclose(padded.delta, baseline.delta, rtol=1e-4, atol=1e-6)
  assert np.abs(baseline.delta).max() > 1e-5       # there is an update to compare


# -------------------------------------------------------------------------------------- demonstration rows

def test_demonstration_adds_one_teacher_row_per_group(baseline):
  run = one_iteration(augment="demonstration")
  batch = run.batches[0]
  cap = GROUP + 1
  source = np.asarray(batch.row_source).reshape(PROMPTS, cap)
  assert np.all(source[:, :GROUP] == ROW_SOURCE["policy"]) and np.all(source[:, GROUP] == ROW_SOURCE["teacher"])
  assert run.metrics["rows/teacher"] == PROMPTS
  groups = np.asarray(batch.group_ids).reshape(PROMPTS, cap)
  assert np.all(groups == groups[:, :1])                     # the teacher row sits in its prompt's group
  response = np.asarray(batch.response).reshape(PROMPTS, cap, -1)
  mask = np.asarray(batch.loss_mask).reshape(PROMPTS, cap, -1)
  policy_rows = np.asarray(batch.tokens).reshape(PROMPTS, cap, -1)
  for g in range(PROMPTS):
    prompt = TOK.decode(policy_rows[g, 0, :-MAX_NEW].tolist())
    answer = str(eval(prompt.rstrip("=")))                   # the arithmetic task's demonstration: the answer
    want = TOK.encode(answer, add_eos=True)[:MAX_NEW]
    assert response[g, GROUP, :len(want)].tolist() == want and mask[g, GROUP].sum() == len(want)
    assert np.all(policy_rows[g, GROUP, :-MAX_NEW] == policy_rows[g, 0, :-MAX_NEW])   # same prompt
  teacher = source.reshape(-1) == ROW_SOURCE["teacher"]
  assert np.all(np.asarray(batch.rollout_logp)[teacher] == 0)
  assert not np.allclose(run.delta, baseline.delta, atol=1e-9)


def test_mismatch_is_over_policy_rows_only():
  """Teacher rows have no sampler log-probs (0): counted, they would make the mismatch their own log-probs."""
  run = one_iteration(augment="demonstration")
  batch = run.batches[0]
  mask = np.asarray(batch.loss_mask)
  delta = np.abs(np.asarray(batch.old_logp) - np.asarray(batch.rollout_logp))
  policy = (np.asarray(batch.row_source) == ROW_SOURCE["policy"])[:, None] & mask
  assert delta[mask].mean() > 0.1                            # what counting every row would give
  np.testing.assert_allclose(run.metrics["mismatch/mean"], delta[policy].mean(), rtol=1e-5, atol=1e-9)
  assert run.metrics["mismatch/mean"] <= 1e-5


# -------------------------------------------------------------------------------------- dynamic sampling

def test_group_ids_are_unique_across_dynamic_sampling_rounds():
  run = one_iteration(filter="dynamic_sampling")
  assert run.metrics["sampling_rounds"] > 1
  ids = np.asarray(run.batches[0].group_ids).reshape(PROMPTS, GROUP)
  assert np.all(ids == ids[:, :1]), "a group's rows share one id"
  assert len(set(ids[:, 0].tolist())) == PROMPTS, f"group ids repeat across rounds: {ids[:, 0]}"
  assert ids.max() >= PROMPTS, "the batch mixes groups from more than one round"
  # Only informative groups were kept (every odd-operand group has variance, every even one is flat).
  adv = np.asarray(run.batches[0].advantages)[:, 0].reshape(PROMPTS, GROUP)
  assert np.all(np.abs(adv).max(axis=1) > 0)


# ---------------------------------------------------------------------------------------- hanging verifier

def test_hanging_verifier_times_out():
  """Every 8th row's verifier sleeps forever; with reward.timeout_s=0.5 the iteration completes and logs them."""
  run = one_iteration(**{"reward.name": "test_stages_hang", "reward.timeout_s": 0.5})
  hung = -(-PROMPTS * GROUP // 8)
  assert run.metrics["reward_failures/timeout"] == hung
  assert run.metrics["reward_failures"] == hung
  assert np.abs(run.delta).max() > 0                         # the other rows' rewards still trained


# ------------------------------------------------------------------------------------- non-finite guard

def test_non_finite_updates_are_skipped():
  run = one_iteration(loss_terms={"test_stages_nan": 1.0}, max_skipped_updates=0)
  assert run.metrics["skipped_updates"] == 2                 # ppo_epochs=2 x minibatches=1, all skipped
  assert np.all(run.delta == 0), "a skipped update changed the parameters"
  assert int(run.state["train"].step) == 0


def test_max_skipped_updates_stops_the_stage():
  overrides = dict(loss_terms={"test_stages_nan": 1.0}, max_skipped_updates=2, ppo_epochs=1, steps=3)
  log = _Log()
  with pytest.raises(TrainingError, match="max_skipped_updates") as err:
    run_stage(overrides, logger=log)
  assert "2 update steps in a row" in str(err.value)
  assert len(log.rows) == 1        # iteration 1 skipped its one update and was logged; iteration 2 raised
  assert log.rows[0]["skipped_updates"] == 1


def test_score_roles_add_each_roles_logprobs():
  """`score_roles=("teacher",)`: the TrainBatch carries the teacher's log-probs of every response token, by the
  same scorer as old_logp, from the teacher's own params."""
  from rlkit.rollout.scoring import make_scorer
  run = one_iteration(score_roles=("teacher",))
  batch = run.batches[0]
  teacher = np.asarray(batch.extras["teacher_logp"])
  mask = np.asarray(batch.loss_mask)
  sampling = sampling_config(_config({}), TOK)
  with _fast_compile():
    want = make_scorer(MODEL, sampling)(_roles()["teacher"].params, batch)
  np.testing.assert_allclose(teacher, want, rtol=1e-5, atol=1e-6)
  assert np.abs(teacher - np.asarray(batch.old_logp))[mask].mean() > 0.1     # not the policy's numbers


# ---------------------------------------------------------------------------------------- routing replay

class _Built(Exception):
  pass


def test_stage_passes_replay_routing_to_the_scorer_and_the_step():
  """The stage builds its update step and its policy scorer with what `rl.replay_routing`, `rl.moe.replay_weights`
  and `rl.moe.trace` ask to replay (what they do with it on an MoE model: tests/train/test_phases.py,
  tests/models/test_moe.py). Checked at build time; the run stops before sampling."""
  for fields, replay in (({"replay_routing": True}, ("experts",)), ({"replay_routing": False}, ()),
                         ({"moe": {"replay_weights": True}}, ("experts", "weights")),
                         ({"moe": {"trace": True}}, ("trace",))):
    seen = {}

    def spy_step(make):
      def wrapped(model, tx, cfg, sampling, micro_batches=1, replay_routing=False, *rest):
        seen["step"] = replay_routing
        return make(model, tx, cfg, sampling, micro_batches, replay_routing, *rest)
      return wrapped

    def spy_scorer(make):
      def wrapped(model, sampling, replay_routing=False):
        seen["scorer"] = replay_routing
        raise _Built()
      return wrapped

    with pytest.raises(_Built):
      run_stage(fields, patches=[(rl_stage, "make_rl_step", spy_step), (score_phase, "make_scorer", spy_scorer)])
    assert seen == {"step": replay, "scorer": replay}


class _ExecutorBuilt(Exception):
  pass


def test_stage_builds_the_executor_with_both_time_limits(monkeypatch):
  """The stage hands reward.timeout_s and reward.call_timeout_s to its VerifierExecutor (0: no cap)."""
  seen = []

  def fake_executor(**kw):
    seen.append(kw)
    raise _ExecutorBuilt

  monkeypatch.setattr(rl_stage, "VerifierExecutor", fake_executor)
  cfg = rl_defaults()
  rng = np.random.default_rng(0)
  source = [TASK.make_example(rng) for _ in range(cfg.prompts_per_step)]
  ctx = Context(config=base_config(), model=MODEL, tokenizer=TOK, task=TASK, train_source=source,
                eval_records=[], logger=None, checkpointer=None, key=jax.random.key(0), put_batch=lambda b: b)
  for timeout, cap, expected in ((2.0, 0.0, None), (2.0, 7.5, 7.5)):
    cfg.reward.timeout_s, cfg.reward.call_timeout_s = timeout, cap
    with pytest.raises(_ExecutorBuilt):
      STAGES.get("rl").run(ctx, cfg, {}, 0, {"stage": "rl", "stage_index": 0, "offset": 0})
    assert seen[-1] == {"timeout_s": timeout, "call_timeout_s": expected}


def test_tis_correction_weights_reach_the_update():
  run = one_iteration(**{"correction.name": "rollout_correction", "correction.rollout_is": "token",
                         "correction.rollout_is_threshold": "1.5"})
  b = run.batches[0]
  mask = np.asarray(b.loss_mask)
  ratio = np.exp(np.asarray(b.old_logp) - np.asarray(b.rollout_logp))
  np.testing.assert_allclose(np.asarray(b.token_weights)[mask], np.minimum(ratio, 1.5)[mask], rtol=1e-6)
  assert 0.99 < run.metrics["rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-6   # on-policy: ratios ~ 1


def test_rejected_tokens_leave_the_loss_mask_and_its_denominator():
  """Under engine noise, token rejection (verl token_k1 window [1/1.2, 1.2]) removes exactly the tokens whose
  ratio is outside it from the loss mask the update sees."""
  plain = one_iteration(**MISMATCH).batches[0]
  run = one_iteration(**MISMATCH, **{"correction.name": "rollout_correction", "correction.rollout_rs": "token_k1",
                                     "correction.rollout_rs_threshold": "1.2"})
  b = run.batches[0]
  before = np.asarray(plain.loss_mask)
  ratio = np.exp(np.asarray(b.old_logp) - np.asarray(b.rollout_logp))
  inside = (ratio >= 1 / 1.2) & (ratio <= 1.2)
  np.testing.assert_array_equal(np.asarray(b.loss_mask), before & inside)
  assert 0 < (before & ~inside).sum() < before.sum()
  np.testing.assert_allclose(run.metrics["rollout_corr/rollout_rs_masked_fraction"],
                             (before & ~inside).sum() / before.sum(), rtol=1e-6)


def test_kl_reference_is_the_initial_policy_unless_a_reference_role_is_declared(monkeypatch):
  """Without `models.reference` the KL reference is the stage's initial policy (at the first iteration its
  log-probs are the old ones); with it, the declared model's, scored by the same scorer."""
  from rlkit.rollout.scoring import make_scorer
  default = one_iteration(kl_beta=0.5).batches[0]
  np.testing.assert_array_equal(np.asarray(default.ref_logp), np.asarray(default.old_logp))
  teacher = _roles()["teacher"]
  monkeypatch.setattr(sys.modules[__name__], "_roles", lambda: {"reference": teacher})
  batch = run_stage({"kl_beta": 0.5}).batches[0]
  with _fast_compile():
    want = make_scorer(MODEL, sampling_config(_config({}), TOK))(teacher.params, batch)
  np.testing.assert_allclose(np.asarray(batch.ref_logp), want, rtol=1e-5, atol=1e-6)
  assert np.abs(np.asarray(batch.ref_logp) - np.asarray(batch.old_logp))[np.asarray(batch.loss_mask)].mean() > 0.1


# ------------------------------------------------------------------------------------------ PPO critic

def test_the_critic_trains_with_its_own_optimizer_section(monkeypatch):
  """advantage=gae trains `state["critic"]` (decoder + value head) with `rl.critic.optimizer`, built by the
  critic, not the policy's: its lr changes the critic's parameters and leaves the policy's update as it is."""
  _CRITICS.clear()                           # every critic of this test is built (and its optimizer made) anew
  seen = []
  original = critic_module.make_optimizer
  monkeypatch.setattr(critic_module, "make_optimizer",
                      lambda section, total: seen.append(section.to_dict()) or original(section, total))
  base = run_stage({"advantage": "gae"})
  other = run_stage({"advantage": "gae", "critic.optimizer.lr": 1e-2, "critic.optimizer.name": "sgd"})
  assert seen[0] == _config({"advantage": "gae"}).critic.optimizer.to_dict()
  assert seen[-1]["lr"] == 1e-2 and seen[-1]["name"] == "sgd"
  init_head = np.zeros(MODEL.cfg.hidden_size)
  for run in (base, other):
    assert np.abs(np.asarray(run.state["critic"].params["value_head"]["w"]) - init_head).max() > 0
    assert int(run.state["critic"].step) == 2                 # ppo_epochs=2 x minibatches=1
  np.testing.assert_array_equal(base.delta, other.delta)      # the policy's update does not read the critic
  heads = [np.asarray(r.state["critic"].params["value_head"]["w"]) for r in (base, other)]
  assert not np.allclose(*heads)
  assert np.isfinite(base.metrics["critic/loss"]) and "critic/vf_explained_var" in base.metrics


def test_gae_on_the_first_iteration_is_the_whitened_reward_to_go():
  """The value head starts at 0, so the first values are exactly 0 and GAE(gamma=lam=1) is the outcome reward
  on every response token; the batch's advantages are that, whitened over the loss tokens; returns too."""
  run = one_iteration(advantage="gae")
  b = run.batches[0]
  mask = np.asarray(b.loss_mask)
  values = np.asarray(b.extras["values"])
  assert (values == 0).all()
  rewards = np.array([run.metrics["reward"]])   # (mean only); rebuild per-row rewards from the returns
  returns = np.asarray(b.extras["returns"])
  per_row = np.array([r[m][0] if m.any() else 0.0 for r, m in zip(returns, mask)])
  np.testing.assert_allclose(returns[mask], np.repeat(per_row, mask.sum(1)), rtol=1e-6)
  np.testing.assert_allclose(per_row.mean(), rewards[0], rtol=1e-5)
  tok = returns[mask]
  np.testing.assert_allclose(np.asarray(b.advantages)[mask], (tok - tok.mean()) / np.sqrt(tok.var(ddof=1) + 1e-8),
                             rtol=1e-4, atol=1e-5)


def test_the_critic_role_gives_the_critics_initial_decoder(monkeypatch):
  """With `models.critic` the critic's decoder starts from that model, not from the policy."""
  from rlkit.train.critic import build_critic
  teacher = _roles()["teacher"]
  cfg = _config({"advantage": "gae"})
  ctx = Context(config=base_config(), model=MODEL, tokenizer=TOK, task=TASK, train_source=[], eval_records=[],
                logger=_Log(), checkpointer=_NoCkpt(), key=jax.random.key(1), put_batch=lambda b: b,
                models={"critic": Model(MODEL, teacher.params, TOK, True)})
  state = build_critic(ctx, cfg).init(_initial_params())
  for a, b in zip(jax.tree.leaves(state.params["decoder"]), jax.tree.leaves(teacher.params)):
    np.testing.assert_array_equal(a, b)
  small = Transformer(MODEL.cfg.replace(vocab_size=MODEL.cfg.vocab_size - 1))
  ctx.models = {"critic": Model(small, init_params(small.cfg, jax.random.key(2)), TOK, True)}
  with pytest.raises(ValueError, match="vocabulary"):
    build_critic(ctx, cfg)


def test_ppo_critic_calibrated_is_and_dynamic_sampling_compose():
  """PPO with a critic + calibrated IS under simulated engine noise + DAPO dynamic sampling, in one iteration:
  each piece acts (the critic trains, sigma becomes this batch's median, groups are filtered)."""
  run = one_iteration(**GENTLE, advantage="gae", filter="dynamic_sampling", **{"correction.name": "calibrated"})
  m = run.metrics
  assert m["sampling_rounds"] >= 1 and np.isfinite(m["loss"]) and np.isfinite(m["critic/loss"])
  assert m["rollout_corr/sigma"] == pytest.approx(0.1)              # calibrated_sigma_init for the first batch
  state = run.state["correction"]
  sigma = float(state["sigma_ema"]) / (1 - 0.99 ** int(state["sigma_updates"]))
  assert sigma == pytest.approx(m["rollout_corr/sigma_batch"], rel=1e-5) and sigma != pytest.approx(0.1)
  assert m["rollout_corr/rollout_rs_masked_fraction"] < 1 and m["rollout_corr/log_ratio_abs_mean"] > 0.01
  assert np.abs(run.delta).max() > 0


# ---------------------------------------------------------------------------------------------------- OnePO

@default_emitters
def test_onepo_with_an_anneal_length_of_zero_is_plain_grpo_exactly():
  recipe = {**ONEPO, "onepo.anneal_steps": 0, "steps": 2}
  onepo, grpo = run_stage(recipe), run_stage({"steps": 2})
  np.testing.assert_array_equal(onepo.delta, grpo.delta)
  assert [r["loss"] for r in onepo.rows] == [r["loss"] for r in grpo.rows]


@register_reward("test_stages_segments")
def _make_segment_reward(task, executor):
  """`test_stages_digits` with its reward also in the `policy` column of per-segment rewards."""
  digits = _make_digits_reward(task, executor)

  def reward_fn(batch):
    out = digits(batch)
    seg = np.zeros((len(out.rewards), len(SEGMENT_KINDS)))
    seg[:, SEGMENT_KINDS["policy"]] = out.rewards
    return dataclasses.replace(out, segment_rewards=seg)
  return reward_fn


def test_slca_with_one_segment_kind_is_grpo_exactly_on_the_stage():
  """rl.advantage=slca crediting the single-turn `policy` tokens with the whole reward: the stage's updates and
  losses are GRPO's bit for bit."""
  reward = {"reward.name": "test_stages_segments", "steps": 2}
  slca = run_stage({**reward, "advantage": "slca", "slca.kinds": "policy", "slca.weights": "1.0"})
  grpo = run_stage({**reward, "advantage": "group"})
  np.testing.assert_array_equal(slca.delta, grpo.delta)
  assert [r["loss"] for r in slca.rows] == [r["loss"] for r in grpo.rows]


def test_the_tree_policy_trains_as_the_expanded_rows_do():
  """rl.policy=llm_tree (each group's prompt once, tests/train/test_tree_policy.py) on the stage: the same losses
  and updates as `llm` up to float reassociation."""
  tree, rows = run_stage({"policy": "llm_tree", "steps": 2}), run_stage({"steps": 2})
  np.testing.assert_allclose([r["loss"] for r in tree.rows], [r["loss"] for r in rows.rows], rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(tree.delta, rows.delta, atol=1e-5)
  assert np.abs(rows.delta).max() > 1e-4


def test_huatuo_replaces_at_most_one_rollout_per_group_until_its_cutoff():
  """The released rule on the stage: groups keep their size, each holds at most one teacher row (the scripted
  answer, the group's only reward above 0, so its advantage is the group's largest), which the floored term
  trains (its counts); from the cutoff (anneal_steps=1) on, no teacher row."""
  run = run_stage({**HUATUO, "onepo.anneal_steps": 1, "steps": 2})
  first, second = run.batches
  source = np.asarray(first.row_source).reshape(PROMPTS, GROUP)
  teacher = source == ROW_SOURCE["teacher"]
  assert first.row_source.shape == second.row_source.shape == (PROMPTS * GROUP,)
  assert (teacher.sum(1) <= 1).all() and teacher.any()
  assert ((source == ROW_SOURCE["policy"]) | teacher).all()
  adv = np.asarray(first.advantages)[:, 0].reshape(PROMPTS, GROUP)
  assert (adv[teacher] > 0).all() and (adv[teacher] == adv[teacher.any(1)].max(1)).all()
  assert run.rows[0]["floored/teacher_rows"] == teacher.sum() * 2            # summed over the two epochs
  assert run.rows[0]["floored/low_support_tokens"] > 0
  assert not (np.asarray(second.row_source) == ROW_SOURCE["teacher"]).any()
  assert run.rows[1]["floored/teacher_tokens"] == 0


def test_onepo_teacher_rows_join_guided_groups_only(monkeypatch):
  """Teacher rows are real only in all-fail groups, weighted alpha(t) = 1 - t/4 (the scheduled step input
  rows/teacher); the shaped term trains them and the surrogate does not. A model teacher (a config.models role)
  answers with its own samples."""
  run = run_stage({**ONEPO, "steps": 2})
  for step, b in enumerate(run.batches):
    source, valid = np.asarray(b.row_source), np.asarray(b.loss_mask).any(1)
    teacher = source == ROW_SOURCE["teacher"]
    groups = source.reshape(PROMPTS, GROUP + 1)
    assert teacher.sum() == run.rows[step]["rows/teacher"] > 0
    assert ((groups == ROW_SOURCE["teacher"]) | (groups == ROW_SOURCE["padding"]))[:, -1].all()
    assert (groups[:, :GROUP] == ROW_SOURCE["policy"]).all()
    np.testing.assert_array_equal(np.asarray(b.token_weights)[teacher & valid], 1.0)   # alpha: in the step
    assert run.rows[step]["schedule/rows/teacher"] == 1.0 - step / 4
    assert not np.asarray(b.loss_mask)[source == ROW_SOURCE["padding"]].any()     # unguided groups' rows
  assert run.rows[0]["shaped/teacher_tokens"] > 0
  teacher = _roles()["teacher"]
  monkeypatch.setattr(sys.modules[__name__], "_roles", lambda: {"tutor": teacher})
  b = run_stage({**ONEPO, "onepo.teacher": "tutor"}).batches[0]
  rows = np.asarray(b.row_source) == ROW_SOURCE["teacher"]
  demo = one_iteration(**ONEPO).batches[0]
  assert not np.array_equal(np.asarray(b.tokens)[rows], np.asarray(demo.tokens)[rows])
