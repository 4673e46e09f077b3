# Gold reference solution on tensor cores (3xTF32): KernelBench level2/37 Matmul_Swish_Sum_GroupNorm.
#
# Design: matmul on TF32 tensor cores by the 3xTF32 split (two cuBLAS GEMMs, a split kernel and a sum kernel of
# ours) -> [sigmoid(x) * x -> + bias -> GroupNorm] in one CUDA kernel, copied unchanged from
# reference_solutions/level2_37_matmul_swish_sum_groupnorm.py
# (same element-wise math; in place on y, each group's statistics in registers, two passes, no atomics).
#
# 3xTF32. Each fp32 operand v is split as hi = tf32(v) (round to nearest even to 10 mantissa bits, integer
# arithmetic on its bits, so the 13 low bits are zero and the tensor core reads hi exactly) and
# lo = tf32(v - hi) (v - hi is exact in fp32); v = hi + lo to about 2^-22 |v|. Then
# x @ W^T = x_hi W_hi^T + x_hi W_lo^T + x_lo W_hi^T, less x_lo W_lo^T (~2^-22 of it, dropped). A product of two
# TF32 numbers is exact in fp32 and the tensor cores accumulate in fp32, so the operands carry fp32's own
# representation error (~2^-23 |v|); what remains is how the sums are rounded, which sets the design:
#   1. tf32_split_kernel: x' = [x_hi | x_lo] (M x 2K), on every call (x is new each call).
#   2. cross terms: one cublasGemmEx over 2K, [x_hi | x_lo] @ [W_lo | W_hi]^T = x_hi W_lo^T + x_lo W_hi^T -> y.
#   3. hi*hi in K-chunks of 256 (S = 4 here): one cublasGemmStridedBatchedEx whose batch s reads columns
#      [s*256, (s+1)*256) of x_hi and W_hi in place (ld 2K, batch stride 256) -> S partial products (S, M, N).
#   4. tf32x3_sum_kernel: y = ((P_0 + ... + P_(S-1)) + y) + b, fp32 adds rounded to nearest.
# Why chunks: tensor cores add each k-step's products into the fp32 accumulator with truncation (round toward
# zero: Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021, for V100/T4/A100; assumed for Hopper),
# an error of up to an ulp of the running sum per step, always toward zero, so it grows linearly with the
# number of steps, where the fp32 GEMM's round-to-nearest errors grow as their square root. With the model of
# tests/reference_solutions/test_tensor_core_numerics.py (k-steps of 4 or 8 products, 3 guard bits; 2048 outputs),
# one K = 8192 chain has 8-16x the fp32 GEMM's error, chunks of 512 summed in fp32 0.5-1x; K = 1024
# (level2/37): one chain 3-7x, chunks of 256 0.7-1.75x. The cross terms are ~2^-11 of y, so their single chain
# adds nothing visible. Why not ONE GEMM over [x_hi | x_hi | x_lo] @ [W_hi | W_lo | W_hi]^T (3K): it would add
# the cross terms one k-step at a time onto the large hi*hi running sum (three times the truncating steps at
# full magnitude) and hold 3x, not 2x, the weight.
# Cost: the work of three TF32 GEMMs (K + 2K); extra memory traffic: x' written and read, the S partial products
# written and read (S times the output), y read and written once more by the sum kernel.
# Here the output is 32768 x 4096 (537 MB), so each chunk costs about 0.36 ms of traffic at 3 TB/s; K_CHUNK
# trades that against the error (the sweep measures both).
# TF32 is selected by the compute type (CUBLAS_COMPUTE_32F_FAST_TF32) of these two calls alone, on PyTorch's
# cuBLAS handle for the current stream; the handle's math mode and torch.backends are not touched, so nothing
# global changes. cuBLAS resolves through libtorch_cuda (which links it), so no extra link flags.
# Cached: W' = [W_lo | W_hi] (N x 2K fp32, twice the weight), made by the same split kernel on the first forward
# and again whenever the weight changes: the key is the weight tensor's id, data_ptr, ._version, shape and device
# (an in-place copy_, as load_state_dict does, bumps ._version; .to() changes data_ptr). Nothing is derived in
# __init__: the harness copies fresh parameters in after construction. A write through `.data` bypasses the
# version counter and is not seen. Everything else (x', the partial products, y) is made on each call.
# Measured on an H100 through the harness: reference_solutions/results/tensor-cores-h100-604c6e0.json
# (`python3 benchmarks/tensor_core_solutions.py --no-sweep`); the chunk-length sweep has not run yet.

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>
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

