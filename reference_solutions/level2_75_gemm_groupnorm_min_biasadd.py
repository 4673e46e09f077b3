# Gold reference solution: KernelBench level2/75 Gemm_GroupNorm_Min_BiasAdd.
#
# Design: gemm (cuBLAS addmm) -> [GroupNorm -> min over features -> + bias] in two CUDA kernels.
# The GEMM stays fp32-exact: torch.addmm(linear.bias, x, weight.t()) is the very call nn.Linear makes,
# so its output is bit-identical to the reference's (no TF32, torch.backends untouched).
# The reference returns (B, 1) + bias(1, C, 1, 1), which broadcasts to (1, C, B, 1):
# out[0, c, b, 0] = rowmin[b] + bias[c]. The only allocation is that output; the row minima are
# kept in the GEMM output's first column (a temporary the forward owns). Two kernels:
#   1. one 256-thread block per batch row: its 8 warps read the row once (16-byte streaming
#      loads, up to 8 in flight per lane), compute each group's mean and biased variance in fp32 by
#      two passes over registers (mean, then centred sum of squares) with warp-shuffle reductions,
#      normalise (affine) and keep a running minimum; the block combines the warps' minima through
#      shared memory (no atomics) and, after the barrier that follows all reads of the row, stores
#      the row minimum into x[b, 0].
#      * channels per group (cpg) in {4, 8, ..., 128}: a warp loads 8 x 128 consecutive floats; a
#        group is held by an aligned segment of cpg/4 lanes (segmented shuffles).
#      * cpg = 128*k, k <= 6: a warp takes a whole group, k float4s per lane.
#      * anything else (cpg not a multiple of 4, other sizes, unaligned pointers): scalar fallback.
#   2. broadcast: each thread gathers 4 row minima once and writes them + bias[c] for a slice of
#      channels, each warp storing 512 contiguous bytes of one channel (full 128-byte lines,
#      streaming stores); one entry per thread when B % 4 != 0.
# Element-wise math follows PyTorch's CUDA kernels (rsqrtf, no --use_fast_math); the min propagates
# NaN like torch.min.
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
constexpr int kThreads = 256;                    // row-min kernel: one block per batch row
constexpr int kWarpsPerRow = kThreads / kWarpSize;  // 8
constexpr int kChunk = 4 * kWarpSize;            // floats covered by one float4 load of a warp
constexpr int kSegLoads = 8;                     // float4 loads in flight per lane (segmented path)
constexpr int kMaxWarpLoads = 6;                 // register path up to 768 channels per group
constexpr int kBcastThreads = 256;               // broadcast kernel: 4 batch entries per thread
constexpr int kBcastChannelBlocks = 256;         // broadcast kernel: grid.y (channel slices)

