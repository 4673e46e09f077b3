# Gold reference solution: KernelBench level2/37 Matmul_Swish_Sum_GroupNorm.
#
# Design: matmul (cuBLAS addmm) -> [sigmoid(x) * x -> + bias -> GroupNorm] in one CUDA kernel (the
# activation comes before the statistics).
# The GEMM stays fp32-exact: torch.addmm(linear.bias, x, weight.t()) is the very call nn.Linear makes,
# so its output is bit-identical to the reference's (no TF32, torch.backends untouched). The fused
# kernel works IN PLACE on the GEMM output (a temporary the forward owns), so a forward allocates
# nothing besides it: it reads every element once into registers (16-byte float4 streaming loads)
# and overwrites it once (streaming stores) after its group's statistics are known; the warp that
# owns a group is the only one to touch it, so no thread reads an already overwritten value. Each
# group's mean and biased variance are accumulated in fp32 by two passes over registers (mean, then
# centred sum of squares) with warp-shuffle reductions (no shared memory, no atomics).
#   * channels per group (cpg) in {4, 8, ..., 128}: persistent grid (as many 256-thread blocks as
#     are resident at once, <= 64 registers so 4 per SM); each warp walks 512-float tiles with a
#     grid stride, and loads its next tile (4 float4s per lane) before it computes and stores the
#     current one, so loads stay in flight while it computes; each group is held by an aligned
#     segment of cpg/4 lanes and reduced with segmented shuffles; channel indices advance by a
#     fixed step per tile (no per-tile modulo).
#   * cpg = 128*k, k <= 8: one warp per (row, group), all k float4s per lane loaded before use.
#   * anything else (cpg not a multiple of 4, other sizes, unaligned pointers): a scalar fallback,
#     one warp per (row, group), three passes over the group (writes only in the last).
# Element-wise math follows PyTorch's CUDA kernels (expf/tanhf/log1pf/rsqrtf, IEEE division, no
# --use_fast_math; products that PyTorch rounds separately are not contracted into FMAs).
# Measured (H100 80GB HBM3, torch 2.11.0+cu130; reference_solutions/RESULTS.md has the tables and commands):
# 6.05 ms against 5.47 ms for the bare addmm (floor fraction 0.904), 1.42x eager, 1.03x torch.compile
# max-autotune. This problem misses the 0.95 bar, and no epilogue run after the GEMM can meet it: the
# output is 32768 x 4096 fp32 (537 MB), so reading and writing it once costs 0.357 ms at the measured
# 3.00 TB/s, 6.5% of the GEMM, capping the floor fraction at 0.939. Running the GEMM and this kernel in
# row chunks so the epilogue finds its chunk in L2 was measured too (benchmarks/chunk_probe37.py): the
# best chunking (8192 rows) gave 5.92 ms against 6.04 ms unchunked in the same run (0.945 of that run's
# addmm), within run-to-run noise, so it is not shipped. Meeting the bar needs the GroupNorm statistics
# in the GEMM's own epilogue (an fp32 GEMM of our own at cuBLAS speed), which this solution does not do.

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
constexpr int kSegLoads = 4;             // float4s per lane per tile (segmented kernel)
constexpr int kTile = kChunk * kSegLoads;  // floats per warp tile (segmented kernel): 2 KB
constexpr int kSegBlocksPerSm = 4;       // segmented kernel: <= 64 registers, 32 warps per SM
constexpr int kMaxWarpLoads = 8;         // register path up to kChunk * 8 = 1024 channels per group

