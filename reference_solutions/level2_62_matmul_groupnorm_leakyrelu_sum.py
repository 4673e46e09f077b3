# Gold reference solution: KernelBench level2/62 Matmul_GroupNorm_LeakyReLU_Sum.
#
# Design: fc (cuBLAS addmm) -> [GroupNorm -> LeakyReLU -> x + x] in one CUDA kernel.
# The GEMM stays fp32-exact: torch.addmm(linear.bias, x, weight.t()) is the very call nn.Linear makes,
# so its output is bit-identical to the reference's (no TF32, torch.backends untouched). The fused
# kernel reads the GEMM output once (16-byte float4 loads) and writes the result once; each group's
# mean and biased variance are accumulated in fp32 by two passes over registers (mean, then centred
# sum of squares) with warp-shuffle reductions (no shared memory, no atomics).
#   * channels per group (cpg) in {4, 8, ..., 128}: a warp loads 4 x 128 consecutive floats; each
#     group is held by an aligned segment of cpg/4 lanes and reduced with segmented shuffles.
#   * cpg = 128*k, k <= 8: one warp per (row, group), k float4s per lane.
#   * anything else (cpg not a multiple of 4, other sizes, unaligned pointers): a scalar fallback,
#     one warp per (row, group), three passes over the group.
# Element-wise math follows PyTorch's CUDA kernels (expf/tanhf/log1pf/rsqrtf, IEEE division, no
# --use_fast_math; products that PyTorch rounds separately are not contracted into FMAs).
# Measured: see reference_solutions/RESULTS.md

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace {

constexpr int kWarpSize = 32;
constexpr int kThreads = 256;            // 8 warps per block
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kChunk = 4 * kWarpSize;    // floats covered by one float4 load of a whole warp
constexpr int kSegLoads = 4;             // float4 loads in flight per lane (segmented kernel)
constexpr int kMaxWarpLoads = 8;         // register path up to kChunk * 8 = 1024 channels per group

__device__ __forceinline__ float4 load4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ void store4(float* p, const float4& v) {
  *reinterpret_cast<float4*>(p) = v;
}
// Sum over aligned segments of kWidth lanes (kWidth a power of two <= 32); every lane gets its
// segment's sum. All 32 lanes must call it.
template <int kWidth>
__device__ __forceinline__ float segment_sum(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float sum4(const float4& v) { return (v.x + v.y) + (v.z + v.w); }
__device__ __forceinline__ float sqdev4(const float4& v, float m) {
  const float a = v.x - m, b = v.y - m, c = v.z - m, d = v.w - m;
  return (a * a + b * b) + (c * c + d * d);
}
// GroupNorm affine, written as PyTorch's HxW == 1 path writes it: (x - mean) * rstd * gamma + beta.
__device__ __forceinline__ float norm1(float v, float mean, float rstd, float g, float b) {
  return (v - mean) * rstd * g + b;
}
__device__ __forceinline__ float4 norm4(const float4& v, float mean, float rstd, const float4& g,
                                        const float4& b) {
  return make_float4(norm1(v.x, mean, rstd, g.x, b.x), norm1(v.y, mean, rstd, g.y, b.y),
                     norm1(v.z, mean, rstd, g.z, b.z), norm1(v.w, mean, rstd, g.w, b.w));
}

// ---------------------------------------------------------------------------------------------
// Problem-specific element-wise work. pre*: applied to the GEMM output before the statistics;
// post*: applied to the normalised value. c is the channel of the (first) element; in the *4
// versions c is a multiple of 4 and per-channel parameter pointers are 16-byte aligned.
// ---------------------------------------------------------------------------------------------
struct Epilogue {
  float negative_slope;
  __device__ __forceinline__ float pre1(float v, int) const { return v; }
  __device__ __forceinline__ float4 pre4(const float4& v, int) const { return v; }
  // leaky_relu (as PyTorch: v > 0 ? v : v * slope), then x + x.
  __device__ __forceinline__ float post1(float v, int) const {
    const float a = v > 0.f ? v : __fmul_rn(v, negative_slope);
    return a + a;
  }
  __device__ __forceinline__ float4 post4(const float4& v, int c) const {
    return make_float4(post1(v.x, c), post1(v.y, c), post1(v.z, c), post1(v.w, c));
  }
};

// ---------------------------------------------------------------------------------------------
// Kernel 1 (channels per group cpg = 4 * kLanes <= 128, kLanes a power of two): the flattened
// (N*C) tensor is a sequence of N*G groups of cpg consecutive floats. A warp takes kSegLoads
// consecutive 128-float chunks; lane l holds float4 number l of each chunk, so a group is held by
// an aligned segment of kLanes lanes and its sums are segmented shuffle reductions. Because
// total and every chunk start are multiples of cpg, a segment is either wholly in range or wholly
// out of it.
// ---------------------------------------------------------------------------------------------
template <int kLanes, class Epi>
__global__ void __launch_bounds__(kThreads)
group_norm_segmented_kernel(const float* __restrict__ x, float* __restrict__ y,
                            const float* __restrict__ gamma, const float* __restrict__ beta,
                            const Epi epi, const int64_t total, const int C, const float inv_cpg,
                            const float eps) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t base = warp * (kChunk * kSegLoads) + 4 * lane;
  const bool small_index = total <= static_cast<int64_t>(UINT32_MAX);

  float4 v[kSegLoads];
  int ch[kSegLoads];
  bool ok[kSegLoads];
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i) {
    const int64_t idx = base + i * kChunk;
    ok[i] = idx < total;
    ch[i] = small_index ? static_cast<int>(static_cast<uint32_t>(idx) % static_cast<uint32_t>(C))
                        : static_cast<int>(idx % C);
    v[i] = ok[i] ? load4(x + idx) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i)
    if (ok[i]) v[i] = epi.pre4(v[i], ch[i]);

  float mean[kSegLoads], rstd[kSegLoads];
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i) mean[i] = sum4(v[i]);
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i) mean[i] = segment_sum<kLanes>(mean[i]) * inv_cpg;
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i) rstd[i] = sqdev4(v[i], mean[i]);
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i)
    rstd[i] = rsqrtf(segment_sum<kLanes>(rstd[i]) * inv_cpg + eps);

