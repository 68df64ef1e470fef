"""Foreign GPU arrays (JAX, numba) and several GPUs."""

import threading

import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq

pytestmark = pytest.mark.gpu


def test_jax_arrays_in_and_out():
    import jax
    import jax.numpy as jnp

    data = activations(np.random.default_rng(0), (33, 1024), "bfloat16", specials=True)
    x = jax.device_put(jnp.asarray(data), jax.devices("gpu")[0])
    q, s = fgq.quantize_packed(x)
    assert isinstance(q, jax.Array) and q.dtype == jnp.float8_e4m3fn and q.shape == (33, 1024)
    q_ref, s_ref = fgq.quantize_packed(data)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(s), s_ref)  # logical values (JAX has no strides)
    q8, s8 = fgq.quantize(x, 64, dtype="int8", layout="col")
    assert q8.dtype == jnp.int8 and s8.dtype == jnp.float32
    # both orientations: the four results in JAX, both codes float8, as the NumPy backend's
    both = fgq.quantize(x, 128, layout="col", orientation="both")
    reference = fgq.quantize(data, 128, layout="col", orientation="both")
    assert isinstance(both, fgq.BothOrientations) and all(isinstance(a, jax.Array) for a in both)
    assert both.q.dtype == both.qt.dtype == jnp.float8_e4m3fn and both.qt.shape == (1024, 33)
    for got, want in zip(both, reference):
        got_bytes = np.asarray(got).view(np.uint8).reshape(-1)
        np.testing.assert_array_equal(got_bytes, np.ascontiguousarray(want).view(np.uint8).ravel())
    with pytest.raises(TypeError, match="out: JAX arrays are immutable"):
        fgq.quantize_packed(x, out=q)


def test_numba_device_arrays_in_and_out():
    from numba import cuda

    data = activations(np.random.default_rng(1), (7, 512), "float16", specials=True)
    x = cuda.to_device(data)
    q, s = fgq.quantize(x, 128, scale="ue8m0", layout="col_tma")
    assert cuda.is_cuda_array(q) and cuda.is_cuda_array(s)
    q_ref, s_ref = fgq.quantize(data, 128, scale="ue8m0", layout="col_tma")
    np.testing.assert_array_equal(q.copy_to_host(), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s.copy_to_host(), s_ref)
    out = cuda.device_array((7, 512), np.uint8)
    q2, _ = fgq.quantize(x, 128, scale="ue8m0", layout="col_tma", out=out)
    assert q2 is out
    np.testing.assert_array_equal(out.copy_to_host(), np.asarray(q_ref).view(np.uint8))


@pytest.mark.multi_gpu
def test_two_devices_from_two_threads():
    import cupy
    import torch

    rng = np.random.default_rng(2)
    hosts = [activations(rng, (300, 7168), "bfloat16", specials=True) for _ in range(2)]
    tensors = [
        torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16).to(f"cuda:{i}")
        for i, h in enumerate(hosts)
    ]
    results, errors = [None, None], []

    def work(i):
        try:
            for _ in range(50):
                q, s = fgq.quantize_packed(tensors[i])
            torch.cuda.synchronize(i)
            results[i] = (q, s)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i, (q, s) in enumerate(results):
        assert q.device.index == i and s.device.index == i
        q_ref, s_ref = fgq.quantize_packed(hosts[i])
        assert np.array_equal(q.view(torch.uint8).cpu().numpy(), np.asarray(q_ref).view(np.uint8))
        assert np.array_equal(s.cpu().numpy(), s_ref)

    with cupy.cuda.Device(1):
        x1 = cupy.asarray(hosts[1])
    q, s = fgq.quantize_packed(x1)  # current device 0, data on device 1
    assert q.device.id == 1 and s.device.id == 1
    assert np.array_equal(s.get(), fgq.quantize_packed(hosts[1])[1])
    with pytest.raises(ValueError, match="out: expected device 1"):
        fgq.quantize_packed(
            tensors[1], out=torch.empty(300, 7168, dtype=torch.uint8, device="cuda:0")
        )