// ---------------------------------------------------------------------------------------------
// 3xTF32: y = x @ W^T + b on TF32 tensor cores at fp32-level accuracy (see the header comment).
// ---------------------------------------------------------------------------------------------
constexpr int kSplitThreads = 256;
constexpr int kSumThreads = 256;
constexpr int kMaxChunks = 64;  // hi*hi partial products at most (K-chunks of the hi*hi GEMM)

// fp32 -> TF32 (8 exponent bits, 10 mantissa bits) by rounding to nearest, ties to even, on the bits; the
// 13 low mantissa bits come out zero, so the value is exactly what a TF32 tensor core reads (it truncates
// those bits itself: they must already be zero). Inf and NaN pass unchanged; a finite value above the
// largest TF32 rounds to Inf, as IEEE rounding does.
__device__ __forceinline__ float round_tf32(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t r = (u + 0x0fffu + ((u >> 13) & 1u)) & 0xffffe000u;
  return __uint_as_float((u & 0x7f800000u) == 0x7f800000u ? u : r);  // a select, no branch
}
// v = hi + lo + O(2^-22 |v|): hi = tf32(v), lo = tf32(v - hi); v - hi is exact in fp32 (Sterbenz). Where hi
// is not finite, lo = 0, so a NaN or Inf input gives what the fp32 product gives, not Inf - Inf.
__device__ __forceinline__ void split_tf32(float v, float& hi, float& lo) {
  hi = round_tf32(v);
  const float l = round_tf32(v - hi);
  lo = fabsf(hi) < INFINITY ? l : 0.f;
}

// dst (rows x 2K) = [hi | lo] (hi_off = 0, lo_off = K) or [lo | hi] (lo_off = 0, hi_off = K) of src
// (rows x K). A block per row (grid-stride over rows), threads along the row.
template <bool kVector>
__global__ void __launch_bounds__(kSplitThreads)
tf32_split_kernel(const float* __restrict__ src, float* __restrict__ dst, const int64_t rows, const int K,
                  const int hi_off, const int lo_off) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* s = src + r * K;
    float* d = dst + r * (2 * static_cast<int64_t>(K));
    if constexpr (kVector) {  // K % 4 == 0, 16-byte aligned rows
#pragma unroll 4
      for (int c = 4 * static_cast<int>(threadIdx.x); c < K; c += 4 * kSplitThreads) {
        const float4 v = __ldcs(reinterpret_cast<const float4*>(s + c));
        float4 hi, lo;
        split_tf32(v.x, hi.x, lo.x);
        split_tf32(v.y, hi.y, lo.y);
        split_tf32(v.z, hi.z, lo.z);
        split_tf32(v.w, hi.w, lo.w);
        __stwb(reinterpret_cast<float4*>(d + hi_off + c), hi);  // 16-byte stores, cached: the GEMMs read them next
        __stwb(reinterpret_cast<float4*>(d + lo_off + c), lo);
      }
    } else {
      for (int c = threadIdx.x; c < K; c += kSplitThreads) {
        float hi, lo;
        split_tf32(s[c], hi, lo);
        d[hi_off + c] = hi;
        d[lo_off + c] = lo;
      }
    }
  }
}

// y = ((P_0 + P_1 + ... + P_{S-1}) + y) + b[col], in fp32 with round-to-nearest adds, in this order:
// P_s (s < chunks, at parts + s * part_stride) are the hi*hi products of the K-chunks, y holds the cross
// terms. A block per row (grid-stride over rows), threads along the row. The partial products are read
// once (streaming loads); y stays cacheable for the epilogue kernel that reads it next.
template <bool kVector>
__global__ void __launch_bounds__(kSumThreads)
tf32x3_sum_kernel(float* y, const float* __restrict__ parts, const float* __restrict__ bias,
                  const int64_t rows, const int N, const int64_t part_stride, const int chunks) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t row = r * N;
    if constexpr (kVector) {  // N % 4 == 0, 16-byte aligned
      for (int c = 4 * static_cast<int>(threadIdx.x); c < N; c += 4 * kSumThreads) {
        const int64_t i = row + c;
        float4 t = __ldcs(reinterpret_cast<const float4*>(parts + i));
#pragma unroll 8
        for (int s = 1; s < chunks; ++s) {
          const float4 p = __ldcs(reinterpret_cast<const float4*>(parts + s * part_stride + i));
          t.x += p.x;
          t.y += p.y;
          t.z += p.z;
          t.w += p.w;
        }
        const float4 cross = *reinterpret_cast<const float4*>(y + i);
        const float4 b = __ldg(reinterpret_cast<const float4*>(bias + c));
        *reinterpret_cast<float4*>(y + i) = make_float4((t.x + cross.x) + b.x, (t.y + cross.y) + b.y,
                                                        (t.z + cross.z) + b.z, (t.w + cross.w) + b.w);
      }
    } else {
      for (int c = threadIdx.x; c < N; c += kSumThreads) {
        const int64_t i = row + c;
        float t = __ldcs(parts + i);
        for (int s = 1; s < chunks; ++s) t += __ldcs(parts + s * part_stride + i);
        y[i] = (t + y[i]) + __ldg(bias + c);
      }
    }
  }
}