#pragma unroll
  for (int i = 0; i < kSegLoads; ++i) {
    if (!ok[i]) continue;
    const float4 o = norm4(v[i], mean[i], rstd[i], load4(gamma + ch[i]), load4(beta + ch[i]));
    store4(y + base + i * kChunk, epi.post4(o, ch[i]));
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2 (cpg = 128 * kLoads, kLoads <= 8): one warp per (row, group); lane l holds float4s
// l, l + 32, ... of the group in registers; full-warp shuffle reductions; two passes over the
// registers (mean, then centred sum of squares).
// ---------------------------------------------------------------------------------------------
template <int kLoads, class Epi>
__global__ void __launch_bounds__(kThreads)
group_norm_warp_kernel(const float* __restrict__ x, float* __restrict__ y,
                       const float* __restrict__ gamma, const float* __restrict__ beta,
                       const Epi epi, const int64_t num_row_groups, const int G, const float eps) {
  constexpr int kCpg = kChunk * kLoads;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int64_t rg = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  if (rg >= num_row_groups) return;  // warp-uniform
  const int64_t base = rg * kCpg + 4 * lane;
  const int c0 = static_cast<int>(rg % G) * kCpg + 4 * lane;

  float4 v[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) v[k] = load4(x + base + k * kChunk);
#pragma unroll
  for (int k = 0; k < kLoads; ++k) v[k] = epi.pre4(v[k], c0 + k * kChunk);

  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) s += sum4(v[k]);
  const float mean = segment_sum<kWarpSize>(s) * (1.f / kCpg);
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) q += sqdev4(v[k], mean);
  const float rstd = rsqrtf(segment_sum<kWarpSize>(q) * (1.f / kCpg) + eps);