// Per-channel parameters (never written): read-only path.
__device__ __forceinline__ float4 load4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}
// The GEMM output (its first column is overwritten by the row minima): coherent streaming load.
__device__ __forceinline__ float4 load4_stream(const float* p) {
  return __ldcs(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ void store4_stream(float* p, const float4& v) {
  __stcs(reinterpret_cast<float4*>(p), v);
}
template <int kWidth>
__device__ __forceinline__ float segment_sum(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// min that propagates NaN, like torch.min.
__device__ __forceinline__ float min_nan(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = min_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
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
__device__ __forceinline__ float min_norm4(float m, const float4& v, float mean, float rstd,
                                           const float4& g, const float4& b) {
  m = min_nan(m, norm1(v.x, mean, rstd, g.x, b.x));
  m = min_nan(m, norm1(v.y, mean, rstd, g.y, b.y));
  m = min_nan(m, norm1(v.z, mean, rstd, g.z, b.z));
  return min_nan(m, norm1(v.w, mean, rstd, g.w, b.w));
}

// Each function below is called by a whole warp (warp-uniform control flow) for one row xr and
// returns this lane's partial minimum over the groups the warp handles (warp wr of kWarpsPerRow).

// cpg = 4 * kLanes <= 128 (kLanes a power of two): chunks of 128 floats, a group per aligned
// segment of kLanes lanes. C is a multiple of cpg and chunk starts are multiples of 128, so a
// segment is either wholly inside the row or wholly past its end.
template <int kLanes>
__device__ __forceinline__ float row_min_segmented(const float* xr,
                                                   const float* __restrict__ gamma,
                                                   const float* __restrict__ beta, int C, int wr,
                                                   float eps) {
  constexpr float kInvCpg = 1.f / (4 * kLanes);
  const int lane = threadIdx.x & (kWarpSize - 1);
  float m = INFINITY;
  for (int c0 = wr * (kChunk * kSegLoads) + 4 * lane; c0 - 4 * lane < C;
       c0 += kWarpsPerRow * kChunk * kSegLoads) {
    float4 v[kSegLoads];
    bool ok[kSegLoads];
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) {
      ok[i] = c0 + i * kChunk < C;
      v[i] = ok[i] ? load4_stream(xr + c0 + i * kChunk) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float mean[kSegLoads], rstd[kSegLoads];
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) mean[i] = sum4(v[i]);
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) mean[i] = segment_sum<kLanes>(mean[i]) * kInvCpg;
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) rstd[i] = sqdev4(v[i], mean[i]);
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i)
      rstd[i] = rsqrtf(segment_sum<kLanes>(rstd[i]) * kInvCpg + eps);
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) {
      if (!ok[i]) continue;
      const int c = c0 + i * kChunk;
      m = min_norm4(m, v[i], mean[i], rstd[i], load4(gamma + c), load4(beta + c));
    }
  }
  return m;
}

// cpg = 128 * kLoads: a warp per group, kLoads float4s per lane.
template <int kLoads>
__device__ __forceinline__ float row_min_warp(const float* xr,
                                              const float* __restrict__ gamma,
                                              const float* __restrict__ beta, int G, int wr,
                                              float eps) {
  constexpr int kCpg = kChunk * kLoads;
  const int lane = threadIdx.x & (kWarpSize - 1);
  float m = INFINITY;
  for (int g = wr; g < G; g += kWarpsPerRow) {
    const int c0 = g * kCpg + 4 * lane;
    float4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) v[k] = load4_stream(xr + c0 + k * kChunk);
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
      m = min_norm4(m, v[k], mean, rstd, load4(gamma + c), load4(beta + c));
    }
  }
  return m;
}

// Any cpg, any alignment: a warp per group, scalar accesses, three passes (the second and third
// re-read the group from L1/L2).
__device__ __forceinline__ float row_min_generic(const float* xr,
                                                 const float* __restrict__ gamma,
                                                 const float* __restrict__ beta, int G, int cpg,
                                                 int wr, float eps) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  float m = INFINITY;
  for (int g = wr; g < G; g += kWarpsPerRow) {
    const int c0 = g * cpg;
    float s = 0.f;
    for (int j = lane; j < cpg; j += kWarpSize) s += __ldcs(xr + c0 + j);
    const float mean = segment_sum<kWarpSize>(s) / static_cast<float>(cpg);
    float q = 0.f;
    for (int j = lane; j < cpg; j += kWarpSize) {
      const float d = __ldcs(xr + c0 + j) - mean;
      q += d * d;
    }
    const float rstd = rsqrtf(segment_sum<kWarpSize>(q) / static_cast<float>(cpg) + eps);
    for (int j = lane; j < cpg; j += kWarpSize) {
      const int c = c0 + j;
      m = min_nan(m, norm1(__ldcs(xr + c), mean, rstd, __ldg(gamma + c), __ldg(beta + c)));
    }
  }
  return m;
}

