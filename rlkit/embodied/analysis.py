"""Where an update lands in a policy's parameters (methods/embodied.md §2; the tool is our design): per-module shares
of the update, the rank of each kernel's change, shift vectors and the graft test. Pure functions of parameter
pytrees; `groups` maps a module group's name to a regex over '/'-joined parameter paths (first match wins, the
rest is "other"), e.g. {"timestep": rlkit.models.flow.TIMESTEP_MODULES}.

For a group g with change d = p1 - p0 over its leaves:
  share S_g = sum ||d||^2 / total,  param share P_g = #params(g) / #params,  concentration C_g = S_g / P_g (> 1:
  over-represented), relative change ||d|| / ||p0|| (None where ||p0|| = 0: adaLN-Zero's zero-initialised
  modulation), sparsity = share of |d| < tol. `update_shares` computes them on a delta, `gradient_shares` on
  accumulated squared gradients (Adam rescales each coordinate, so a delta alone can mislead: the spec's pitfall).
For a 2-D kernel change (`spectrum`), with singular values s:
  erank = exp(entropy of s / sum s), stable rank = ||d||_F^2 / s_1^2, k90 = the fewest values holding 90% of
  sum s^2; each also divided by min(shape), and erank against a Gaussian matrix of the same shape (`gaussian_erank`),
  since a small kernel has a trivially low maximum rank.
Shift vectors: `shift_vector` (the group's delta, flattened: weight space) and `function_shift` (the change of a
module's outputs on fixed probes: function space); `cosine_matrix` compares tasks' vectors, `spearman` relates the
similarities to measured transfer. `graft` applies alpha x the delta of chosen groups only (or of all the others);
`random_direction` is its control (random directions of the same per-leaf sizes); `adam_second_moments` finds the
averaged squared gradients that `gradient_shares` reads in an Adam run's saved optimizer state.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.parallel.rules import path_str


def group_of(path: str, groups: dict) -> str:
  for name, pattern in groups.items():
    if re.search(pattern, path):
      return name
  return "other"


def _leaves(tree) -> dict:
  return {path_str(p): np.asarray(x, np.float64) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _shares(sq: dict, p0: dict, groups: dict, tol: float, deltas: Optional[dict]) -> dict:
  total = sum(v.sum() for v in sq.values()) or 1.0
  n_all = sum(v.size for v in p0.values())
  out = {}
  for name in [*groups, "other"]:
    paths = [p for p in p0 if group_of(p, groups) == name]
    if not paths:
      continue
    s = sum(sq[p].sum() for p in paths) / total
    n = sum(p0[p].size for p in paths)
    base = float(np.sqrt(sum((p0[p] ** 2).sum() for p in paths)))
    row = {"share": float(s), "param_share": n / n_all, "concentration": float(s) / (n / n_all), "params": n}
    if deltas is not None:
      norm = float(np.sqrt(sum(sq[p].sum() for p in paths)))
      row["relative_change"] = norm / base if base > 0 else None
      row["sparsity"] = float(sum((np.abs(deltas[p]) < tol).sum() for p in paths) / n)
    out[name] = row
  return out


def update_shares(p0: Any, p1: Any, groups: dict, tol: float = 1e-8) -> dict:
  """{group: {share, param_share, concentration, params, relative_change, sparsity}} of the delta p1 - p0."""
  a, b = _leaves(p0), _leaves(p1)
  deltas = {p: b[p] - a[p] for p in a}
  return _shares({p: d ** 2 for p, d in deltas.items()}, a, groups, tol, deltas)


def gradient_shares(params: Any, squared_grads: Any, groups: dict) -> dict:
  """{group: {share, param_share, concentration, params}} of accumulated squared gradients (same tree as params)."""
  return _shares(_leaves(squared_grads), _leaves(params), groups, 0.0, None)


def spectrum(d) -> dict:
  """{erank, stable_rank, k90, *_norm (divided by min(shape)), max_rank} of a 2-D change (module docstring)."""
  s = np.linalg.svd(np.asarray(d, np.float64), compute_uv=False)
  rank = min(np.shape(d))
  if s.size == 0 or s[0] == 0:
    return {"erank": 0.0, "stable_rank": 0.0, "k90": 0, "erank_norm": 0.0, "stable_rank_norm": 0.0,
            "k90_norm": 0.0, "max_rank": rank}
  p = s / s.sum()
  p = p[p > 0]
  erank = float(np.exp(-(p * np.log(p)).sum()))
  energy = np.cumsum(s ** 2) / (s ** 2).sum()
  k90 = int(np.searchsorted(energy, 0.9) + 1)
  stable = float((s ** 2).sum() / s[0] ** 2)
  return {"erank": erank, "stable_rank": stable, "k90": k90, "erank_norm": erank / rank,
          "stable_rank_norm": stable / rank, "k90_norm": k90 / rank, "max_rank": rank}


def gaussian_erank(shape: tuple, seed: int = 0) -> float:
  """The effective rank of a Gaussian matrix of `shape` (the reference a kernel change is read against)."""
  return spectrum(np.random.default_rng(seed).standard_normal(shape))["erank"]


def kernel_spectra(p0: Any, p1: Any, groups: dict, min_dim: int = 2) -> dict:
  """{path: spectrum of its change, with its group and the Gaussian reference erank} for every 2-D leaf whose
  smaller side is at least `min_dim` (stacked kernels [L, a, b] are split per index: 'path[i]')."""
  a, b = _leaves(p0), _leaves(p1)
  out = {}
  for path in a:
    d = b[path] - a[path]
    mats = [(path, d)] if d.ndim == 2 else [(f"{path}[{i}]", x) for i, x in enumerate(d)] if d.ndim == 3 else []
    for name, m in mats:
      if min(m.shape) >= min_dim:
        out[name] = {**spectrum(m), "group": group_of(path, groups), "gaussian_erank": gaussian_erank(m.shape)}
  return out


def shift_vector(p0: Any, p1: Any, groups: dict, which: str) -> np.ndarray:
  """The weight-space shift: the delta of group `which`'s leaves, flattened in path order."""
  a, b = _leaves(p0), _leaves(p1)
  parts = [(b[p] - a[p]).ravel() for p in sorted(a) if group_of(p, groups) == which]
  return np.concatenate(parts) if parts else np.zeros(0)


