"""A trained reward model as a reward of the RL stage: an embedding of (prompt, response) by a frozen decoder, a
reward head on it (rlkit/rewards/reward_heads.py and drm.py), and a risk functional of the head's samples.

  e      = mean over the prompt and response tokens of the decoder's final hidden states      `embed`
  r      = risk(samples of the head at e) - uncertainty_coef * std(samples)                   `reward_model`

`risk` is the samples' mean, a lower quantile or CVaR (`risk_reward`): a point head gives its point, a
distributional head (Gaussian, quantile, the diffusion reward model: our design, ../shared/methods/llm.md §11)
can trade mean for safety and shrink the reward of responses its annotators disagree about.

A head is trained by the `reward_model` stage (rlkit/train/reward_model_stage.py), which writes it to a folder
(`save_head`: head.json with the head's name and kwargs, params.msgpack); the reward loads it from `path` and
embeds with the model of `embed_role` (config.models: the decoder the head was trained on, frozen). Samples are
drawn with a key per row from the row's text, so a row's reward does not depend on its batch, and a resumed
run scores as an uninterrupted one.
"""
from __future__ import annotations

import functools
import json
import os
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from rlkit.models.tokenizer import left_padded_batches
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.executor import VerifierExecutor
from rlkit.rewards.head_catalog import build_head, head_spec
from rlkit.rewards.reward_heads import RISKS, risk_reward, uncertainty_penalty
from rlkit.rewards.verifier import RewardFn, check_float, register_reward

HEAD_FILE, PARAMS_FILE = "head.json", "params.msgpack"


@functools.partial(jax.jit, static_argnums=(0,))
def _mean_hidden(module, params, tokens, mask) -> jax.Array:
  hidden = module.apply({"params": params}, tokens, None, mask, logits="none", method=type(module).forward).hidden
  w = mask.astype(jnp.float32)[..., None]
  return jax.lax.stop_gradient((hidden.astype(jnp.float32) * w).sum(1) / jnp.maximum(w.sum(1), 1.0))


def embed(model: Any, prompts, responses, *, batch_size: int = 64) -> np.ndarray:
  """[N, D] float32: the mean final hidden state of each prompt + response (BOS where the tokenizer has one),
  in fixed-size left-padded batches (`left_padded_batches`: one compile per length bucket)."""
  tok = model.tokenizer
  ids = [tok.encode(p, add_bos=tok.bos_id is not None) + tok.encode(r) for p, r in zip(prompts, responses)]
  out = np.zeros((len(ids), model.module.cfg.hidden_size), np.float32)
  for start, tokens, mask in left_padded_batches(ids, batch_size, tok.pad_id):
    real = min(batch_size, len(ids) - start)
    out[start:start + real] = np.asarray(_mean_hidden(model.module, model.params, tokens, mask))[:real]
  return out


def save_head(folder: str, name: str, kwargs: dict, params) -> None:
  """Writes a trained head (its registry name, kwargs and params); files appear whole or not at all."""
  os.makedirs(folder, exist_ok=True)
  for file, data in ((PARAMS_FILE, serialization.to_bytes(params)),
                     (HEAD_FILE, json.dumps({"name": name, "kwargs": kwargs}, indent=1).encode())):
    with open(os.path.join(folder, file + ".tmp"), "wb") as f:
      f.write(data)
    os.replace(os.path.join(folder, file + ".tmp"), os.path.join(folder, file))


def load_head(folder: str, cond_dim: int):
  """(name, kwargs, module, params) of a head written by `save_head`; a clear error if the folder lacks it."""
  path = os.path.join(folder, HEAD_FILE)
  if not os.path.exists(path) or not os.path.exists(os.path.join(folder, PARAMS_FILE)):
    raise ValueError(f"reward 'reward_model': {folder!r} holds no trained head ({HEAD_FILE} and {PARAMS_FILE}); "
                     "give the folder a `reward_model` stage wrote (<workdir>/reward_model/<stage name>).")
  spec = json.load(open(path))
  module = build_head(spec["name"], spec["kwargs"])
  template = jax.jit(lambda k: head_spec(spec["name"]).init(module, k, jnp.zeros((1, cond_dim))))(jax.random.key(0))
  params = serialization.from_bytes(template, open(os.path.join(folder, PARAMS_FILE), "rb").read())
  return spec["name"], spec["kwargs"], module, params


def row_keys(seed: int, texts) -> jax.Array:
  """One PRNG key per text, from the text alone (crc32): a row's samples do not depend on its batch."""
  base = jax.random.key(seed)
  return jax.vmap(lambda h: jax.random.fold_in(base, h))(jnp.asarray([zlib.crc32(t.encode()) for t in texts],
                                                                       jnp.uint32))


@register_reward("reward_model", role_kwargs=("embed_role",))
def make_reward_model(task, executor: VerifierExecutor, *, models, path: str = "", embed_role: str = "",
                      risk: str = "mean", level: float = 0.1, samples: int = 16, uncertainty_coef: float = 0.0,
                      seed: int = 0) -> RewardFn:
  """r = risk(head samples) - uncertainty_coef * std(samples) of a trained head at the row's embedding.
  Components: rm/mean and rm/std of the samples. `correct`: the task verifier's acceptance when the task has
  one (what accuracy is logged from), else None."""
  if not path:
    raise ValueError("reward 'reward_model': set path to the folder a `reward_model` stage wrote its head to.")
  if embed_role not in models:
    raise ValueError(f"reward 'reward_model': embed_role={embed_role!r} is not a model of this run (roles: "
                     f"{', '.join(models) or 'none'}); declare the decoder the head was trained on in config.models.")
  if risk not in RISKS:
    raise ValueError(f"reward 'reward_model': risk must be one of {list(RISKS)}, got {risk!r}.")
  level, coef = check_float("reward_model", "level", level), check_float("reward_model", "uncertainty_coef",
                                                                         uncertainty_coef)
  if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
    raise ValueError(f"reward 'reward_model': samples must be an integer >= 1, got {samples!r}.")
  embedder = models[embed_role]
  name, _, module, params = load_head(path, embedder.module.cfg.hidden_size)
  draw = jax.jit(jax.vmap(lambda k, c: head_spec(name).samples(params, module.apply, k, c[None], samples)[0]))
  verify = getattr(task, "verify", None)

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    n = len(batch)
    cond = embed(embedder, batch.prompts, batch.completions)
    s = draw(row_keys(seed, [p + "\x00" + c for p, c in zip(batch.prompts, batch.completions)]), jnp.asarray(cond))
    rewards = np.asarray(risk_reward(s, risk, level) - uncertainty_penalty(s, coef), np.float64).reshape(n)
    correct = None
    if verify is not None:
      out = executor.map(verify, list(zip(batch.completions, batch.answers)))
      correct = (out.values > 0.5) & ~out.failed
    return RewardOutput(rewards=rewards, correct=correct,
                        components={"rm/mean": np.asarray(jnp.mean(s, -1), np.float64).reshape(n),
                                    "rm/std": np.asarray(jnp.std(s, -1), np.float64).reshape(n)},
                        failures={} if verify is None else out.failures)
  return reward_fn
