"""Top-p without a sort: `nucleus_threshold`'s bisection keeps exactly the tokens a sort-based nucleus keeps.

Two references, both in this file: a float64 NumPy nucleus over the distinct values (ties grouped), and the
sort-based code `processed_logits` used before (float32 cumsum over the descending sort). The keep masks must
be equal on every row whose answer does not hinge on rounding. Where the boundary prefix mass lies within
~1e-7 of top_p no float32 computation can call it (float32(0.95) is 0.95 - 1.2e-8, one ulp of a mass near 1
is 6e-8): both float32 methods were seen to differ from float64 by a token at margins of 3e-8 to 8e-8, each
on rows where the other was right. So rows with a margin below `TOL_F64` must give the float64 mask or the one
with the boundary moved by a single tie group, and rows below `TOL_SORT` are not compared with the sort.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.rollout.sampler import SamplingConfig, nucleus_reference, nucleus_threshold, processed_logits

TOL_F64, TOL_SORT = 3e-7, 1e-6


def reference_keep(row: np.ndarray, top_p: float) -> tuple[np.ndarray, float, list]:
  """float64 nucleus of one row: (keep mask, margin, near misses): the margin is how far the prefix masses
  either side of the boundary are from top_p; the near misses are the masks with the boundary one tie group
  lower or higher, what rounding can give when the margin is tiny.

  Distinct values in descending order; a tie group is kept iff the mass of the strictly greater values is
  below top_p (every member of the group has that mass before it in some order, the first one exactly it).
  """
  x = np.asarray(row, np.float64)
  finite = np.isfinite(x)
  p = np.where(finite, np.exp(x - x[finite].max()), 0.0)
  p /= p.sum()
  values, inverse = np.unique(np.where(finite, -x, np.inf), return_inverse=True)   # ascending -x
  group_mass = np.bincount(inverse.ravel(), weights=p.ravel(), minlength=len(values))
  before = np.cumsum(group_mass) - group_mass
  kept_group = before < top_p
  kept_group[np.isinf(values)] = False
  n = int(kept_group.sum())                       # groups 0..n-1 kept, group n (if any) the first dropped
  margin = min(top_p - before[n - 1], before[n] - top_p if n < len(values) else np.inf)
  group_mask = lambda k: (np.arange(len(values)) < k)[inverse.ravel()].reshape(x.shape) & finite  # noqa: E731
  return group_mask(n), float(margin), [group_mask(n - 1), group_mask(n + 1)]


def _logits(kind: str, shape, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  v = shape[-1]
  if kind == "normal":
    return rng.normal(size=shape) * rng.choice([0.05, 0.5, 2.0, 8.0])
  if kind == "flat":                   # all equal: every token ties, all are kept
    return np.full(shape, rng.normal())
  if kind == "ties":                   # few distinct values, many tokens each
    return np.round(rng.normal(size=shape) * 2) / 2
  if kind == "peaked":                 # one token (or two tied) carries almost all the mass
    x = rng.normal(size=shape)
    idx = rng.integers(0, v, shape[:-1])
    np.put_along_axis(x, idx[..., None], 40.0, axis=-1)
    np.put_along_axis(x, ((idx + 1) % v)[..., None], rng.choice([0.0, 40.0]), axis=-1)
    return x
  if kind == "neg_inf":                # masked tokens (top-k, vocabulary padding)
    x = rng.normal(size=shape) * 3
    x[rng.random(shape) < 0.5] = -np.inf
    np.put_along_axis(x, rng.integers(0, v, shape[:-1])[..., None], 1.0, axis=-1)   # >= 1 finite per row
    return x
  if kind == "bf16":                   # bfloat16 logits: 8 mantissa bits, so many exact ties
    return np.asarray(jnp.asarray(rng.normal(size=shape) * 3, jnp.bfloat16).astype(jnp.float32))
  if kind == "wide":                   # logits far from 0 and across binades
    return rng.normal(size=shape) * 1e3 + rng.choice([-1e4, 0.0, 1e4])
  raise ValueError(kind)


KINDS = ["normal", "flat", "ties", "peaked", "neg_inf", "bf16", "wide"]
SHAPES = [(1, 2), (6, 48), (3, 4, 1000), (2, 151936)]


# top_p traced: one compile per shape, not per (shape, top_p).
_new_keep = jax.jit(lambda x, p: (x >= nucleus_threshold(x, p)) & jnp.isfinite(x))
_old_keep = jax.jit(lambda x, p: jnp.isfinite(nucleus_reference(x, p)))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", KINDS)
def test_keep_mask_equals_sort_based_references(kind, shape):
  close = rows = 0
  for seed, top_p in enumerate([0.05, 0.5, 0.9, 0.95, 0.999]):
    x = jnp.asarray(_logits(kind, shape, seed), jnp.float32)
    new, old = np.asarray(_new_keep(x, top_p)), np.asarray(_old_keep(x, top_p))
    flat_x, flat_new, flat_old = (a.reshape(-1, shape[-1]) for a in (np.asarray(x), new, old))
    for r in range(flat_x.shape[0]):
      rows += 1
      ref, margin, near = reference_keep(flat_x[r], top_p)
      assert flat_new[r].any()
      if margin < TOL_F64:      # too close to call in float32: the boundary may move by one tie group
        close += 1
        assert any((flat_new[r] == m).all() for m in [ref] + near), f"{kind} p={top_p} row {r}"
        continue
      np.testing.assert_array_equal(flat_new[r], ref, err_msg=f"{kind} p={top_p} row {r} vs float64")
      if margin >= TOL_SORT:
        np.testing.assert_array_equal(flat_new[r], flat_old[r], err_msg=f"{kind} p={top_p} row {r} vs sort")
  assert close <= max(2, rows // 4), f"{close} of {rows} rows too close to call: the check lost its teeth"


def test_exact_tie_at_the_boundary_keeps_the_whole_group():
  # 4 tokens of 0.25 each: top_p 0.5 reaches its mass after 2 of them, and ties keep all 4 of the group.
  x = jnp.zeros((1, 4))
  assert np.asarray(x >= nucleus_threshold(x, 0.5)).all()
  # mass before the tie group [1, 1] is p(2) ~ 0.56 >= 0.5: only the top token.
  x = jnp.asarray([[2.0, 1.0, 1.0, -1.0]])
  np.testing.assert_array_equal(np.asarray(x >= nucleus_threshold(x, 0.5)), [[True, False, False, False]])
  np.testing.assert_array_equal(np.asarray(x >= nucleus_threshold(x, 0.7)), [[True, True, True, False]])


def test_one_token_with_all_the_mass_and_all_masked_rows():
  x = jnp.asarray([[-jnp.inf, 3.0, -jnp.inf, -jnp.inf], [100.0, 0.0, 0.0, 0.0], [-jnp.inf] * 4])
  out = processed_logits(x, SamplingConfig(max_new_tokens=1, top_p=0.99))
  np.testing.assert_array_equal(np.isfinite(out), [[False, True, False, False], [True, False, False, False],
                                                   [False] * 4])
  assert not np.isnan(np.asarray(out)).any()


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.95), (1.3, 0, 0.5), (0.7, 20, 0.9),
                                                     (1.0, 5, 0.999), (0.5, 1, 0.3), (1.0, 0, 1.0)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_processed_logits_matches_sort_based_pipeline(temperature, top_k, top_p, dtype):
  """Temperature first, then top-k (ties with the k-th kept), then top-p over what top-k left."""
  logits = jnp.asarray(_logits("normal", (4, 3, 500), 11) * 3, dtype)
  cfg = SamplingConfig(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
  got = processed_logits(logits, cfg)
  x = logits.astype(jnp.float32) / temperature
  if top_k:
    x = jnp.where(x < jax.lax.top_k(x, top_k)[0][..., -1:], -jnp.inf, x)
  want = nucleus_reference(x, top_p) if top_p < 1 else x
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
  np.testing.assert_array_equal(np.where(np.isfinite(got), got, 0), np.where(np.isfinite(want), want, 0))
  if top_p == 1.0 and not top_k:
    assert np.isfinite(got).all()


def test_gradient_flows_through_kept_logits_only():
  """The scorer differentiates processed log-probs: same gradient as through the sort-based nucleus."""
  logits = jnp.asarray(_logits("normal", (3, 2, 200), 5) * 2, jnp.float32)
  tokens = jnp.argmax(logits, -1)
  cfg = SamplingConfig(max_new_tokens=1, temperature=0.7, top_p=0.8)

  def loss(f):
    def g(lg):
      lp = jax.nn.log_softmax(f(lg), axis=-1)
      return jnp.sum(jnp.take_along_axis(lp, tokens[..., None], -1))
    return jax.jit(jax.grad(g))(logits)

  got = loss(lambda lg: processed_logits(lg, cfg))
  want = loss(lambda lg: nucleus_reference(lg / 0.7, 0.8))
  np.testing.assert_allclose(got, want, atol=1e-6)
  removed = ~np.isfinite(np.asarray(processed_logits(logits, cfg)))
  assert removed.any() and (np.asarray(got)[removed] == 0).all()
