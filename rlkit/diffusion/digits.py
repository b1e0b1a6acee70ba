"""scikit-learn's 8x8 handwritten digits (`sklearn.datasets.load_digits`: 1797 images shipped inside the package, no
download) as the generative stages read them, and the small classifier whose confidence is a reward for them.

  digit_arrays()   x [1797, 64] float32 with pixels 0..16 scaled to [-1, 1], labels [1797] int32 (0..9)
  split()          a fixed 80/20 train/held-out split (numpy seed 0)
  classifier()     (params, held-out accuracy) of an MLP 64 -> 64 (swish) -> 10 trained on the train split by 400
                   Adam steps on batches of 256 from jax.random.key(0): the same weights in every process, trained
                   once per process and cached (about a second on a CPU core). Its inputs are Gaussian-jittered
                   (std 0.1) during training, so that generated digits, which are never exactly clean, are
                   classified by a smoother function.
  classifier_logits(params, x [N, 64]) -> [N, 10]
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array
PIXELS, CLASSES = 64, 10
HIDDEN, TRAIN_STEPS, BATCH, JITTER, WEIGHT_DECAY = 64, 400, 256, 0.1, 1e-4


@functools.lru_cache(maxsize=1)
def digit_arrays() -> tuple[np.ndarray, np.ndarray]:
  """(images [1797, 64] in [-1, 1] float32, labels [1797] int32)."""
  from sklearn.datasets import load_digits   # imported here: only the digits runs need scikit-learn
  d = load_digits()
  return (d.data / 8.0 - 1.0).astype(np.float32), d.target.astype(np.int32)


def split(holdout: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(train indices, held-out indices) of a fixed permutation."""
  n = len(digit_arrays()[1])
  perm = np.random.default_rng(seed).permutation(n)
  cut = int(round(n * (1 - holdout)))
  return perm[:cut], perm[cut:]


def classifier_logits(params, x: Array) -> Array:
  h = jax.nn.swish(x @ params["w1"] + params["b1"])
  return h @ params["w2"] + params["b2"]


@functools.lru_cache(maxsize=1)
def classifier() -> tuple[dict, float]:
  """(the classifier's params, its accuracy on the held-out split) (module docstring)."""
  x, y = digit_arrays()
  train, held = split()
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  params = {"w1": jax.random.normal(k1, (PIXELS, HIDDEN)) / np.sqrt(PIXELS), "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) / np.sqrt(HIDDEN), "b2": jnp.zeros(CLASSES)}
  tx = optax.adamw(1e-2, weight_decay=WEIGHT_DECAY)
  xt, yt = jnp.asarray(x[train]), jnp.asarray(y[train])

  def loss(p, key):
    k_idx, k_jitter = jax.random.split(key)
    idx = jax.random.randint(k_idx, (BATCH,), 0, xt.shape[0])
    noisy = xt[idx] + JITTER * jax.random.normal(k_jitter, (BATCH, PIXELS))
    return optax.softmax_cross_entropy_with_integer_labels(classifier_logits(p, noisy), yt[idx]).mean()

  @jax.jit
  def fit(params):
    def step(carry, key):
      p, opt = carry
      g = jax.grad(loss)(p, key)
      updates, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, updates), opt), None
    return jax.lax.scan(step, (params, tx.init(params)), jax.random.split(k3, TRAIN_STEPS))[0][0]

  params = jax.device_get(fit(params))
  accuracy = float(np.mean(np.argmax(np.asarray(classifier_logits(params, x[held])), -1) == y[held]))
  return params, accuracy