// Per-channel parameters (never written): read-only path.
__device__ __forceinline__ float4 load4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}
// The data (updated in place): coherent streaming load/store, evict-first (ld/st.global.cs).
__device__ __forceinline__ float4 load4_stream(const float* p) {
  return __ldcs(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ void store4_stream(float* p, const float4& v) {
  __stcs(reinterpret_cast<float4*>(p), v);
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
// torch.sigmoid(x) * x, rounded as PyTorch rounds it: 1 / (1 + exp(-x)), then the product.
__device__ __forceinline__ float kh_swish(float v) { return __fmul_rn(1.f / (1.f + expf(-v)), v); }

struct Epilogue {
  const float* __restrict__ bias;
  // swish, then + bias (the product is rounded before the add: no FMA contraction).
  __device__ __forceinline__ float pre1(float v, int c) const { return kh_swish(v) + __ldg(bias + c); }
  __device__ __forceinline__ float4 pre4(const float4& v, int c) const {
    const float4 b = load4(bias + c);
    return make_float4(kh_swish(v.x) + b.x, kh_swish(v.y) + b.y, kh_swish(v.z) + b.z,
                       kh_swish(v.w) + b.w);
  }
  __device__ __forceinline__ float post1(float v, int) const { return v; }
  __device__ __forceinline__ float4 post4(const float4& v, int) const { return v; }
};

// ---------------------------------------------------------------------------------------------
// All three kernels update the GEMM output IN PLACE (data is read and written through one
// pointer). Every element is loaded exactly once and stored exactly once, both by the same thread,
// and a thread stores an element only after the statistics of its group, which need every element
// of the group, are known, i.e. after the whole group has been loaded into registers (or, in the
// fallback, re-read) by the warp that owns it; no other warp touches that group. So no thread can
// read a value another thread already overwrote. The data is accessed with coherent streaming
// loads/stores (ld/st.global.cs: read once, written once, evict-first), never through the
// read-only (__ldg) path, which requires data that is not written during the kernel.
// ---------------------------------------------------------------------------------------------

// Kernel 1 (channels per group cpg = 4 * kLanes <= 128, kLanes a power of two): the flattened
// (N*C) tensor is a sequence of tiles of kTile = 512 floats; lane l holds float4 number l of each
// of the tile's kSegLoads 128-float chunks, so a group (cpg consecutive floats, cpg | 128) is held
// by an aligned segment of kLanes lanes and its sums are segmented shuffle reductions. Because
// total and every chunk start are multiples of cpg, a segment is either wholly in range or wholly
// out of it. Persistent grid (as many blocks as fit on the GPU at once): warp w processes tiles
// w, w + W, w + 2W, ... (W = number of warps), and loads tile t + W into registers before it
// computes and stores tile t, so every warp always has 2 KB of loads in flight while it computes
// (tile t + W belongs to this warp alone, so the prefetch cannot see a stored value). The channel
// of a lane's first element advances by a fixed step per tile (no per-tile 64-bit modulo).
template <int kLanes, class Epi>
__global__ void __launch_bounds__(kThreads, kSegBlocksPerSm)
group_norm_segmented_kernel(float* data, const float* __restrict__ gamma,
                            const float* __restrict__ beta, const Epi epi, const int64_t total,
                            const int C, const float inv_cpg, const float eps) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int64_t num_tiles = (total + kTile - 1) / kTile;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;  // tiles per step
  int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (tile >= num_tiles) return;  // warp-uniform
  // Channel of this lane's first element in its current tile, and its advance per step.
  int ch0 = static_cast<int>((tile * kTile + 4 * lane) % C);
  const int step = static_cast<int>((stride * kTile) % C);

  float4 cur[kSegLoads];
#pragma unroll
  for (int i = 0; i < kSegLoads; ++i) {
    const int64_t idx = tile * kTile + i * kChunk + 4 * lane;
    cur[i] = idx < total ? load4_stream(data + idx) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (; tile < num_tiles; tile += stride) {  // warp-uniform
    const int64_t base = tile * kTile + 4 * lane;
    // Prefetch the next tile of this warp before touching the current one.
    const int64_t next = base + stride * kTile;
    float4 nxt[kSegLoads];
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) {
      const int64_t idx = next + i * kChunk;
      nxt[i] = idx < total ? load4_stream(data + idx) : make_float4(0.f, 0.f, 0.f, 0.f);
    }

    bool ok[kSegLoads];
    int ch[kSegLoads];
    ch[0] = ch0;
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) {
      if (i > 0) {
        int c = ch[i - 1] + kChunk;
        while (c >= C) c -= C;  // at most once when C >= 128
        ch[i] = c;
      }
      ok[i] = base + i * kChunk < total;
      if (ok[i]) cur[i] = epi.pre4(cur[i], ch[i]);
    }

    float mean[kSegLoads], rstd[kSegLoads];
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) mean[i] = sum4(cur[i]);
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) mean[i] = segment_sum<kLanes>(mean[i]) * inv_cpg;
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) rstd[i] = sqdev4(cur[i], mean[i]);
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i)
      rstd[i] = rsqrtf(segment_sum<kLanes>(rstd[i]) * inv_cpg + eps);

