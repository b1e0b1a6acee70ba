"""GRAFT's maths (rlkit/objectives/graft.py): which rows are grafted, and their weights."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.objectives.graft import graft_weights, rescue


def test_rescue_never_grafts_into_a_group_with_a_success():
  own = np.array([0, 0, 0,   1, 0, 0,   0, 0, 0,   0, 0, 0], bool)     # groups of 3: g1 has a success
  peer = np.array([1, 0, 1,  1, 1, 1,   0, 0, 0,   0, 1, 1], bool)     # g2: the peer fails too
  got = rescue(own, peer, 3, 2)
  np.testing.assert_array_equal(got, [[0, 2], [-1, -1], [-1, -1], [10, 11]])
  np.testing.assert_array_equal(rescue(own, peer, 3, 1), [[0], [-1], [-1], [10]])


def test_graft_weights_truncate_and_reject_by_the_geometric_mean():
  logp_self = jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.9], [0.1, 0.1], [0.5, 0.5]]))
  logp_peer = jnp.log(jnp.array([[0.5, 0.1], [0.3, 0.3], [0.5, 0.5], [0.5, 0.5]]))
  mask = jnp.array([[True, True], [True, True], [True, True], [False, False]])
  w, keep = graft_weights(logp_self, logp_peer, mask, cap=2.0, geo_low=0.5, geo_high=2.0)
  # Row 0: ratios 1, 5 -> geo sqrt(5) = 2.24 > 2: rejected. Row 1: ratios 3, 3 -> geo 3: rejected.
  # Row 2: ratios 0.2, 0.2 -> geo 0.2 < 0.5: rejected. Row 3: no tokens.
  np.testing.assert_array_equal(keep, [False, False, False, False])
  w, keep = graft_weights(logp_self, logp_peer, mask, cap=2.0, geo_low=0.1, geo_high=4.0)
  np.testing.assert_array_equal(keep, [True, True, True, False])
  np.testing.assert_allclose(w, [[1.0, 2.0], [2.0, 2.0], [0.2, 0.2], [0.0, 0.0]], rtol=1e-5)
  w, keep = graft_weights(logp_self, logp_peer, mask, cap=0.0, geo_high=0.0)        # naive exchange
  np.testing.assert_array_equal(keep, [True, True, True, False])
  np.testing.assert_array_equal(w, [[1, 1], [1, 1], [1, 1], [0, 0]])
  g = jax.grad(lambda a: graft_weights(a, logp_peer, mask, 2.0, 0.1, 4.0)[0].sum())(logp_self)
  assert (np.asarray(g) == 0).all()


def test_long_rows_stay_finite():
  t = 4096
  logp_self = jnp.full((1, t), -1.0)
  logp_peer = jnp.full((1, t), -1.01)
  w, keep = graft_weights(logp_self, logp_peer, jnp.ones((1, t), bool), cap=2.0, geo_low=0.5, geo_high=2.0)
  assert bool(keep[0]) and np.isfinite(np.asarray(w)).all()
  np.testing.assert_allclose(w[0, 0], np.exp(0.01), rtol=1e-5)
