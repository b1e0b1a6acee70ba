"""Held-out evaluation: greedy accuracy and pass@k on a fixed slice of the test split.

Greedy accuracy is the share of prompts whose argmax completion the verifier accepts. pass@k samples k
completions per prompt at temperature 1 and counts a prompt solved if any of them is accepted (the direct
estimator with n = k). The evaluated prompts are always the first `eval.num_examples` records of the test
split, so numbers are comparable across steps, stages and runs.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from rlkit.data.pipeline import as_text_record, prompt_batch
from rlkit.rollout.sampler import SamplingConfig, generate


def decode_responses(tokenizer, rollout) -> list[str]:
  """Host-side text of each row's response (stop token and padding removed)."""
  response = np.asarray(rollout.response)
  lengths = np.asarray(rollout.lengths)
  return [tokenizer.decode(response[i, :lengths[i]].tolist(), skip_special=True) for i in range(len(lengths))]


def _chunks(records: Sequence[dict], size: int):
  """Fixed-size chunks (the last one padded with repeats, so the sampler compiles once)."""
  for start in range(0, len(records), size):
    chunk = list(records[start:start + size])
    real = len(chunk)
    chunk += [chunk[-1]] * (size - real)
    yield chunk, real


def evaluate(model: Any, params: Any, tokenizer: Any, task: Any, records: Sequence[dict], key: jax.Array, *,
             batch_size: int, max_prompt_len: int, max_new_tokens: int, pass_k: int) -> dict[str, float]:
  records = [as_text_record(r) for r in records]
  if not records:
    return {}
  batch_size = min(batch_size, len(records))
  greedy = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True, stop_ids=tokenizer.stop_ids,
                          pad_id=tokenizer.pad_id)
  sample = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, stop_ids=tokenizer.stop_ids,
                          pad_id=tokenizer.pad_id)
  correct, solved, lengths = [], [], []
  for i, (chunk, real) in enumerate(_chunks(records, batch_size)):
    batch = prompt_batch(chunk, tokenizer, max_prompt_len)
    out = generate(model, params, batch["prompt_tokens"], batch["prompt_mask"], key, greedy)
    texts = decode_responses(tokenizer, out)
    correct += [task.verify(t, r["answer"]) for t, r in zip(texts[:real], chunk[:real])]
    lengths += np.asarray(out.lengths)[:real].tolist()
    if pass_k:
      rep = np.repeat(np.arange(len(chunk)), pass_k)
      out = generate(model, params, batch["prompt_tokens"][rep], batch["prompt_mask"][rep],
                     jax.random.fold_in(key, i + 1), sample)
      ok = np.array([task.verify(t, chunk[j]["answer"]) for t, j in zip(decode_responses(tokenizer, out), rep)])
      solved += ok.reshape(len(chunk), pass_k).max(axis=1)[:real].tolist()
  metrics = {"eval/accuracy": float(np.mean(correct)), "eval/response_len": float(np.mean(lengths)),
             "eval/num_examples": len(correct)}
  if pass_k:
    metrics[f"eval/pass@{pass_k}"] = float(np.mean(solved))
  return metrics
