"""DeepGEMM-style use from torch: e4m3 activations with packed UE8M0 scales, zero-copy.

python examples/torch_deepgemm.py   (needs a CUDA GPU and torch)

The scales come back as int32 [M, ceil(K/512)] with strides (1, align(M, 4)): the MN-major,
TMA-aligned layout DeepGEMM's SM100 FP8 GEMMs read. For SM90, use
quantize(x, scale="ue8m0", layout="col_tma") (float32 powers of two).
"""

import torch

import fp8_group_quant as fgq

x = torch.randn(100, 7168, dtype=torch.bfloat16, device="cuda")
q, scales = fgq.quantize_packed(x)  # on torch's current stream
print(q.dtype, tuple(q.shape), scales.dtype, tuple(scales.shape), scales.stride())

# preallocated outputs: no allocation in the call, so it can be captured in a CUDA graph
out = torch.empty_like(q)
tma = (x.shape[0] + 3) // 4 * 4
scale_out = torch.empty(tma * scales.shape[1], dtype=torch.int32, device="cuda").as_strided(
    scales.shape, (1, tma)
)
graph = torch.cuda.CUDAGraph()
fgq.quantize_packed(x, out=out, scale_out=scale_out)  # warm up before capture
with torch.cuda.graph(graph):
    fgq.quantize_packed(x, out=out, scale_out=scale_out)
graph.replay()
torch.cuda.synchronize()
assert torch.equal(out.view(torch.uint8), q.view(torch.uint8)) and torch.equal(scale_out, scales)
x_back = fgq.dequantize(out, scale_out, 128)  # packed scales: the group size is given
print("relative error:", ((x_back - x.float()).norm() / x.float().norm()).item())
