"""Phase 4, augment: rows added to each group from elsewhere (a teacher, a peer model, a demonstration);
registry `AUGMENTERS`, config `rl.augment` (default `none`).

An augmenter is registered as `AugmenterSpec(make, extra_rows, check)`: `extra_rows(cfg)` says how many rows it
adds to each group (static, so shapes stay fixed and config validation can check that batches still divide),
`check(cfg, name)` validates the stage section for it, `schedules(cfg)` gives the `rl.schedules` entries its rows'
weights follow unless the config sets them (OnePO's annealed teacher weight, `rows/teacher`), and
`make(cfg, env) -> Augmenter` builds it once per stage, where `env` is an `AugmentEnv` (the stage's
tokenizer, reward function, config, `put_batch` and models by role). It is called as

  augmenter(samples, rewards, key, step) -> (samples, rewards)          (step: the stage step, from 0)

on `group_size`-row groups laid out contiguously; it returns groups of `group_size + extra_rows` rows, the new
rows carrying their `row_source` and rewards. A group may get fewer real rows than `extra_rows`: the rest are
padding rows (`valid` False, every mask False), which change no advantage, loss or gradient.

  none           adds nothing
  demonstration  one row per group: the example's demonstration (the SFT target) as a `teacher` row,
                 scored by the stage's reward (off-policy guidance in the spirit of LUFFY; our variant: the
                 row is trained with the ordinary PPO ratio against the trainer's own old log-probs)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.core.types import ROW_SOURCE, Rollout
from rlkit.rewards import RewardOutput, concat_outputs, take
from rlkit.rollout.scoring import replay_mode
from rlkit.train.phases.collect import Samples
from rlkit.train.phases.reward import compute_rewards


@dataclasses.dataclass
class AugmentEnv:
  tokenizer: Any
  reward_fn: Callable
  cfg: Any                                  # the stage section
  put_batch: Callable[[dict], dict]
  models: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Augmenter:
  extra_rows: int
  fn: Optional[Callable] = None             # (samples, rewards, key, step) -> (samples, rewards); None: identity

  def __call__(self, samples: Samples, rewards: RewardOutput, key, step: int = 0) -> tuple[Samples, RewardOutput]:
    return (samples, rewards) if self.fn is None else self.fn(samples, rewards, key, step)


def _no_check(cfg, name: str) -> None:
  pass


def _no_schedules(cfg) -> dict:
  return {}


class AugmenterSpec(NamedTuple):
  make: Callable[[Any, AugmentEnv], Augmenter]
  extra_rows: Callable[[Any], int]
  check: Callable[[Any, str], None] = _no_check   # (stage section, its name) -> None; ValueError naming the fix
  schedules: Callable[[Any], dict] = _no_schedules   # (stage section) -> default `rl.schedules` entries it reads


AUGMENTERS: Registry[AugmenterSpec] = Registry("augmenter")


def build_augmenter(cfg, env: AugmentEnv) -> Augmenter:
  spec = AUGMENTERS.get(cfg.augment)
  augmenter = spec.make(cfg, env)
  if augmenter.extra_rows != spec.extra_rows(cfg):
    raise ValueError(f"augmenter {cfg.augment!r} adds {augmenter.extra_rows} rows per group but declares "
                     f"{spec.extra_rows(cfg)}; make AugmenterSpec.extra_rows agree with it.")
  return augmenter


AUGMENTERS.add("none", AugmenterSpec(lambda cfg, env: Augmenter(0), lambda cfg: 0))


def interleave_groups(base: Samples, base_rewards: RewardOutput, extra: Samples, extra_rewards: RewardOutput,
                      group_size: int, extra_rows: int) -> tuple[Samples, RewardOutput]:
  """Groups of `group_size` base rows followed by their `extra_rows` added rows, group by group."""
  groups = len(base) // group_size
  order = np.concatenate([np.concatenate([g * group_size + np.arange(group_size),
                                          len(base) + g * extra_rows + np.arange(extra_rows)])
                          for g in range(groups)])
  merged = Samples.concat([base, extra]).take(order)
  return merged, take(concat_outputs([base_rewards, extra_rewards]), order)


def response_rows(tokenizer, texts: list, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Tokenized completions + EOS, right-padded / cut to `width`: ([n, width] int32, mask)."""
  tokens = np.full((len(texts), width), pad_id, np.int32)
  mask = np.zeros((len(texts), width), bool)
  for i, text in enumerate(texts):
    ids = tokenizer.encode(text, add_eos=True)[:width]   # as SFT's target: the completion, then EOS
    tokens[i, :len(ids)], mask[i, :len(ids)] = ids, True
  return tokens, mask


def demonstration_augmenter(cfg, env: AugmentEnv) -> Augmenter:
  """One `teacher` row per group with the example's demonstration (the SFT target) as the response."""
  group_size, width, tok = cfg.group_size, cfg.max_new_tokens, env.tokenizer

  def add(samples: Samples, rewards: RewardOutput, key, step):
    del key, step
    first = np.arange(0, len(samples), group_size)          # one row per group carries the example
    base = samples.take(first)
    texts = [e["demonstration"] for e in base.examples]
    response, mask = response_rows(tok, texts, width, tok.pad_id)
    ro = base.rollout
    lengths = mask.sum(1).astype(np.int32)
    finished = np.array([bool(m.any()) and int(r[m.sum() - 1]) in tok.stop_ids for r, m in zip(response, mask)])
    dev = env.put_batch({"response": response, "response_mask": mask, "lengths": lengths, "finished": finished})
    rollout = Rollout(prompt=ro.prompt, prompt_mask=ro.prompt_mask, response=dev["response"],
                      response_mask=dev["response_mask"],
                      logprobs=jnp.zeros_like(dev["response"], jnp.float32),     # not sampled: no behaviour logp
                      lengths=dev["lengths"], finished=dev["finished"], group_ids=ro.group_ids,
                      extras={k: jnp.zeros_like(v) for k, v in ro.extras.items()})
    extra = dataclasses.replace(base, rollout=rollout, row_source=np.full(len(first), ROW_SOURCE["teacher"],
                                                                          np.int32))
    extra_rewards = compute_rewards(env.reward_fn, extra, tok, cfg)
    return interleave_groups(samples, rewards, extra, extra_rewards, group_size, 1)

  return Augmenter(1, add)


def _check_demonstration(cfg, name: str) -> None:
  if replay_mode(cfg):
    raise ValueError(f"{name}.augment='demonstration' has no sampler routing to replay for its rows; set "
                     f"{name}.replay_routing=False, {name}.moe.replay_weights=False and {name}.moe.trace=False.")


AUGMENTERS.add("demonstration", AugmenterSpec(demonstration_augmenter, lambda cfg: 1, _check_demonstration))