// Kernel 1. kLanes > 0: segmented path; kLoads > 0: warp-per-group path; both 0: generic path.
// One block per batch row b: its 8 warps split the row's groups, each keeps a running minimum of
// the normalised values; the block combines them through shared memory and thread 0 stores the
// row minimum into x[b, 0] (the GEMM output is a temporary this op owns). Only this block reads
// row b, and it writes x[b, 0] after the barrier that follows every read of the row.
template <int kLanes, int kLoads>
__global__ void __launch_bounds__(kThreads)
group_norm_row_min_kernel(float* x, const float* __restrict__ gamma,
                          const float* __restrict__ beta, const int C, const int G,
                          const float eps) {
  __shared__ float partial[kWarpsPerRow];
  const int wr = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x & (kWarpSize - 1);
  float* xr = x + static_cast<int64_t>(blockIdx.x) * C;
  float m;
  if constexpr (kLanes > 0) {
    m = row_min_segmented<kLanes>(xr, gamma, beta, C, wr, eps);
  } else if constexpr (kLoads > 0) {
    m = row_min_warp<kLoads>(xr, gamma, beta, G, wr, eps);
  } else {
    m = row_min_generic(xr, gamma, beta, G, C / G, wr, eps);
  }
  m = warp_min(m);
  if (lane == 0) partial[wr] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = partial[0];
#pragma unroll
    for (int w = 1; w < kWarpsPerRow; ++w) mm = min_nan(mm, partial[w]);
    xr[0] = mm;
  }
}

