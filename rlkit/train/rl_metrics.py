"""The RL stage's host-side metrics, global over processes: what the policy's rows achieved, the sampler/
trainer mismatch, and the reward's failures.

Each process computes sums over its own rows; `process_sum` / `process_max` combine them, so every process
(and the metrics.jsonl process 0 writes) holds the values a one-process run over the same global batch logs.
"""
from __future__ import annotations

import json

import jax
import numpy as np

from rlkit.core.types import ROW_SOURCE
from rlkit.parallel.hosts import host_rows, process_max, process_sum


def _means(sums: dict, counts: dict) -> dict[str, float]:
  """{name: global sum / global count}; 0 where the global count is 0."""
  names = list(sums)
  totals = process_sum([sums[k] for k in names] + [counts[k] for k in names])
  s, c = totals[:len(names)], totals[len(names):]
  return {k: float(s[i] / c[i]) if c[i] else 0.0 for i, k in enumerate(names)}


def policy_metrics(rewards, lengths: np.ndarray, group_size: int) -> dict[str, float]:
  """Reward, accuracy (the reward's `correct`), lengths and informative groups of the policy's rows."""
  r, n = rewards.rewards, len(rewards.rewards)
  informative = r.reshape(-1, group_size).std(axis=1) > 0
  sums = {"reward": r.sum(), "response_len": lengths.sum(), "informative_groups": informative.sum(),
          **{f"reward/{k}": v.sum() for k, v in rewards.components.items()}}
  counts = dict.fromkeys(sums, n)
  counts["informative_groups"] = len(informative)
  if rewards.correct is not None:
    correct = np.asarray(rewards.correct, bool)
    sums.update(accuracy=correct.sum(), response_len_correct=lengths[correct].sum(),
                response_len_wrong=lengths[~correct].sum())
    counts.update(accuracy=n, response_len_correct=correct.sum(), response_len_wrong=(~correct).sum())
  return _means(sums, counts)


def accuracy(rewards) -> dict[str, float]:
  """{"sampled_accuracy": ...} of a reward output with `correct` (before any filtering), else {}."""
  if rewards.correct is None:
    return {}
  return {"sampled_accuracy": _means({"a": np.sum(rewards.correct)}, {"a": len(rewards.correct)})["a"]}


def mismatch(batch) -> dict[str, float]:
  """|trainer old_logp - sampler logp| over policy rows' response tokens (mean and max)."""
  policy = host_rows(batch.row_source) == ROW_SOURCE["policy"]
  mask = host_rows(batch.loss_mask) & policy[:, None]
  delta = np.abs(host_rows(batch.old_logp) - host_rows(batch.rollout_logp))[mask]
  out = _means({"mismatch/mean": delta.sum()}, {"mismatch/mean": delta.size})
  out["mismatch/max"] = float(process_max([delta.max() if delta.size else 0.0])[0])
  return out


MAX_FAILURE_JSON = 4096   # bytes of one process's failure counts, gathered as a fixed-size array


def failures(counts: dict[str, int]) -> dict[str, int]:
  """`reward_failures` (total) and `reward_failures/<kind>`, summed over processes."""
  merged = dict(counts)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    raw = json.dumps(counts).encode()[:MAX_FAILURE_JSON]
    buf = np.zeros(MAX_FAILURE_JSON, np.uint8)
    buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    merged = {}
    for row in np.asarray(multihost_utils.process_allgather(buf)):
      for kind, n in json.loads(bytes(row).rstrip(b"\0").decode() or "{}").items():
        merged[kind] = merged.get(kind, 0) + n
  return {"reward_failures": int(sum(merged.values())), **{f"reward_failures/{k}": v for k, v in merged.items()}}
