// CUDA backend: low-level building blocks shared by every kernel (sm_80+).
//   - element types (fp16 / bf16) and their packed conversions
//   - mma.sync m16n8k16 (fp32 accumulation), ldmatrix, cp.async wrappers (inline PTX)
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4, t = lane % 4:
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 8+2t..), a3 = (g+8, 8+2t..)
//   B (16x8, "col"):      b0 = (k = 2t..2t+1, n = g), b1 = (k = 8+2t.., n = g)
//   C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// A C fragment of two adjacent n-tiles is exactly an A fragment of the next product (P in P*V).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sinkattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T>
struct ElemTraits;

template <>
struct ElemTraits<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct ElemTraits<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16-byte global -> shared copy; `valid == false` writes 16 zero bytes and reads nothing (src-size 0), so
// masked / padded / out-of-sequence rows never bring their (possibly NaN) values into arithmetic (SPEC 2).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// *dst += (a, b) for two adjacent fp32 (8-byte aligned): one vector reduction on sm_90, two scalar ones before.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// Programmatic dependent launch (sm_90; no-ops before it, and in a grid launched without the attribute).
// pdl_wait: the thread waits until the grids this one was launched after (with
// cudaLaunchAttributeProgrammaticStreamSerialization, KernelChoice::pdl) have completed and their memory operations are
// visible; a kernel so launched calls it in every thread before its first access to what they wrote (or may still
// read). pdl_launch_dependents: this block lets the next grid, if it was launched so, start as soon as every block of
// this one has called it or exited (its blocks then wait in pdl_wait while this grid's last ones run).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// 2^x (ex2.approx: ~2 ulp, exact 0 for -inf).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Copies a tile of ROWS x HD elements (row stride `ld` elements in global memory) into shared memory with
// row stride HD + 8 (16-byte padding: ldmatrix rows land in distinct banks). Rows >= rows_valid and columns
// >= cols_valid (a multiple of 8) are zero-filled without being read.
// When NTHREADS is a multiple of the 16-byte chunks per row, each thread owns one fixed column chunk and a fixed
// set of rows (compile-time trip count, pointers advanced by a constant): no per-chunk division or 64-bit
// multiply in the mainloop. Otherwise a plain strided loop.
template <int ROWS, int HD, int NTHREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t ld, int rows_valid, int cols_valid,
                                                int tid) {
  constexpr int kChunks = HD / 8;
  constexpr int kStride = HD + 8;
  if constexpr (NTHREADS % kChunks == 0) {
    constexpr int kRowStep = NTHREADS / kChunks;  // rows covered by one pass of all threads
    const int cc = tid % kChunks, r0 = tid / kChunks;
    const bool col_ok = cc * 8 < cols_valid;
    const T* src = gmem + r0 * ld + cc * 8;
    T* dst = smem + r0 * kStride + cc * 8;
#pragma unroll
    for (int k = 0; k < (ROWS + kRowStep - 1) / kRowStep; ++k) {
      const int r = r0 + k * kRowStep;
      if (ROWS % kRowStep == 0 || r < ROWS) {
        const bool valid = col_ok && r < rows_valid;
        cp_async16(dst + k * kRowStep * kStride, valid ? src : gmem, valid);
      }
      src += kRowStep * ld;
    }
  } else {
#pragma unroll
    for (int idx = tid; idx < ROWS * kChunks; idx += NTHREADS) {
      const int r = idx / kChunks, cc = idx % kChunks;
      const bool valid = r < rows_valid && cc * 8 < cols_valid;
      const T* src = valid ? gmem + r * ld + cc * 8 : gmem;
      cp_async16(smem + r * kStride + cc * 8, src, valid);
    }
  }
}

}  // namespace sinkattn::cuda