// Kernel 2: out[0, c, b, 0] = rowmin[b] + bias[c], rowmin[b] read from x[b, 0] (strided gather,
// once per thread). Thread t of block (bx, by) owns batch entries 4t..4t+3 of its 1024-entry slice
// and writes them for channels by, by + grid.y, ...: each warp stores 512 contiguous bytes of one
// channel (full 128-byte lines, streaming stores). Scalar variant (one entry per thread) when
// B % 4 != 0 or the output is not 16-byte aligned.
template <bool kVector>
__global__ void __launch_bounds__(kBcastThreads)
min_bias_broadcast_kernel(const float* x, const float* __restrict__ bias, float* __restrict__ out,
                          const int B, const int C) {
  constexpr int kPer = kVector ? 4 : 1;
  const int b = (blockIdx.x * kBcastThreads + threadIdx.x) * kPer;
  if (b >= B) return;
  const int64_t ld = B;  // stride between channels of the (1, C, B, 1) output
  if constexpr (kVector) {
    const float4 rm = make_float4(x[static_cast<int64_t>(b) * C], x[static_cast<int64_t>(b + 1) * C],
                                  x[static_cast<int64_t>(b + 2) * C],
                                  x[static_cast<int64_t>(b + 3) * C]);
    for (int c = blockIdx.y; c < C; c += gridDim.y) {
      const float bc = __ldg(bias + c);
      store4_stream(out + c * ld + b, make_float4(rm.x + bc, rm.y + bc, rm.z + bc, rm.w + bc));
    }
  } else {
    const float rm = x[static_cast<int64_t>(b) * C];
    for (int c = blockIdx.y; c < C; c += gridDim.y) out[c * ld + b] = rm + __ldg(bias + c);
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_input(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "fused_epilogue: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, "fused_epilogue: ", name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), "fused_epilogue: ", name, " must be contiguous");
}

}  // namespace

// ---- host entry point ----

torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                             torch::Tensor bias, int64_t num_groups, double eps) {
  check_input(x, "x");
  TORCH_CHECK(x.dim() == 2, "fused_epilogue: x must be 2-D (batch, features), got ", x.dim(), "-D");
  const int64_t B = x.size(0);
  const int64_t C = x.size(1);
  TORCH_CHECK(num_groups > 0 && C % num_groups == 0, "fused_epilogue: features (", C,
              ") must be divisible by num_groups (", num_groups, ")");
  TORCH_CHECK(C <= (int64_t{1} << 26), "fused_epilogue: too many features (", C, ")");
  TORCH_CHECK(B <= INT32_MAX - 4 * kBcastThreads, "fused_epilogue: batch too large (", B, ")");
  check_input(gamma, "gamma");
  check_input(beta, "beta");
  check_input(bias, "bias");
  TORCH_CHECK(gamma.numel() == C && beta.numel() == C, "fused_epilogue: GroupNorm affine must have ",
              C, " channels");
  TORCH_CHECK(bias.dim() == 4 && bias.size(0) == 1 && bias.size(1) == C && bias.size(2) == 1 &&
                  bias.size(3) == 1,
              "fused_epilogue: bias must have shape (1, ", C, ", 1, 1), got ", bias.sizes());
  TORCH_CHECK(gamma.device() == x.device() && beta.device() == x.device() &&
                  bias.device() == x.device(),
              "fused_epilogue: all tensors must be on one device");

  const c10::cuda::CUDAGuard device_guard(x.device());
  // (B, 1) + (1, C, 1, 1) broadcasts to (1, C, B, 1).
  torch::Tensor out = torch::empty({1, C, B, 1}, x.options());
  if (out.numel() == 0) return out;

  const int64_t cpg = C / num_groups;
  const int64_t lanes = cpg / 4;
  const bool vector_load = aligned16(x.data_ptr()) && aligned16(gamma.data_ptr()) &&
                           aligned16(beta.data_ptr()) && C % 4 == 0;
  const bool vector_store = (B % 4 == 0) && aligned16(out.data_ptr());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  float* xp = x.data_ptr<float>();
  const float* gp = gamma.data_ptr<float>();
  const float* bp = beta.data_ptr<float>();
  const float* biasp = bias.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int Bi = static_cast<int>(B), Ci = static_cast<int>(C), Gi = static_cast<int>(num_groups);
  const float epsf = static_cast<float>(eps);

  // Kernel 1: row minima into x[:, 0] (x is overwritten; the caller passes its GEMM temporary).
  const unsigned int rows = static_cast<unsigned int>(B);
#define KH_LAUNCH(L, K)                                                                          \
  group_norm_row_min_kernel<L, K><<<rows, kThreads, 0, stream>>>(xp, gp, bp, Ci, Gi, epsf)
  if (vector_load && cpg % 4 == 0 && lanes <= kWarpSize && (lanes & (lanes - 1)) == 0) {
    switch (lanes) {
      case 1: KH_LAUNCH(1, 0); break;
      case 2: KH_LAUNCH(2, 0); break;
      case 4: KH_LAUNCH(4, 0); break;
      case 8: KH_LAUNCH(8, 0); break;
      case 16: KH_LAUNCH(16, 0); break;
      default: KH_LAUNCH(32, 0); break;
    }
  } else if (vector_load && cpg % kChunk == 0 && cpg / kChunk <= kMaxWarpLoads) {
    switch (cpg / kChunk) {
      case 1: KH_LAUNCH(0, 1); break;
      case 2: KH_LAUNCH(0, 2); break;
      case 3: KH_LAUNCH(0, 3); break;
      case 4: KH_LAUNCH(0, 4); break;
      case 5: KH_LAUNCH(0, 5); break;
      default: KH_LAUNCH(0, 6); break;
    }
  } else {
    KH_LAUNCH(0, 0);
  }
#undef KH_LAUNCH
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  // Kernel 2: the (1, C, B, 1) output, written once with coalesced stores.
  const int per = vector_store ? 4 : 1;
  const dim3 grid(static_cast<unsigned int>((B + per * kBcastThreads - 1) / (per * kBcastThreads)),
                  static_cast<unsigned int>(C < kBcastChannelBlocks ? C : kBcastChannelBlocks));
  if (vector_store) {
    min_bias_broadcast_kernel<true><<<grid, kBcastThreads, 0, stream>>>(xp, biasp, op, Bi, Ci);
  } else {
    min_bias_broadcast_kernel<false><<<grid, kBcastThreads, 0, stream>>>(xp, biasp, op, Bi, Ci);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                             torch::Tensor bias, int64_t num_groups, double eps);
"""

_ext = load_inline(
    name="kh_ref_level2_75_gn_min_biasadd",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_epilogue"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, num_groups, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = torch.addmm(self.gemm.bias, x, self.gemm.weight.t())  # exactly what nn.Linear runs
        return _ext.fused_epilogue(y, self.group_norm.weight, self.group_norm.bias, self.bias,
                                   self.group_norm.num_groups, self.group_norm.eps)