def function_shift(outputs: Callable[[Any], Any], p0: Any, p1: Any) -> np.ndarray:
  """The function-space shift: `outputs(params)` (a module's outputs on fixed probes, any pytree) under p1 minus
  under p0, flattened."""
  return np.concatenate([np.ravel(np.asarray(y, np.float64) - np.asarray(x, np.float64))
                         for x, y in zip(jax.tree.leaves(outputs(p0)), jax.tree.leaves(outputs(p1)))])


def graft(p0: Any, p1: Any, groups: dict, which: tuple, alpha: float = 1.0, complement: bool = False) -> Any:
  """p0 + alpha (p1 - p0) on the leaves of the groups `which` (or, `complement`, on every other leaf)."""
  def one(path, a, b):
    hit = group_of(path_str(path), groups) in which
    return a + alpha * (b - a) if hit != complement else a
  return jax.tree_util.tree_map_with_path(one, p0, p1)


def random_direction(p0: Any, p1: Any, groups: dict, which: tuple, seed: int) -> Any:
  """The random-direction control of `graft`: p0 plus, on the leaves of the groups `which`, a Gaussian direction
  scaled to the norm of that leaf's delta p1 - p0 (the same step sizes, no learned direction)."""
  rng = np.random.default_rng(seed)

  def one(path, a, b):
    if group_of(path_str(path), groups) not in which:
      return a
    r = rng.standard_normal(np.shape(a))
    norm = np.linalg.norm(r)
    scale = np.linalg.norm(np.asarray(b) - np.asarray(a)) / norm if norm > 0 else 0.0
    return a + scale * r.astype(np.asarray(a).dtype)
  return jax.tree_util.tree_map_with_path(one, p0, p1)


def adam_second_moments(opt_state: Any) -> Any:
  """The first `nu` subtree (optax's Adam / AdamW second-moment estimate, an average of squared gradients with the
  params' tree) found in an optimizer state as a checkpoint restores it (nested dicts and lists); None if none."""
  if isinstance(opt_state, dict):
    if "nu" in opt_state:
      return opt_state["nu"]
    children = opt_state.values()
  elif isinstance(opt_state, (list, tuple)):
    children = opt_state
  else:
    return None
  for child in children:
    found = adam_second_moments(child)
    if found is not None:
      return found
  return None


def cosine_matrix(vectors: list) -> np.ndarray:
  v = np.stack([np.asarray(x, np.float64) for x in vectors])
  norms = np.linalg.norm(v, axis=1, keepdims=True)
  v = v / np.where(norms > 0, norms, 1.0)
  return v @ v.T


def spearman(x, y) -> float:
  """Spearman's rank correlation (average ranks for ties)."""
  def ranks(a):
    a = np.asarray(a, np.float64)
    order = a.argsort()
    r = np.empty_like(a)
    r[order] = np.arange(a.size, dtype=np.float64)
    for value in np.unique(a):                       # ties share their mean rank
      r[a == value] = r[a == value].mean()
    return r
  rx, ry = ranks(x), ranks(y)
  rx, ry = rx - rx.mean(), ry - ry.mean()
  denom = np.sqrt((rx ** 2).sum() * (ry ** 2).sum())
  return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def timestep_outputs(cfg, params, grid) -> dict:
  """The flow expert's timestep-module outputs (the time MLP and every modulation) on flow times `grid` [G]: the
  probes of `function_shift` (they depend on the time alone)."""
  from rlkit.models.flow import FlowExpert
  g = jnp.asarray(grid, jnp.float32)
  _, state = FlowExpert(cfg).apply(
      {"params": params}, jnp.zeros((g.shape[0], cfg.horizon, cfg.action_dim)), g,
      jnp.zeros((g.shape[0], params["obs_in"]["kernel"].shape[0])),
      capture_intermediates=lambda m, _: bool(m.name) and (m.name.startswith("modulation")
                                                           or m.name.startswith("time_mlp")),
      mutable=["intermediates"])
  return {name: v["__call__"][0] for name, v in state["intermediates"].items()}
