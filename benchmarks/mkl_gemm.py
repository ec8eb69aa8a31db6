"""oneMKL's float32 and bfloat16 GEMMs through ctypes, from PyPI's `mkl` wheel (`pip install mkl`):
a prototype route to the CPU's matrix units for benchmarks/cpu_matmul_routes.py, never imported
by jaxtrain. Row-major, no transposes; C = A @ B, accumulated in float32.

MKL picks its kernels by CPU vendor: on AMD it has run its generic "Intel(R) Architecture
processors" code, so `version()["processor"]` is recorded beside every number.
"""

import ctypes
import glob
import os
import sys

ROW_MAJOR, NO_TRANS = 101, 111


def find_library() -> str | None:
  """libmkl_rt from the `mkl` wheel in this environment (it lands in <prefix>/lib), else None."""
  for prefix in (sys.prefix, sys.base_prefix):
    found = sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    if found:
      return found[0]
  return None


class _Version(ctypes.Structure):
  _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("update", ctypes.c_int),
              ("status", ctypes.c_char_p), ("build", ctypes.c_char_p),
              ("processor", ctypes.c_char_p), ("platform", ctypes.c_char_p)]


class Mkl:
  """The two GEMMs of one loaded libmkl_rt, run on `threads` threads."""

  def __init__(self, threads: int, path: str | None = None):
    path = path or find_library()
    if path is None:
      raise OSError("no libmkl_rt in this environment: pip install mkl")
    self.lib = ctypes.CDLL(path)
    self.lib.MKL_Set_Num_Threads(threads)
    ptr, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    args = [i, i, i, i, i, i, f, ptr, i, ptr, i, f, ptr, i]
    self.sgemm, self.bf16gemm = self.lib.cblas_sgemm, self.lib.cblas_gemm_bf16bf16f32
    for fn in (self.sgemm, self.bf16gemm):
      fn.argtypes, fn.restype = args, None

  def version(self) -> dict:
    v = _Version()
    self.lib.MKL_Get_Version(ctypes.byref(v))
    text = lambda b: b.decode(errors="replace") if b else None
    return {"version": f"{v.major}.{v.minor} Update {v.update}", "build": text(v.build),
            "processor": text(v.processor), "platform": text(v.platform)}

  def matmul(self, a, b, out=None):
    """float32[M, N] = a[M, K] @ b[K, N] for C-contiguous numpy arrays, both float32 or both
    bfloat16 (ml_dtypes)."""
    import numpy as np

    (m, k), n = a.shape, b.shape[1]
    out = np.empty((m, n), np.float32) if out is None else out
    fn = self.bf16gemm if a.dtype.name == "bfloat16" else self.sgemm
    fn(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0,
       out.ctypes.data, n)
    return out


def jax_matmul(mkl: Mkl):
  """`f(a, b)`: jax arrays in, float32 out, the product computed by `mkl` in a
  `jax.pure_callback`: the cheapest way for a jitted program to reach MKL (a host round trip and
  a copy per call; no gradient)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  def f(a, b):
    out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    return jax.pure_callback(lambda x, y: mkl.matmul(np.ascontiguousarray(x), np.ascontiguousarray(y)),
                             out, a, b)
  return f
