// sinkattn_clear_unowned_rows on device memory (core/unowned_rows.hpp, SPEC.md section 1): one grid-stride kernel
// over at most three regions (out + softmax_lse, or dq + dk + dv); each block reads the region's first row
// (cu_seqlens[b]) from device memory itself, so nothing synchronises and the call can be captured into a graph.
#include <cuda_runtime.h>

#include <string>

#include "core/backend.hpp"
#include "core/unowned_rows.hpp"

namespace sinkattn {
namespace {

constexpr int kMaxRegions = 3;
struct Regions {
  UnownedRegion r[kMaxRegions];
  int count;
};

__global__ void clear_unowned_kernel(const Regions rs) {
  for (int k = 0; k < rs.count; ++k) {
    const UnownedRegion& r = rs.r[k];
    const int64_t first = *r.first_row;
    const int64_t total = unowned_elements(r, first);
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x)
      fill_unowned_element(r, first, e);
  }
}

}  // namespace

Status cuda_clear_unowned_rows(const UnownedRegion* regions, int count, void* stream) {
  if (count <= 0) return Status::ok();
  if (count > kMaxRegions) return internal_error("clear_unowned_rows: too many regions");
  Regions rs{};
  int64_t most = 0;
  for (int k = 0; k < count; ++k) {
    rs.r[k] = regions[k];
    most = std::max<int64_t>(most, regions[k].rows * regions[k].heads * regions[k].cols);
  }
  rs.count = count;
  if (most == 0) return Status::ok();
  const int64_t blocks = std::min<int64_t>((most + 255) / 256, 1024);
  clear_unowned_kernel<<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(rs);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return Status{SINKATTN_ERR_DEVICE, std::string("cuda: clear_unowned_rows kernel: ") + cudaGetErrorName(e)};
  return Status::ok();
}

}  // namespace sinkattn
