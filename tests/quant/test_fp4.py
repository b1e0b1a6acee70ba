"""rlkit/quant/fp4.py: E2M1 bit for bit as ml_dtypes; MXFP4 / NVFP4 block scales by hand and against qwix."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from rlkit.quant import fp4

F4 = ml_dtypes.float4_e2m1fn


def _ml_codes(x32: np.ndarray) -> np.ndarray:
  return np.asarray(x32, np.float32).astype(F4).view(np.uint8)


def test_every_code_round_trips():
  codes = np.arange(16, dtype=np.uint8)
  values = np.asarray(fp4.decode_e2m1(codes))
  np.testing.assert_array_equal(values, codes.view(F4).astype(np.float32))
  back = np.asarray(fp4.encode_e2m1(values))
  np.testing.assert_array_equal(back, codes)        # -0 (code 8) included: the sign bit survives


def test_encoding_equals_ml_dtypes_on_every_bfloat16():
  """All 65,536 bf16 bit patterns: ties, subnormal neighbourhoods, saturation, +-inf and NaNs of both signs."""
  every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(fp4.encode_e2m1)(every)), _ml_codes(every))


def test_encoding_equals_ml_dtypes_near_every_tie_and_past_saturation():
  mids = np.asarray([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
  near = np.concatenate([np.nextafter(mids, 0), mids, np.nextafter(mids, 10), [1e-45, 1e-38, 7.0, 1e30]])
  x = np.concatenate([near, -near, [np.nan, -np.nan, np.inf, -np.inf]]).astype(np.float32)
  got = np.asarray(fp4.encode_e2m1(x))
  np.testing.assert_array_equal(got, _ml_codes(x))
  assert got[-4] == 8 and got[-3] == 0 and got[-2] == 7 and got[-1] == 15   # NaN -> zero of the other sign


def test_pack_puts_the_even_element_in_the_low_nibble():
  codes = np.array([[1, 2], [3, 4], [15, 0], [8, 7]], np.uint8)
  packed = np.asarray(fp4.pack_nibbles(codes, 0))
  np.testing.assert_array_equal(packed, [[0x31, 0x42], [0x8F, 0x70]])
  np.testing.assert_array_equal(np.asarray(fp4.unpack_nibbles(packed, 0)), codes)
  with pytest.raises(ValueError, match="odd length 3"):
    fp4.pack_nibbles(codes[:3], 0)


def test_mxfp4_scales_by_hand():
  block = np.zeros((32, 3), np.float32)
  block[0] = [7.0, 6.0, 0.0]        # amax 7: ocp 2^(2-2) = 1 (7 saturates to 6); ceil 2^ceil(log2 7/6) = 2
  block[1] = [0.5, 0.75, 0.0]       # amax 6: ocp 2^(2-2) = 1, ceil 1; column 2 all zero
  ocp = fp4.quantize_blocks(block, "mxfp4", rule="ocp")
  ceil = fp4.quantize_blocks(block, "mxfp4", rule="ceil")
  np.testing.assert_array_equal(np.asarray(ocp.scales)[0], [127, 127, 0])          # E8M0 bytes: e + 127
  np.testing.assert_array_equal(np.asarray(ceil.scales)[0], [128, 127, 127])
  np.testing.assert_array_equal(np.asarray(fp4.dequantize_blocks(ocp))[:2], [[6.0, 6.0, 0.0], [0.5, 1.0, 0.0]])
  np.testing.assert_array_equal(np.asarray(fp4.dequantize_blocks(ceil))[:2], [[8.0, 6.0, 0.0], [0.0, 1.0, 0.0]])


def test_nvfp4_scales_by_hand_and_the_tensor_scale():
  x = np.zeros((16, 2), np.float32)
  x[:2, 0] = [3.0, -1.5]            # amax 3: scale e4m3(0.5) = 0.5, codes 6 and -3
  x[:2, 1] = [1e-4, 0.0]            # amax/6 = 1.7e-5 < E4M3's smallest subnormal 2^-9: scale 0 without t
  plain = fp4.quantize_blocks(x, "nvfp4", tensor_scale=False)
  np.testing.assert_array_equal(np.asarray(plain.scales.astype(np.float32))[0], [0.5, 0.0])
  np.testing.assert_array_equal(np.asarray(fp4.dequantize_blocks(plain))[:2], [[3.0, 0.0], [-1.5, 0.0]])
  scaled = fp4.quantize_blocks(x, "nvfp4")         # t = 3 / 2688: the largest block scale becomes 448
  assert float(scaled.tensor_scale) == np.float32(3.0) / np.float32(6 * 448)
  np.testing.assert_array_equal(np.asarray(scaled.scales.astype(np.float32))[0, 0], 448.0)
  assert float(fp4.dequantize_blocks(scaled)[0, 1]) > 0      # the tiny block is kept with a tensor scale


@pytest.mark.parametrize("fmt,kw", [("mxfp4", {"rule": "ceil"}), ("nvfp4", {"tensor_scale": False})])
def test_equals_qwix(fmt, kw):
  """qwix's `mxfp4` equals ours with the ceil rule, codes and scales; its `nvfp4` equals ours without a
  tensor scale wherever the E4M3 block scale is nonzero. Where it is zero, qwix divides by zero and stores
  saturated codes (+-6) that dequantize to 0 like our zero codes."""
  qwix = pytest.importorskip("qwix")
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((96, 8)) * np.exp(rng.standard_normal((1, 8)) * 3)).astype(np.float32)
  x[:32, 0] = 0.0
  theirs = qwix.quantize(jnp.asarray(x), fmt, channelwise_axes=(1,), tiled_axes={0: fp4.BLOCK[fmt]})
  ours = fp4.quantize_blocks(x, fmt, **kw)
  np.testing.assert_array_equal(np.asarray(qwix.dequantize(theirs)), np.asarray(fp4.dequantize_blocks(ours)))
  their_scale, our_scale = np.asarray(theirs.scale), np.asarray(fp4.block_scales(ours))
  nonzero = our_scale > 0
  np.testing.assert_array_equal(their_scale[nonzero], our_scale[nonzero])
  rows = np.repeat(nonzero, fp4.BLOCK[fmt], axis=0)
  their_codes = np.asarray(theirs.qvalue).view(np.uint8)
  np.testing.assert_array_equal(their_codes[rows], np.asarray(fp4.unpack_nibbles(ours.codes))[rows])
  assert fmt == "mxfp4" or (~nonzero).any()          # the zero-scale case is exercised for nvfp4


def test_padding_to_whole_blocks():
  x = np.arange(1, 41, dtype=np.float32).reshape(40, 1) / 8
  q = fp4.quantize_blocks(x, "mxfp4")
  assert q.codes.shape == (32, 1) and q.scales.shape == (2, 1)      # 40 rows padded to 64, two per byte
  back = np.asarray(fp4.dequantize_blocks(q, 40))
  assert back.shape == (40, 1) and np.abs(back - x).max() == 1.0     # 5 (a tie of 4 and 6) -> 4: half a step


def test_stochastic_rounding_is_unbiased_and_stays_on_the_bracket():
  x = jnp.full((20000,), 2.6, jnp.float32)         # between 2 and 3: up with probability 0.6
  codes = fp4.encode_e2m1_stochastic(x, jax.random.key(0))
  values = np.asarray(fp4.decode_e2m1(codes))
  assert set(np.unique(values)) == {2.0, 3.0}
  assert abs(values.mean() - 2.6) < 0.02
  lo, hi = fp4.bracket(jnp.asarray([2.0, -0.3, 9.0]))
  np.testing.assert_array_equal(np.asarray(lo), [4, 8, 7])
  np.testing.assert_array_equal(np.asarray(hi), [5, 9, 7])
