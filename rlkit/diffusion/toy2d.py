"""The 2-D generative task whose KL-regularised optimum is known exactly (methods/embodied.md §1.4).

The reference distribution is a Gaussian mixture p(x) = sum_k w_k N(x; m_k, S_k). For a quadratic reward

  r(x) = -1/2 (x - c)^T P (x - c) + b^T x          (P symmetric positive semi-definite)

the KL-regularised objective max_q E_q[r] - beta KL(q || p) is maximised by the tilted density
q*(x) = p(x) exp(r(x) / beta) / Z, and the tilt of a Gaussian by exp(quadratic) is a Gaussian: with
L = S^-1 + P / beta and e = S^-1 m + (P c + b) / beta, component k becomes N(L^-1 e, L^-1) and its weight is
multiplied by

  Z_k = sqrt(det L^-1 / det S) exp(1/2 e^T L^-1 e - 1/2 m^T S^-1 m - c^T P c / (2 beta)),

so q* is again a mixture (`tilted`), with Z = sum_k w_k Z_k. A fine-tuned generator's distance to the optimum
is then measured against exact densities and samples.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Mixture:
  """A Gaussian mixture in the plane: weights [K] (summing to 1), means [K, 2], covariances [K, 2, 2]."""
  weights: np.ndarray
  means: np.ndarray
  covs: np.ndarray

  def log_prob(self, x) -> np.ndarray:
    """log p(x) for x [..., 2]."""
    x = np.asarray(x, np.float64)[..., None, :] - self.means                 # [..., K, 2]
    prec = np.linalg.inv(self.covs)
    quad = np.einsum("...ki,kij,...kj->...k", x, prec, x)
    log_norm = -np.log(2 * np.pi) - 0.5 * np.log(np.linalg.det(self.covs))
    comp = np.log(self.weights) + log_norm - 0.5 * quad
    top = comp.max(-1, keepdims=True)
    return (top + np.log(np.exp(comp - top).sum(-1, keepdims=True)))[..., 0]

  def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
    """[n, 2] samples."""
    k = rng.choice(len(self.weights), size=n, p=self.weights)
    chol = np.linalg.cholesky(self.covs)
    return self.means[k] + np.einsum("nij,nj->ni", chol[k], rng.standard_normal((n, 2)))


@dataclasses.dataclass(frozen=True)
class QuadraticReward:
  """r(x) = -1/2 (x - c)^T P (x - c) + b^T x (module docstring)."""
  center: np.ndarray
  precision: np.ndarray
  linear: np.ndarray

  def __call__(self, x) -> np.ndarray:
    d = np.asarray(x, np.float64) - self.center
    return -0.5 * np.einsum("...i,ij,...j->...", d, self.precision, d) + np.asarray(x, np.float64) @ self.linear


def tilted(p: Mixture, r: QuadraticReward, beta: float) -> tuple[Mixture, float]:
  """(q* = p exp(r / beta) / Z as a mixture, log Z): the exact KL-regularised optimum (module docstring)."""
  if beta <= 0:
    raise ValueError(f"beta={beta} must be > 0: the KL weight of the regularised objective.")
  prec0 = np.linalg.inv(p.covs)                                               # [K, 2, 2]
  lam = prec0 + r.precision / beta
  cov = np.linalg.inv(lam)
  eta = np.einsum("kij,kj->ki", prec0, p.means) + (r.precision @ r.center + r.linear) / beta
  mean = np.einsum("kij,kj->ki", cov, eta)
  log_zk = (0.5 * (np.log(np.linalg.det(cov)) - np.log(np.linalg.det(p.covs)))
            + 0.5 * np.einsum("ki,ki->k", eta, mean)
            - 0.5 * np.einsum("ki,kij,kj->k", p.means, prec0, p.means)
            - 0.5 * r.center @ r.precision @ r.center / beta)
  log_w = np.log(p.weights) + log_zk
  log_z = float(np.log(np.exp(log_w - log_w.max()).sum()) + log_w.max())
  return Mixture(np.exp(log_w - log_z), mean, cov), log_z


def ring(k: int = 8, radius: float = 2.0, std: float = 0.25) -> Mixture:
  """k equal components on a circle: the reference distribution of the 2-D task."""
  angles = 2 * np.pi * np.arange(k) / k
  means = radius * np.stack([np.cos(angles), np.sin(angles)], -1)
  return Mixture(np.full(k, 1.0 / k), means, np.tile(std ** 2 * np.eye(2), (k, 1, 1)))


@dataclasses.dataclass(frozen=True)
class PromptTask:
  """The conditional 2-D task (methods/embodied.md §1.4): prompt c has its own mixture of `modes` Gaussians, one of
  them rare (weight `rare_weight`), and the reward r(x, c) = -||x - g_c||^2 points at that rare mode's mean g_c
  (plus, optionally, a hackable term gamma x[0] off the data), so the KL-regularised optimum of each prompt is
  `tilted(mixtures[c], reward_of(c), beta)` exactly (the hackable term is linear: still a quadratic reward)."""
  mixtures: tuple
  goals: np.ndarray              # [P, 2]
  gamma: float = 0.0

  def reward_of(self, c: int, hackable: bool = True) -> QuadraticReward:
    return QuadraticReward(center=self.goals[c], precision=2.0 * np.eye(2),
                           linear=np.array([self.gamma if hackable else 0.0, 0.0]))

  def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids [n], points [n, 2]): the pretraining data, prompts uniform."""
    c = rng.integers(0, len(self.mixtures), n)
    x = np.empty((n, 2))
    for k in range(len(self.mixtures)):
      idx = np.flatnonzero(c == k)
      x[idx] = self.mixtures[k].sample(rng, len(idx))
    return c, x


def prompt_task(seed: int = 0, prompts: int = 8, modes: int = 3, radius: float = 2.0, std: float = 0.3,
                rare_weight: float = 0.1, gamma: float = 0.0) -> PromptTask:
  """`prompts` mixtures with modes at random angles on a circle of `radius`, the first mode of each rare."""
  rng = np.random.default_rng(seed)
  mixtures, goals = [], []
  for _ in range(prompts):
    angles = rng.uniform(0, 2 * np.pi, modes)
    means = radius * np.stack([np.cos(angles), np.sin(angles)], -1)
    weights = np.full(modes, (1 - rare_weight) / (modes - 1))
    weights[0] = rare_weight
    mixtures.append(Mixture(weights, means, np.tile(std ** 2 * np.eye(2), (modes, 1, 1))))
    goals.append(means[0])
  return PromptTask(tuple(mixtures), np.stack(goals), gamma)