inline bool tf32x3_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void tf32x3_check(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.is_cuda(), "tf32x3: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, "tf32x3: ", name, " must be float32");
  TORCH_CHECK(t.dim() == dim, "tf32x3: ", name, " must be ", dim, "-D, got ", t.dim(), "-D");
}

void cublas_check(cublasStatus_t status, const char* what) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "tf32x3: ", what, " failed: ", cublasGetStatusString(status));
}

unsigned int rows_grid(int64_t rows) {
  const int64_t most = 16 * static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  return static_cast<unsigned int>(rows < most ? rows : most);
}

// src (rows x K, contiguous) -> dst (rows x 2K): [hi | lo] if hi_first, else [lo | hi].
void launch_tf32_split(const torch::Tensor& src, torch::Tensor& dst, bool hi_first, cudaStream_t stream) {
  const int64_t rows = src.size(0);
  const int K = static_cast<int>(src.size(1));
  if (rows == 0 || K == 0) return;
  const int hi_off = hi_first ? 0 : K, lo_off = hi_first ? K : 0;
  const unsigned int grid = rows_grid(rows);
  if (K % 4 == 0 && tf32x3_aligned16(src.data_ptr()) && tf32x3_aligned16(dst.data_ptr())) {
    tf32_split_kernel<true><<<grid, kSplitThreads, 0, stream>>>(src.data_ptr<float>(), dst.data_ptr<float>(),
                                                               rows, K, hi_off, lo_off);
  } else {
    tf32_split_kernel<false><<<grid, kSplitThreads, 0, stream>>>(src.data_ptr<float>(), dst.data_ptr<float>(),
                                                                rows, K, hi_off, lo_off);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The number of K-chunks of the hi*hi GEMM: about K / k_chunk, at most kMaxChunks, and dividing K into
// chunks of a multiple of 4 floats (16-byte aligned batch offsets); 1 where no such split exists.
int64_t hi_chunks(int64_t K, int64_t k_chunk) {
  int64_t s = k_chunk > 0 ? K / k_chunk : 1;
  s = s < 1 ? 1 : (s > kMaxChunks ? kMaxChunks : s);
  while (s > 1 && (K % s != 0 || (K / s) % 4 != 0)) --s;
  return s;
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

// ---- 3xTF32 linear layer ----

// The TF32 split of a 2-D tensor w (rows x K): [lo | hi] per row (rows x 2K), the layout tf32x3_linear
// expects for the weight. Made once per weight version by the module (see ModelNew._weight_split).
torch::Tensor tf32_split(torch::Tensor w) {
  tf32x3_check(w, "weight", 2);
  const c10::cuda::CUDAGuard device_guard(w.device());
  const torch::Tensor src = w.contiguous();
  torch::Tensor out = torch::empty({src.size(0), 2 * src.size(1)}, src.options());
  launch_tf32_split(src, out, /*hi_first=*/false, at::cuda::getCurrentCUDAStream());
  return out;
}

// y = x @ W^T + b, where w_split = tf32_split(W) (N x 2K, [W_lo | W_hi] per row) and b has N entries:
//   x' = [x_hi | x_lo] (M x 2K);
//   y = x' @ w_split^T = x_hi W_lo^T + x_lo W_hi^T (cross terms: one GEMM over 2K);
//   P_s = x_hi[:, s c:(s+1) c] @ W_hi[:, s c:(s+1) c]^T for s < S, c = K / S (one strided-batched GEMM);
//   y = ((P_0 + ... + P_{S-1}) + y) + b.
// Both GEMMs run on TF32 tensor cores (compute type CUBLAS_COMPUTE_32F_FAST_TF32) with fp32 accumulation,
// on PyTorch's cuBLAS handle for the current stream (its workspace too); the handle's math mode is not
// touched: the compute type alone selects TF32, for these two calls only. Column-major view for cuBLAS:
// y^T (N x M, ld N) = op(A) op(B) with A = w_split as a (2K x N, ld 2K) matrix transposed and B = x' as a
// (2K x M, ld 2K) matrix.
torch::Tensor tf32x3_linear(torch::Tensor x, torch::Tensor w_split, torch::Tensor bias, int64_t k_chunk) {
  tf32x3_check(x, "x", 2);
  tf32x3_check(w_split, "w_split", 2);
  tf32x3_check(bias, "bias", 1);
  const int64_t M = x.size(0), K = x.size(1), N = w_split.size(0);
  TORCH_CHECK(w_split.size(1) == 2 * K, "tf32x3: w_split must be (out_features, 2 * in_features) = (", N,
              ", ", 2 * K, "), got ", w_split.sizes());
  TORCH_CHECK(bias.size(0) == N, "tf32x3: bias must have ", N, " elements, got ", bias.size(0));
  TORCH_CHECK(K > 0, "tf32x3: in_features must be positive");
  TORCH_CHECK(M <= INT32_MAX && N <= INT32_MAX && 2 * K <= INT32_MAX, "tf32x3: sizes too large for cuBLAS");
  TORCH_CHECK(w_split.device() == x.device() && bias.device() == x.device(),
              "tf32x3: all tensors must be on one device");
  const c10::cuda::CUDAGuard device_guard(x.device());
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const torch::Tensor xc = x.contiguous();
  const torch::Tensor wc = w_split.contiguous();
  const torch::Tensor bc = bias.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  torch::Tensor xs = torch::empty({M, 2 * K}, x.options());
  launch_tf32_split(xc, xs, /*hi_first=*/true, stream);

  const int64_t S = hi_chunks(K, k_chunk);
  const int64_t c = K / S;
  torch::Tensor parts = torch::empty({S, M, N}, x.options());

  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // bound to `stream`
  const float one = 1.f, zero = 0.f;
  const int m = static_cast<int>(N), n = static_cast<int>(M), ld = static_cast<int>(2 * K);
  const float* w = wc.data_ptr<float>();
  const float* xp = xs.data_ptr<float>();
  cublas_check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, ld, &one, w, CUDA_R_32F, ld, xp,
                            CUDA_R_32F, ld, &zero, y.data_ptr<float>(), CUDA_R_32F, m,
                            CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (cross terms)");
  cublas_check(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, static_cast<int>(c), &one,
                                          w + K, CUDA_R_32F, ld, c, xp, CUDA_R_32F, ld, c, &zero,
                                          parts.data_ptr<float>(), CUDA_R_32F, m, M * N,
                                          static_cast<int>(S), CUBLAS_COMPUTE_32F_FAST_TF32,
                                          CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx (hi*hi chunks)");

  const unsigned int grid = rows_grid(M);
  const int Ni = static_cast<int>(N), Si = static_cast<int>(S);
  if (N % 4 == 0 && tf32x3_aligned16(y.data_ptr()) && tf32x3_aligned16(parts.data_ptr()) &&
      tf32x3_aligned16(bc.data_ptr())) {
    tf32x3_sum_kernel<true><<<grid, kSumThreads, 0, stream>>>(y.data_ptr<float>(), parts.data_ptr<float>(),
                                                             bc.data_ptr<float>(), M, Ni, M * N, Si);
  } else {
    tf32x3_sum_kernel<false><<<grid, kSumThreads, 0, stream>>>(y.data_ptr<float>(), parts.data_ptr<float>(),
                                                              bc.data_ptr<float>(), M, Ni, M * N, Si);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
"""

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor fused_epilogue(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta,
                             torch::Tensor bias,
                             int64_t num_groups, double eps);
torch::Tensor tf32_split(torch::Tensor w);
torch::Tensor tf32x3_linear(torch::Tensor x, torch::Tensor w_split, torch::Tensor bias,
                            int64_t k_chunk);
"""

_ext = load_inline(
    name="kh_tc_level2_37_3xtf32_swish_bias_gn",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["fused_epilogue", "tf32_split", "tf32x3_linear"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)

# hi*hi K-chunk length (the header says why; benchmarks/tensor_core_solutions.py --sweep measures it).
K_CHUNK = 256


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, num_groups, bias_shape):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.k_chunk = K_CHUNK
        self._w_split = None  # [W_lo | W_hi], made on first use: see _weight_split
        self._w_split_key = None

    def _weight_split(self):
        """The weight's TF32 split, remade whenever the weight changed since it was made."""
        w = self.matmul.weight
        key = (id(w), w.data_ptr(), w._version, tuple(w.shape), w.device)
        if key != self._w_split_key:
            self._w_split = _ext.tf32_split(w.detach())
            self._w_split_key = key
        return self._w_split

    def forward(self, x):
        y = _ext.tf32x3_linear(x, self._weight_split(), self.matmul.bias, self.k_chunk)
        # In place: overwrites y (owned here) and returns it; no second output allocation.
        return _ext.fused_epilogue(y, self.group_norm.weight, self.group_norm.bias, self.bias,
                                   self.group_norm.num_groups, self.group_norm.eps)
