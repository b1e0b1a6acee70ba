"""How far a generator's samples are from a target's samples: the squared maximum mean discrepancy (MMD) under a
sum of Gaussian kernels (Gretton et al. 2012), the distance the generative stages report to a known optimum
(toy2d's exact KL-regularised optimum) and to the data.

  MMD^2(x, y) = mean k(x, x') + mean k(y, y') - 2 mean k(x, y),   k(a, b) = sum_h exp(-||a - b||^2 / (2 h^2))

the biased (V-statistic) estimate, never negative and 0 only for equal samples; bandwidths h of a few scales
so that both a missing mode and a misplaced one register. In float64 on the host: it is a measurement, never
differentiated.
"""
from __future__ import annotations

import numpy as np

BANDWIDTHS = (0.1, 0.3, 1.0)


def _kernel_mean(a: np.ndarray, b: np.ndarray, bandwidths) -> float:
  d2 = np.sum(a * a, 1)[:, None] + np.sum(b * b, 1)[None, :] - 2.0 * a @ b.T
  d2 = np.maximum(d2, 0.0)
  return float(sum(np.exp(-d2 / (2.0 * h * h)).mean() for h in bandwidths))


def mmd2(x, y, bandwidths=BANDWIDTHS) -> float:
  """Squared MMD between samples x [n, D] and y [m, D] (module docstring)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return _kernel_mean(x, x, bandwidths) + _kernel_mean(y, y, bandwidths) - 2.0 * _kernel_mean(x, y, bandwidths)


def mean_mmd2(samples, targets, bandwidths=BANDWIDTHS) -> float:
  """The mean over conditions of mmd2(samples[c], targets[c]), for [C, n, D] and [C, m, D]."""
  return float(np.mean([mmd2(s, t, bandwidths) for s, t in zip(samples, targets)]))
