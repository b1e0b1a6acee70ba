"""A language model as a yes/no judge: P(yes) of a judge prompt, for rubric items no exact checker can decide.

The judge is a model of the run (a role of `config.models`, rlkit/train/models.py): it reads one prompt per
(row, item), e.g. "<question><answer>\\nstates the dose? ", and its next-token distribution gives

  p = P(yes) / (P(yes) + P(no))          yes, no: the first token of each answer word

the item's judgment in [0, 1] (rlkit/rewards/rubric.py, check kind "lm"). Renormalising over the two answers
makes the judgment independent of mass the judge puts elsewhere. Prompts are left-padded to a length bucket (a
power of two, `left_padded_batches`) and scored in fixed-size batches, so a run compiles the judge once per bucket. The forward pass
runs in the trainer process, not in the executor's worker: it is a jitted JAX computation, not untrusted code.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.models.tokenizer import left_padded_batches

DEFAULT_TEMPLATE = "{prompt}{completion}\n{criterion}? "


@functools.partial(jax.jit, static_argnums=(0,))
def yes_probability(module, params, tokens, mask, yes_id, no_id) -> jax.Array:
  """[B] P(yes) / (P(yes) + P(no)) of the token after each left-padded prompt `tokens` [B, T]."""
  logits = module.apply({"params": params}, tokens, attention_mask=mask)[:, -1].astype(jnp.float32)
  pair = jnp.stack([logits[:, yes_id], logits[:, no_id]], axis=-1)
  return jax.nn.softmax(pair, axis=-1)[:, 0]


def _first_token(tokenizer, word: str, what: str) -> int:
  ids = tokenizer.encode(word)
  if not ids:
    raise ValueError(f"LM judge: the {what} word {word!r} encodes to no token; choose a word the judge's "
                     "tokenizer encodes.")
  return ids[0]


class LMJudge:
  """Scores judge prompts with a model role; `judge(texts) -> [N] float64` judgments in [0, 1]."""

  def __init__(self, model: Any, *, yes: str = "Y", no: str = "N", batch_size: int = 64, max_len: int = 512):
    self.model, self.batch_size, self.max_len = model, int(batch_size), int(max_len)
    tok = model.tokenizer
    self.yes_id, self.no_id = _first_token(tok, yes, "yes"), _first_token(tok, no, "no")
    if self.yes_id == self.no_id:
      raise ValueError(f"LM judge: yes={yes!r} and no={no!r} start with the same token; choose words that "
                       "differ in their first token.")

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    tok = self.model.tokenizer
    ids = [tok.encode(t, add_bos=tok.bos_id is not None) for t in texts]
    too_long = [i for i, row in enumerate(ids) if len(row) > self.max_len]
    if too_long:
      raise ValueError(f"LM judge: prompt {too_long[0]} has {len(ids[too_long[0]])} tokens, over the judge's "
                       f"max_len={self.max_len}; shorten the rubric criterion or raise judge_max_len.")
    out = np.zeros(len(ids), np.float64)
    for start, tokens, mask in left_padded_batches(ids, self.batch_size, tok.pad_id):
      p = yes_probability(self.model.module, self.model.params, jnp.asarray(tokens), jnp.asarray(mask),
                          self.yes_id, self.no_id)
      real = min(self.batch_size, len(ids) - start)
      out[start:start + real] = np.asarray(p[:real], np.float64)
    return out