#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) {
      if (!ok[i]) continue;
      const float4 o = norm4(cur[i], mean[i], rstd[i], load4(gamma + ch[i]), load4(beta + ch[i]));
      store4_stream(data + base + i * kChunk, epi.post4(o, ch[i]));
    }
#pragma unroll
    for (int i = 0; i < kSegLoads; ++i) cur[i] = nxt[i];
    ch0 += step;
    if (ch0 >= C) ch0 -= C;
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2 (cpg = 128 * kLoads, kLoads <= 8): one warp per (row, group); lane l loads float4s
// l, l + 32, ... of the group into registers (all kLoads loads in flight before the first use);
// full-warp shuffle reductions; two passes over the registers (mean, then centred sum of
// squares); then the group is stored in place.
// ---------------------------------------------------------------------------------------------
template <int kLoads, class Epi>
__global__ void __launch_bounds__(kThreads)
group_norm_warp_kernel(float* data, const float* __restrict__ gamma,
                       const float* __restrict__ beta, const Epi epi,
                       const int64_t num_row_groups, const int G, const float eps) {
  constexpr int kCpg = kChunk * kLoads;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int64_t rg = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  if (rg >= num_row_groups) return;  // warp-uniform
  const int64_t base = rg * kCpg + 4 * lane;
  const int c0 = static_cast<int>(rg % G) * kCpg + 4 * lane;

  float4 v[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) v[k] = load4_stream(data + base + k * kChunk);
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
    store4_stream(data + base + k * kChunk, epi.post4(o, c));
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 3 (fallback for any cpg, or unaligned pointers): one warp per (row, group), scalar
// accesses, three passes over the group (sum, centred sum of squares, write). The first two passes
// only read; the shuffle reduction that ends pass two is a warp-wide barrier, so every lane has
// finished reading before any lane writes; in pass three each lane re-reads and then overwrites
// only its own elements.
// ---------------------------------------------------------------------------------------------
template <class Epi>
__global__ void __launch_bounds__(kThreads)
group_norm_generic_kernel(float* data, const float* __restrict__ gamma,
                          const float* __restrict__ beta, const Epi epi,
                          const int64_t num_row_groups, const int G, const int cpg,
                          const float eps) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int64_t rg = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  if (rg >= num_row_groups) return;  // warp-uniform
  float* g = data + rg * cpg;
  const int c0 = static_cast<int>(rg % G) * cpg;

  float s = 0.f;
  for (int j = lane; j < cpg; j += kWarpSize) s += epi.pre1(g[j], c0 + j);
  const float mean = segment_sum<kWarpSize>(s) / static_cast<float>(cpg);
  float q = 0.f;
  for (int j = lane; j < cpg; j += kWarpSize) {
    const float d = epi.pre1(g[j], c0 + j) - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(segment_sum<kWarpSize>(q) / static_cast<float>(cpg) + eps);
  for (int j = lane; j < cpg; j += kWarpSize) {
    const int c = c0 + j;
    const float o = norm1(epi.pre1(g[j], c), mean, rstd, __ldg(gamma + c), __ldg(beta + c));
    g[j] = epi.post1(o, c);
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned int grid_for_warps(int64_t warps) {
  const int64_t blocks = ceil_div(warps, kWarpsPerBlock);
  TORCH_CHECK(blocks <= INT32_MAX, "fused_epilogue: tensor too large (", blocks, " blocks)");
  return static_cast<unsigned int>(blocks);
}

// Blocks of a persistent kernel: as many as are resident on the current device at once (queried
// once per kernel and device), never more than there is work for.
template <class Kernel>
unsigned int persistent_grid(Kernel kernel, int64_t warps_of_work) {
  constexpr int kMaxDevices = 64;
  static int blocks_per_sm[kMaxDevices] = {};
  const int dev = c10::cuda::current_device();
  int per_sm = dev < kMaxDevices ? blocks_per_sm[dev] : 0;
  if (per_sm == 0) {
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    per_sm = per_sm > 0 ? per_sm : 1;
    if (dev < kMaxDevices) blocks_per_sm[dev] = per_sm;
  }
  const int64_t resident =
      static_cast<int64_t>(per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t needed = ceil_div(warps_of_work, kWarpsPerBlock);
  return static_cast<unsigned int>(needed < resident ? needed : resident);
}

template <class Epi>
void launch_group_norm(float* data, const float* gamma, const float* beta, const Epi& epi,
                       int64_t N, int64_t C, int64_t G, float eps, bool vector_ok,
                       cudaStream_t stream) {
  const int64_t cpg = C / G;
  const int64_t total = N * C;
  const int64_t row_groups = N * G;
  const int64_t lanes = cpg / 4;
  if (vector_ok && cpg % 4 == 0 && lanes <= kWarpSize && (lanes & (lanes - 1)) == 0) {
    const int64_t tiles = ceil_div(total, kTile);
    const float inv_cpg = 1.f / static_cast<float>(cpg);
#define KH_SEG(L)                                                                              \
  case L: {                                                                                    \
    const unsigned int grid = persistent_grid(group_norm_segmented_kernel<L, Epi>, tiles);     \
    group_norm_segmented_kernel<L, Epi><<<grid, kThreads, 0, stream>>>(                        \
        data, gamma, beta, epi, total, static_cast<int>(C), inv_cpg, eps);                     \
    break;                                                                                     \
  }
    switch (lanes) { KH_SEG(1) KH_SEG(2) KH_SEG(4) KH_SEG(8) KH_SEG(16) KH_SEG(32) }
#undef KH_SEG
  } else if (vector_ok && cpg % kChunk == 0 && cpg / kChunk <= kMaxWarpLoads) {
    const unsigned int grid = grid_for_warps(row_groups);
#define KH_WARP(K)                                                                             \
  case K:                                                                                      \
    group_norm_warp_kernel<K, Epi><<<grid, kThreads, 0, stream>>>(                             \
        data, gamma, beta, epi, row_groups, static_cast<int>(G), eps);                         \
    break;
    switch (cpg / kChunk) {
      KH_WARP(1) KH_WARP(2) KH_WARP(3) KH_WARP(4) KH_WARP(5) KH_WARP(6) KH_WARP(7) KH_WARP(8)
    }
#undef KH_WARP
  } else {
    const unsigned int grid = grid_for_warps(row_groups);
    group_norm_generic_kernel<Epi><<<grid, kThreads, 0, stream>>>(
        data, gamma, beta, epi, row_groups, static_cast<int>(G), static_cast<int>(cpg), eps);
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
                             torch::Tensor bias,
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
  check_channel_param(bias, "bias", x, C);
  const c10::cuda::CUDAGuard device_guard(x.device());
  // In place: x (the GEMM output, a temporary the caller owns) is overwritten by the result.
  // Detached so that the result never carries the GEMM's autograd history.
  torch::Tensor y = x.requires_grad() ? x.detach() : x;
  if (y.numel() == 0) return y;
  const bool vector_ok = aligned16(x.data_ptr()) &&
                         aligned16(gamma.data_ptr()) && aligned16(beta.data_ptr()) &&
                         aligned16(bias.data_ptr());
  const Epilogue epi{bias.data_ptr<float>()};
  launch_group_norm(x.data_ptr<float>(), gamma.data_ptr<float>(),
                    beta.data_ptr<float>(), epi, N, C, num_groups, static_cast<float>(eps), vector_ok,
                    at::cuda::getCurrentCUDAStream());
  return y;
}
"""

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                             torch::Tensor bias,
                             int64_t num_groups, double eps);
"""

_ext = load_inline(
    name="kh_ref_level2_37_swish_bias_gn",
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
        self.matmul = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        y = torch.addmm(self.matmul.bias, x, self.matmul.weight.t())  # exactly what nn.Linear runs
        # In place: overwrites y (owned here) and returns it; no second output allocation.
        return _ext.fused_epilogue(y, self.group_norm.weight, self.group_norm.bias, self.bias,
                                   self.group_norm.num_groups, self.group_norm.eps)
