"""kernels/fp4_matmul.py in interpret mode equals its reference over odd shapes, both formats, bf16 and f32."""
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.fp4_matmul import FP4MatmulBlocks, fp4_matmul, fp4_matmul_reference
from rlkit.quant import fp4


@pytest.mark.parametrize("m,k,n,fmt,dtype", [
    (3, 40, 5, "mxfp4", jnp.float32),        # K not a whole block, N under a tile
    (17, 100, 33, "nvfp4", jnp.float32),     # every dimension odd, several K steps
    (1, 64, 130, "mxfp4", jnp.bfloat16),     # decode shape, N past one tile
])
@pytest.mark.parametrize("split_k", [1, 4])   # K's pieces in one grid step's loop, or split over the grid
def test_kernel_equals_reference(m, k, n, fmt, dtype, split_k):
  rng = np.random.default_rng(m * 1000 + k)
  x = jnp.asarray(rng.standard_normal((m, k)), dtype)
  w = fp4.quantize_blocks(rng.standard_normal((k, n)).astype(np.float32), fmt)
  got = np.asarray(fp4_matmul(x, w, blocks=FP4MatmulBlocks(bm=8, bn=16, bk=32, split_k=split_k),
                               interpret=True))
  ref = np.asarray(fp4_matmul_reference(x, w))
  assert got.shape == (m, n) and got.dtype == np.float32
  # Equal up to float32 summation order (tiles of 32 along K; NVFP4's tensor scale applied at the end).
  bound = 1e-6 * np.abs(np.asarray(x, np.float32)) @ np.abs(np.asarray(fp4.dequantize_blocks(w, k)))
  assert np.all(np.abs(got - ref) <= bound + 1e-7)


def test_bad_shapes_and_blocks_are_named():
  w = fp4.quantize_blocks(np.ones((64, 4), np.float32), "mxfp4")
  with pytest.raises(ValueError, match="x has K=96 but W covers 64 rows"):
    fp4_matmul(jnp.ones((2, 96)), w, interpret=True)
  with pytest.raises(ValueError, match="bk=16 must be a multiple of the format's block 32"):
    fp4_matmul(jnp.ones((2, 64)), w, blocks=FP4MatmulBlocks(bk=16), interpret=True)
  with pytest.raises(ValueError, match="bn=24 must be a positive power of two"):
    FP4MatmulBlocks(bn=24)