#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int c = c0 + k * kChunk;
    const float4 o = norm4(v[k], mean, rstd, load4(gamma + c), load4(beta + c));
    store4(y + base + k * kChunk, epi.post4(o, c));
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 3 (fallback for any cpg, or unaligned pointers): one warp per (row, group), scalar
// accesses, three passes over the group (sum, centred sum of squares, write); the second and third
// passes re-read the group from L1/L2, not registers.
// ---------------------------------------------------------------------------------------------
template <class Epi>
__global__ void __launch_bounds__(kThreads)
group_norm_generic_kernel(const float* __restrict__ x, float* __restrict__ y,
                          const float* __restrict__ gamma, const float* __restrict__ beta,
                          const Epi epi, const int64_t num_row_groups, const int G, const int cpg,
                          const float eps) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int64_t rg = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  if (rg >= num_row_groups) return;  // warp-uniform
  const float* xg = x + rg * cpg;
  float* yg = y + rg * cpg;
  const int c0 = static_cast<int>(rg % G) * cpg;

  float s = 0.f;
  for (int j = lane; j < cpg; j += kWarpSize) s += epi.pre1(__ldg(xg + j), c0 + j);
  const float mean = segment_sum<kWarpSize>(s) / static_cast<float>(cpg);
  float q = 0.f;
  for (int j = lane; j < cpg; j += kWarpSize) {
    const float d = epi.pre1(__ldg(xg + j), c0 + j) - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(segment_sum<kWarpSize>(q) / static_cast<float>(cpg) + eps);
  for (int j = lane; j < cpg; j += kWarpSize) {
    const int c = c0 + j;
    const float o = norm1(epi.pre1(__ldg(xg + j), c), mean, rstd, __ldg(gamma + c), __ldg(beta + c));
    yg[j] = epi.post1(o, c);
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned int grid_for_warps(int64_t warps) {
  const int64_t blocks = ceil_div(warps, kWarpsPerBlock);
  TORCH_CHECK(blocks <= INT32_MAX, "fused_epilogue: tensor too large (", blocks, " blocks)");
  return static_cast<unsigned int>(blocks);
}

template <class Epi>
void launch_group_norm(const float* x, float* y, const float* gamma, const float* beta,
                       const Epi& epi, int64_t N, int64_t C, int64_t G, float eps,
                       bool vector_ok, cudaStream_t stream) {
  const int64_t cpg = C / G;
  const int64_t total = N * C;
  const int64_t row_groups = N * G;
  const int64_t lanes = cpg / 4;
  if (vector_ok && cpg % 4 == 0 && lanes <= kWarpSize && (lanes & (lanes - 1)) == 0) {
    const unsigned int grid = grid_for_warps(ceil_div(total, kChunk * kSegLoads));
    const float inv_cpg = 1.f / static_cast<float>(cpg);
#define KH_SEG(L)                                                                              \
  case L:                                                                                      \
    group_norm_segmented_kernel<L, Epi><<<grid, kThreads, 0, stream>>>(                        \
        x, y, gamma, beta, epi, total, static_cast<int>(C), inv_cpg, eps);                     \
    break;
    switch (lanes) { KH_SEG(1) KH_SEG(2) KH_SEG(4) KH_SEG(8) KH_SEG(16) KH_SEG(32) }
#undef KH_SEG
  } else if (vector_ok && cpg % kChunk == 0 && cpg / kChunk <= kMaxWarpLoads) {
    const unsigned int grid = grid_for_warps(row_groups);
#define KH_WARP(K)                                                                             \
  case K:                                                                                      \
    group_norm_warp_kernel<K, Epi><<<grid, kThreads, 0, stream>>>(                             \
        x, y, gamma, beta, epi, row_groups, static_cast<int>(G), eps);                         \
    break;
    switch (cpg / kChunk) {
      KH_WARP(1) KH_WARP(2) KH_WARP(3) KH_WARP(4) KH_WARP(5) KH_WARP(6) KH_WARP(7) KH_WARP(8)
    }
#undef KH_WARP
  } else {
    const unsigned int grid = grid_for_warps(row_groups);
    group_norm_generic_kernel<Epi><<<grid, kThreads, 0, stream>>>(
        x, y, gamma, beta, epi, row_groups, static_cast<int>(G), static_cast<int>(cpg), eps);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_input(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "fused_epilogue: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, "fused_epilogue: ", name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), "fused_epilogue: ", name, " must be contiguous");
}

void check_channel_param(const torch::Tensor& t, const char* name, const torch::Tensor& x,
                         int64_t C) {
  check_input(t, name);
  TORCH_CHECK(t.device() == x.device(), "fused_epilogue: ", name, " is on another device");
  TORCH_CHECK(t.numel() == C, "fused_epilogue: ", name, " must have ", C, " elements, got ",
              t.numel());
}

}  // namespace

// ---- host entry point ----

torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                             double negative_slope,
                             int64_t num_groups, double eps) {
  check_input(x, "x");
  TORCH_CHECK(x.dim() == 2, "fused_epilogue: x must be 2-D (batch, features), got ", x.dim(), "-D");
  const int64_t N = x.size(0);
  const int64_t C = x.size(1);
  TORCH_CHECK(num_groups > 0 && C % num_groups == 0, "fused_epilogue: features (", C,
              ") must be divisible by num_groups (", num_groups, ")");
  TORCH_CHECK(C <= INT32_MAX, "fused_epilogue: too many features");
  check_channel_param(gamma, "gamma", x, C);
  check_channel_param(beta, "beta", x, C);
  const c10::cuda::CUDAGuard device_guard(x.device());
  torch::Tensor y = torch::empty_like(x);
  if (y.numel() == 0) return y;
  const bool vector_ok = aligned16(x.data_ptr()) && aligned16(y.data_ptr()) &&
                         aligned16(gamma.data_ptr()) && aligned16(beta.data_ptr());
  const Epilogue epi{static_cast<float>(negative_slope)};
  launch_group_norm(x.data_ptr<float>(), y.data_ptr<float>(), gamma.data_ptr<float>(),
                    beta.data_ptr<float>(), epi, N, C, num_groups, static_cast<float>(eps), vector_ok,
                    at::cuda::getCurrentCUDAStream());
  return y;
}
"""

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                             double negative_slope,
                             int64_t num_groups, double eps);
"""

_ext = load_inline(
    name="kh_ref_level2_62_gn_leakyrelu_sum",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_epilogue"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        y = torch.addmm(self.fc.bias, x, self.fc.weight.t())  # exactly what nn.Linear runs
        return _ext.fused_epilogue(y, self.gn.weight, self.gn.bias, float(self.leaky_relu.negative_slope),
                                   self.gn.num_groups, self.gn.eps)
