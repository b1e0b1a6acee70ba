"""Text in, text out: a model of the run (a role of config.models) answering a list of prompts, for the host-side
parts of rewards that consult a frozen model (CALIF's reference lengths, a solver's answers to proposed
questions) instead of the trained policy.

Prompts are tokenized as the data pipeline does (BOS where the tokenizer has one), left-padded to a length
bucket (a power of two) and sampled in fixed-size batches, so repeated calls reuse one compiled sampler per
bucket. Sampling is deterministic given the key: batch b uses fold_in(key, b).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from rlkit.data.pipeline import prompt_batch
from rlkit.models.tokenizer import bucket_length, decode_responses
from rlkit.rollout.sampler import SamplingConfig, generate


def sample_texts(model: Any, prompts: Sequence[str], key: jax.Array, *, max_new_tokens: int,
                 temperature: float = 1.0, greedy: bool = False, batch_size: int = 64) -> list[str]:
  """One completion (decoded, stop token removed) of `model` (a `rlkit.train.models.Model`) per prompt."""
  tok = model.tokenizer
  cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy,
                       stop_ids=tok.stop_ids, pad_id=tok.pad_id)
  records = [{"prompt": p, "answer": ""} for p in prompts]
  texts: list[str] = []
  for b, start in enumerate(range(0, len(records), batch_size)):
    chunk = records[start:start + batch_size]
    real = len(chunk)
    chunk = chunk + [chunk[-1]] * (batch_size - real)             # a fixed batch: one compile per bucket
    longest = max(len(tok.encode(r["prompt"])) for r in chunk) + 1
    batch = prompt_batch(chunk, tok, bucket_length(longest))
    out = generate(model.module, model.params, batch["prompt_tokens"], batch["prompt_mask"],
                   jax.random.fold_in(key, b), cfg)
    lengths = np.asarray(out.lengths)
    texts += decode_responses(tok, np.asarray(out.response), lengths)[:real]
  return texts
