// Page layouts for the paged-KV tests (tests/test_paged.cpp, tests/gpu/gpu_decode.cpp): which pool page holds
// each sequence's keys (SPEC.md section 1), as a shuffled pool with unreferenced pages, optionally a common prefix
// (sequence 1 starts with sequence 0's whole pages, as prefix caching shares them), and the page table
// [b, max_pages] with garbage (negative or far out of range) in every entry past a sequence's last page, which no
// backend may read. Plain C++ (no GoogleTest): the GPU suite includes it too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace sinkattn::test {

struct PageLayout {
  int64_t page_size = 1, num_pages = 0, max_pages = 0;
  std::vector<std::vector<int32_t>> pages;  // per sequence: its pages in order
  std::vector<int32_t> table;               // [b, max_pages], row-major
  // Pool row (page * page_size + row in page) of key j of sequence n.
  int64_t slot(int64_t n, int64_t j) const { return int64_t{pages[n][j / page_size]} * page_size + j % page_size; }
  int64_t capacity() const { return max_pages * page_size; }
};

inline PageLayout make_page_layout(const std::vector<int32_t>& seqused, int64_t page_size, bool share_prefix,
                                   int64_t extra_pages, int64_t extra_cols, std::mt19937_64& rng) {
  PageLayout L;
  L.page_size = page_size;
  const int64_t b = static_cast<int64_t>(seqused.size());
  int64_t longest = 0, needed = 0, shared = 0;
  for (int32_t u : seqused) {
    longest = std::max<int64_t>(longest, u);
    needed += (u + page_size - 1) / page_size;
  }
  if (share_prefix && b >= 2) shared = std::min(seqused[0], seqused[1]) / page_size;
  L.max_pages = (longest + page_size - 1) / page_size + extra_cols;
  L.num_pages = needed - shared + extra_pages;
  std::vector<int32_t> perm(static_cast<size_t>(L.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  L.pages.resize(static_cast<size_t>(b));
  for (int64_t n = 0; n < b; ++n)
    for (int64_t pg = 0; pg < (seqused[n] + page_size - 1) / page_size; ++pg)
      L.pages[n].push_back(n == 1 && pg < shared ? L.pages[0][pg] : perm[next++]);
  const int32_t garbage[] = {-1, -2147483647, 2147483647, static_cast<int32_t>(L.num_pages), 1 << 28};
  L.table.resize(static_cast<size_t>(b * L.max_pages));
  for (int64_t n = 0; n < b; ++n)
    for (int64_t pg = 0; pg < L.max_pages; ++pg)
      L.table[n * L.max_pages + pg] =
          pg < static_cast<int64_t>(L.pages[n].size()) ? L.pages[n][pg] : garbage[(n + pg) % 5];
  return L;
}

}  // namespace sinkattn::test
