// The shared definitions of src/common (mask, window clamp, sequence bounds, row addressing) against brute force,
// and the fixed dq order of the deterministic Hopper backward (src/cuda/dq_order.hpp): every key block that sees a
// query block takes exactly one turn, the turns are the key blocks in ascending order, and the kernel's sequence of
// waits and releases cannot deadlock for any number of resident blocks (simulated with random interleavings).
// Host-only: the headers are compiled by the C++ compiler (SINKATTN_HD = inline); the kernels include the same ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/mask.hpp"
#include "common/rows.hpp"
#include "common/seq.hpp"
#include "core/kv_rows.hpp"
#include "cuda/dq_order.hpp"
#include "cuda/hopper/handover.hpp"
#include "cuda/scheduler.hpp"
#include "cuda/tiles.hpp"

namespace sinkattn {
namespace {

// SPEC.md section 2, written out directly.
// 128-bit arithmetic: windows up to INT64_MAX (the C ABI allows them) do not overflow here.
bool spec_visible(bool br, int64_t wl, int64_t wr, int64_t lq, int64_t lk, int64_t i, int64_t j) {
  const __int128 off = br ? lk - lq : 0;
  if (i < 0 || i >= lq || j < 0 || j >= lk) return false;
  if (wl >= 0 && j < i + off - wl) return false;
  if (wr >= 0 && j > i + off + wr) return false;
  return true;
}

struct MaskCase {
  bool br;
  int64_t wl, wr, lq, lk;
};

MaskCase random_case(std::mt19937_64& r, int64_t cap) {
  auto U = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(r); };
  MaskCase m;
  m.br = U(0, 1) == 1;
  m.lq = U(0, cap);
  m.lk = U(0, cap);
  const int w = static_cast<int>(U(0, 5));
  m.wl = w == 0 ? -1 : w == 1 ? 0 : U(0, cap);
  m.wr = w == 2 ? -1 : w == 3 ? 0 : U(0, cap);
  if (w == 4) m.wl = m.wr = -1;
  return m;
}

TEST(CommonMask, RangesMatchSpec) {
  std::mt19937_64 r(11);
  for (int iter = 0; iter < 400; ++iter) {
    const MaskCase m = random_case(r, 90);
    const BandMask<int64_t> mk(m.br, m.wl, m.wr, m.lq, m.lk);
    const BandMask<int> mk32(m.br, static_cast<int>(m.wl), static_cast<int>(m.wr), static_cast<int>(m.lq),
                             static_cast<int>(m.lk));
    for (int64_t i = 0; i < m.lq; ++i)
      for (int64_t j = 0; j < m.lk; ++j)
        ASSERT_EQ(mk.visible(i, j), spec_visible(m.br, m.wl, m.wr, m.lq, m.lk, i, j)) << i << " " << j;
    // Row blocks and key blocks of a few sizes: the ranges are exactly the union of the visible pairs, and
    // contiguous (every index in between is seen by the block). by_rows: [b0, b1) are rows, the range is of keys.
    const auto check = [&](bool by_rows, int64_t b0, int64_t b1, int64_t lo, int64_t hi) {
      const int64_t other = by_rows ? m.lk : m.lq;
      const auto vis = [&](int64_t x, int64_t y) {
        return spec_visible(m.br, m.wl, m.wr, m.lq, m.lk, by_rows ? x : y, by_rows ? y : x);
      };
      int64_t elo = INT64_MAX, ehi = INT64_MIN;
      for (int64_t x = b0; x < b1; ++x)
        for (int64_t y = 0; y < other; ++y)
          if (vis(x, y)) elo = std::min(elo, y), ehi = std::max(ehi, y + 1);
      if (elo == INT64_MAX) {
        ASSERT_GE(lo, hi) << "nothing visible, but a non-empty range";
        return;
      }
      ASSERT_EQ(lo, elo);
      ASSERT_EQ(hi, ehi);
      for (int64_t y = lo; y < hi; ++y) {
        bool any = false;
        for (int64_t x = b0; x < b1; ++x) any = any || vis(x, y);
        ASSERT_TRUE(any);
      }
    };
    for (int64_t bs : {1, 7, 16, 64}) {
      for (int64_t i0 = 0; i0 < m.lq; i0 += bs) {
        const int64_t i1 = std::min(i0 + bs, m.lq);
        int64_t lo, hi;
        mk.key_range(i0, i1, lo, hi);
        check(true, i0, i1, lo, hi);
        int lo32, hi32;
        mk32.key_range(static_cast<int>(i0), static_cast<int>(i1), lo32, hi32);
        ASSERT_EQ(lo32, lo);
        ASSERT_EQ(hi32, hi);
      }
      for (int64_t j0 = 0; j0 < m.lk; j0 += bs) {
        int64_t lo, hi;
        mk.query_range(j0, std::min(j0 + bs, m.lk), lo, hi);
        check(false, j0, std::min(j0 + bs, m.lk), lo, hi);
      }
    }
    // tile_all_visible: true exactly when every pair of the tile is visible (rows inside len_q).
    for (int64_t i0 = 0; i0 < m.lq; i0 += 16)
      for (int64_t j0 = 0; j0 < m.lk + 16; j0 += 16) {
        const int64_t bm = std::min<int64_t>(16, m.lq - i0);
        bool all = true;
        for (int64_t i = i0; i < i0 + bm; ++i)
          for (int64_t j = j0; j < j0 + 16; ++j) all = all && spec_visible(m.br, m.wl, m.wr, m.lq, m.lk, i, j);
        ASSERT_EQ(mk.tile_all_visible(i0, bm, j0, 16), all) << i0 << " " << j0;
      }
  }
}

TEST(CommonMask, WindowClampChangesNothing) {
  std::mt19937_64 r(12);
  for (int iter = 0; iter < 300; ++iter) {
    MaskCase m = random_case(r, 60);
    const int64_t s_q = m.lq + std::uniform_int_distribution<int64_t>(0, 5)(r);
    const int64_t s_kv = m.lk + std::uniform_int_distribution<int64_t>(0, 5)(r);
    // Huge windows (up to the int64 range of the C ABI) and windows around the cap.
    const int64_t huge[] = {s_q + s_kv - 1, s_q + s_kv, s_q + s_kv + 1, int64_t(1) << 40, INT64_MAX};
    const int64_t wl = std::uniform_int_distribution<int>(0, 1)(r) ? huge[iter % 5] : m.wl;
    const int64_t wr = std::uniform_int_distribution<int>(0, 1)(r) ? huge[(iter / 5) % 5] : m.wr;
    const int64_t cl = clamp_window(wl, s_q, s_kv), cr = clamp_window(wr, s_q, s_kv);
    ASSERT_LE(cl, s_q + s_kv);
    ASSERT_LE(cr, s_q + s_kv);
    ASSERT_EQ(cl < 0, wl < 0);
    ASSERT_EQ(cr < 0, wr < 0);
    for (int64_t i = 0; i < m.lq; ++i)
      for (int64_t j = 0; j < m.lk; ++j)
        ASSERT_EQ(spec_visible(m.br, cl, cr, m.lq, m.lk, i, j), spec_visible(m.br, wl, wr, m.lq, m.lk, i, j));
  }
  EXPECT_EQ(clamp_window(-5, 10, 10), -1);
  EXPECT_EQ(clamp_window(3, 10, 10), 3);
}

TEST(CommonSeq, BoundsAndClamp) {
  const int32_t cu_q[] = {0, 3, 3, 10}, cu_kv[] = {0, 5, 9, 9}, used[] = {4, 2, 0};
  BatchTensors bt;
  bt.varlen = 1;
  bt.cu_seqlens_q = cu_q;
  bt.cu_seqlens_kv = cu_kv;
  bt.seqused_kv = used;
  bt.cu_q_st = bt.cu_kv_st = bt.seqused_st = 1;
  bt.s_q = 7;
  bt.s_kv = 5;
  const SeqSpan<int64_t> s1 = seq_span<int64_t>(bt, 1);
  EXPECT_EQ(s1.q_start, 3);
  EXPECT_EQ(s1.kv_start, 5);
  EXPECT_EQ(s1.len_q, 0);
  EXPECT_EQ(s1.rows_kv, 4);
  EXPECT_EQ(s1.len_kv, 2);
  const SeqSpan<int> s2 = seq_span<int>(bt, 2);
  EXPECT_EQ(s2.len_q, 7);
  EXPECT_EQ(s2.rows_kv, 0);
  EXPECT_EQ(s2.len_kv, 0);
  // A sequence longer than max_seqlen (the contract broken): clamp_to_extents keeps it inside the grid.
  BatchTensors bt2 = bt;
  bt2.s_q = bt2.s_kv = 5;
  const SeqSpan<int64_t> c = clamp_to_extents(seq_span<int64_t>(bt2, 2), int64_t(5), int64_t(5));
  EXPECT_EQ(c.rows_q, 5);
  EXPECT_EQ(c.len_q, 5);
  BatchTensors dense;
  const int32_t lq[] = {2, 9};
  dense.seqlens_q = lq;
  dense.seqlens_q_st = 1;
  dense.s_q = 6;
  dense.s_kv = 4;
  const SeqSpan<int64_t> d1 = seq_span<int64_t>(dense, 1);
  EXPECT_EQ(d1.len_q, 6);  // capped by the rows it indexes
  EXPECT_EQ(d1.rows_q, 6);
  EXPECT_EQ(d1.len_kv, 4);
  EXPECT_EQ(seq_span<int64_t>(dense, 0).len_q, 2);
  RowStrides st{1000, 10, 3};
  EXPECT_EQ(row_offset(st, 2, 5, 1), 2053);
  EXPECT_EQ(lse_offset(100, 20, 1, 1, 2, 7), 147);
}

// ---- the deterministic dq order of the Hopper dK dV kernel ----

// Both query-block heights of the kernel: 64, and 128 (tile 64 without bias / dropout).
constexpr int kBN = cuda::tiles::dkdv_sm90_block_n(64);
static_assert(cuda::tiles::dkdv_sm90_block_m(64, false) == 64 && cuda::tiles::dkdv_sm90_block_m(64, true) == 128,
              "the heights simulated below");

// One sequence of a call: its lengths and mask.
struct Seq {
  int len_q, len_kv, rows_kv;
};

// The events of one block of the kernel (kDet), in program order: a release of a turn, or a wait for the turn `turn`
// of (head slot h, query block qb) followed by the adds of the turn's steps. kPerStep: DqTurns' unit (one turn per
// step, the query head's slot; else one per query block, the KV head's slot).
struct Event {
  bool release;
  int h, qb, turn;
};

template <int kBM, bool kPerStep>
std::vector<Event> block_events(const BandMask<int>& mk, int kb, int hk, int rows_kv, int group) {
  using Turns = cuda::DqTurns<kPerStep>;
  std::vector<Event> ev;
  const int j0 = kb * kBN;
  if (j0 >= rows_kv) return ev;  // the kernel returns before any step
  int qb_lo, nq;
  query_blocks_of_key_block<kBM, kBN>(mk, j0, qb_lo, nq);
  const int iters = nq * group;
  using Order = cuda::StepOrder<true>;
  int ih, iq, held_h = -1, held_q = -1;  // the turn the block holds, tracked here to check the kernel's formulas
  Order::first(nq, group, ih, iq);
  for (int it = 0; it < iters; ++it) {
    const int qb = qb_lo + iq;
    if (Turns::opens(ih)) {
      if (it > 0) {  // the kernel releases the turn of Turns::previous(ih, iq)
        int ph = ih, pq = iq;
        Turns::previous(group, ph, pq);
        EXPECT_EQ(Turns::head(hk, group, ph), held_h);
        EXPECT_EQ(qb_lo + pq, held_q);
        ev.push_back({true, Turns::head(hk, group, ph), qb_lo + pq, 0});
      }
      ev.push_back({false, Turns::head(hk, group, ih), qb, cuda::dq_turn<kBM, kBN>(mk, kb, qb)});
      held_h = Turns::head(hk, group, ih);
      held_q = qb;
    } else {  // a step of the held turn
      EXPECT_EQ(Turns::head(hk, group, ih), held_h);
      EXPECT_EQ(qb, held_q);
    }
    Order::next(nq, group, ih, iq);
  }
  if (iters > 0) {  // the kernel releases the turn of Turns::last after the loop
    int lh, lq;
    Turns::last(group, lh, lq);
    EXPECT_EQ(Turns::head(hk, group, lh), held_h);
    EXPECT_EQ(qb_lo + lq, held_q);
    ev.push_back({true, Turns::head(hk, group, lh), qb_lo + lq, 0});
  }
  return ev;
}

struct SimCall {
  std::vector<Seq> seqs;
  bool br;
  int wl, wr, h_kv, group, s_q, s_kv;
};

SimCall random_call(std::mt19937& r) {
  auto U = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(r); };
  SimCall c;
  c.br = U(0, 1) == 1;
  const int w = U(0, 5);
  c.wl = w == 0 ? -1 : w == 1 ? U(0, 300) : w == 2 ? 127 : -1;
  c.wr = w == 3 ? -1 : w == 4 ? U(0, 200) : 0;
  if (w == 5) c.wl = c.wr = -1;
  c.h_kv = U(1, 3);
  c.group = U(0, 2) == 0 ? 1 : U(1, 8);
  const int b = U(1, 4);
  c.s_q = U(1, 1300);
  c.s_kv = U(0, 1) ? c.s_q : U(1, 1300);
  for (int n = 0; n < b; ++n) {
    Seq s;
    s.len_q = U(0, 3) == 0 ? c.s_q : U(0, c.s_q);
    s.rows_kv = U(0, 3) == 0 ? c.s_kv : U(0, c.s_kv);
    s.len_kv = U(0, 3) == 0 ? s.rows_kv : U(0, s.rows_kv);
    c.seqs.push_back(s);
  }
  return c;
}

// Runs every block of the call to the end with at most `resident` blocks at once, tickets in launch order, events
// interleaved at random. Fails on a deadlock (every resident block waiting) or a broken order.
template <int kBM, bool kPerStep>
void simulate(const SimCall& c, int resident, std::mt19937& r) {
  const int gx = (c.s_kv + kBN - 1) / kBN, gy = c.h_kv, gz = static_cast<int>(c.seqs.size());
  const int n_qb = (c.s_q + kBM - 1) / kBM;
  const int h_q = gy * c.group;
  std::vector<unsigned> sem(static_cast<size_t>(cuda::dq_sem_count(gz, h_q, n_qb)), 0u);
  std::map<int64_t, std::vector<int>> adds;  // semaphore -> key blocks in the order they added
  struct Running {
    std::vector<Event> ev;
    size_t pos;
    int n, hk, kb;
  };
  std::vector<Running> run;
  const long total = static_cast<long>(gx) * gy * gz;
  long next_ticket = 0;
  for (;;) {
    while (static_cast<int>(run.size()) < resident && next_ticket < total) {
      const cuda::TileCoord t = cuda::tile_of_linear(
          static_cast<unsigned long long>(next_ticket++),
          cuda::tile_pairs(static_cast<unsigned>(gy), static_cast<unsigned>(gz)), static_cast<unsigned>(gx),
          static_cast<unsigned>(gy), false);
      const Seq& s = c.seqs[t.batch];
      const BandMask<int> mk(c.br, c.wl, c.wr, s.len_q, s.len_kv);
      run.push_back(
          {block_events<kBM, kPerStep>(mk, t.block, t.head, s.rows_kv, c.group), 0, t.batch, t.head, t.block});
    }
    if (run.empty()) break;
    std::vector<size_t> ready;
    for (size_t k = 0; k < run.size(); ++k) {
      const Running& b = run[k];
      if (b.pos == b.ev.size()) {
        ready.push_back(k);
        continue;
      }
      const Event& e = b.ev[b.pos];
      const int64_t si = cuda::dq_sem_index(b.n, e.h, h_q, n_qb, e.qb);
      if (e.release || sem[static_cast<size_t>(si)] == static_cast<unsigned>(e.turn)) ready.push_back(k);
      ASSERT_LE(static_cast<long>(sem[static_cast<size_t>(si)]), e.release ? 1L << 30 : e.turn)
          << "a turn passed before this block took it";
    }
    if (ready.empty()) {
      for (const Running& b : run) {
        const Event& e = b.ev[b.pos];
        const int64_t si = cuda::dq_sem_index(b.n, e.h, h_q, n_qb, e.qb);
        ADD_FAILURE() << "block n " << b.n << " hk " << b.hk << " kb " << b.kb << " waits for h " << e.h << " qb "
                      << e.qb << " turn "
                      << e.turn << ", counter " << sem[static_cast<size_t>(si)] << " (len_q " << c.seqs[b.n].len_q
                      << " len_kv " << c.seqs[b.n].len_kv << ")";
      }
    }
    ASSERT_FALSE(ready.empty()) << "deadlock with " << run.size() << " resident blocks";
    const size_t k = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(r)];
    Running& b = run[k];
    if (b.pos == b.ev.size()) {
      run.erase(run.begin() + static_cast<long>(k));
      continue;
    }
    const Event& e = b.ev[b.pos++];
    const int64_t si = cuda::dq_sem_index(b.n, e.h, h_q, n_qb, e.qb);
    ASSERT_GE(si, 1);
    ASSERT_LT(si, static_cast<int64_t>(sem.size()));
    if (e.release) {
      ++sem[static_cast<size_t>(si)];
    } else {
      adds[si].push_back(b.kb);
    }
  }
  // Every turn (head slot, query block): added to by exactly the key blocks that see it (brute force over the mask),
  // ascending.
  for (int n = 0; n < gz; ++n) {
    const Seq& s = c.seqs[n];
    for (int h = 0; h < (kPerStep ? h_q : gy); ++h)
      for (int qb = 0; qb < n_qb; ++qb) {
        std::vector<int> want;
        for (int kb = 0; kb < gx; ++kb) {
          bool sees = false;
          for (int i = qb * kBM; i < std::min((qb + 1) * kBM, s.len_q) && !sees; ++i)
            for (int j = kb * kBN; j < std::min((kb + 1) * kBN, s.len_kv) && !sees; ++j)
              sees = spec_visible(c.br, c.wl, c.wr, s.len_q, s.len_kv, i, j);
          if (sees) want.push_back(kb);
        }
        const int64_t si = cuda::dq_sem_index(n, h, h_q, n_qb, qb);
        const std::vector<int>& got = adds[si];
        ASSERT_EQ(got, want) << "n " << n << " h " << h << " qb " << qb;
        ASSERT_EQ(sem[static_cast<size_t>(si)], want.size());
        // KernelChoice::dq_first_store: the preprocess skips zeroing exactly the query blocks that have a turn 0
        // (whose adder stores the whole tile before the others add); the rest keep their zeroed rows.
        const BandMask<int> mk(c.br, c.wl, c.wr, s.len_q, s.len_kv);
        const int i0 = qb * kBM;
        const bool stored = i0 < s.len_q && cuda::dq_block_stored(mk, i0, std::min(i0 + kBM, s.len_q));
        ASSERT_EQ(stored, !want.empty()) << "n " << n << " qb " << qb;
        if (!want.empty()) {
          ASSERT_EQ((cuda::dq_turn<kBM, kBN>(mk, want.front(), qb)), 0);
        }
      }
  }
}

TEST(DqOrder, EveryTurnOnceAscendingNoDeadlock) {
  std::mt19937 r(5);
  for (int iter = 0; iter < 250; ++iter) {
    const SimCall c = random_call(r);
    for (int resident : {1, 2, 7, 1000}) {
      simulate<64, true>(c, resident, r);
      if (!HasFatalFailure()) simulate<128, true>(c, resident, r);
      if (!HasFatalFailure()) simulate<64, false>(c, resident, r);
      if (!HasFatalFailure()) simulate<128, false>(c, resident, r);
      if (HasFatalFailure()) {
        ADD_FAILURE() << "call " << iter << ": s_q " << c.s_q << " s_kv " << c.s_kv << " wl " << c.wl << " wr " << c.wr
                      << " br " << c.br << " group " << c.group << " resident " << resident;
        return;
      }
    }
  }
}

TEST(DqOrder, GptOssShapes) {
  std::mt19937 r(6);
  for (int wl : {-1, 127}) {
    SimCall c;
    c.br = true;
    c.wl = wl;
    c.wr = 0;
    c.h_kv = 2;
    c.group = 8;
    c.s_q = c.s_kv = 4096;
    c.seqs = {{4096, 4096, 4096}};
    for (int resident : {1, 9, 132}) {
      simulate<64, true>(c, resident, r);
      simulate<128, true>(c, resident, r);
      simulate<64, false>(c, resident, r);
    }
  }
}

TEST(Scheduler, LaunchOrderIsLongestFirst) {
  // The dK dV order (heavy_last = false): key block index nondecreasing in the linear id, every pair once per block.
  const unsigned gx = 5, gy = 3, gz = 2;
  std::set<std::tuple<int, int, int>> seen;
  int last = -1;
  for (unsigned long long l = 0; l < gx * gy * gz; ++l) {
    const cuda::TileCoord t = cuda::tile_of_linear(l, cuda::tile_pairs(gy, gz), gx, gy, false);
    EXPECT_GE(t.block, last);
    last = t.block;
    seen.insert({t.block, t.head, t.batch});
    const cuda::TileCoord u = cuda::tile_of_linear(l, cuda::tile_pairs(gy, gz), gx, gy, true);
    EXPECT_EQ(u.block, static_cast<int>(gx) - 1 - t.block);
  }
  EXPECT_EQ(seen.size(), gx * gy * gz);
}

TEST(Scheduler, L2SectionsVisitEveryTileOnceLongestFirstWithinEachSection) {
  // Sections of `section` consecutive pairs (head fastest), the last one narrower: every tile once; within a section
  // the block index is nondecreasing and every pair of the section appears once per block, each pair's blocks one by
  // one; sections in order.
  for (unsigned gx : {1u, 4u, 7u})
    for (unsigned gy : {1u, 3u, 8u})
      for (unsigned gz : {1u, 2u, 5u})
        for (unsigned long long section : {0ull, 1ull, 2ull, 5ull, 16ull, 1000ull}) {
          const unsigned long long pairs = cuda::tile_pairs(gy, gz), n = pairs * gx;
          const unsigned long long width = section == 0 || section > pairs ? pairs : section;
          std::set<std::tuple<int, int, int>> seen;
          std::map<long long, int> last_block;  // pair -> its last block
          for (unsigned long long l = 0; l < n; ++l) {
            const cuda::TileCoord t = cuda::tile_of_linear_sectioned(l, pairs, gx, gy, false, section);
            const long long pair = static_cast<long long>(t.batch) * gy + t.head;
            ASSERT_GE(t.block, 0);
            ASSERT_LT(t.block, static_cast<int>(gx));
            ASSERT_LT(static_cast<unsigned long long>(pair), pairs);
            // the section of this position holds this pair
            ASSERT_EQ(static_cast<unsigned long long>(pair) / width, l / (width * gx))
                << "gx " << gx << " gy " << gy << " gz " << gz << " section " << section << " l " << l;
            auto it = last_block.find(pair);
            if (it != last_block.end()) {
              ASSERT_EQ(t.block, it->second + 1) << "a pair's blocks ascend one by one";
            } else {
              ASSERT_EQ(t.block, 0);
            }
            last_block[pair] = t.block;
            seen.insert({t.block, t.head, t.batch});
            const cuda::TileCoord u = cuda::tile_of_linear_sectioned(l, pairs, gx, gy, true, section);
            ASSERT_EQ(u.block, static_cast<int>(gx) - 1 - t.block);
            ASSERT_EQ(u.head, t.head);
            ASSERT_EQ(u.batch, t.batch);
          }
          EXPECT_EQ(seen.size(), n);
          if (width == pairs) {  // one section: the plain order
            for (unsigned long long l = 0; l < n; ++l) {
              const cuda::TileCoord a = cuda::tile_of_linear_sectioned(l, pairs, gx, gy, true, section);
              const cuda::TileCoord b = cuda::tile_of_linear(l, pairs, gx, gy, true);
              ASSERT_EQ(a.block, b.block);
              ASSERT_EQ(a.head, b.head);
              ASSERT_EQ(a.batch, b.batch);
            }
          }
        }
}

TEST(Scheduler, L2SectionPairs) {
  // The pairs whose bytes fit the budget, at least one, in whole units; all pairs when everything fits or nothing is
  // known.
  EXPECT_EQ(cuda::l2_section_pairs(64, 2 << 20, 32 << 20), 16);        // MHA s 4096: 2 MiB of K / V per head
  EXPECT_EQ(cuda::l2_section_pairs(128, 1 << 20, 32 << 20, 8), 128);   // GPT-OSS: 16 KV heads of 1 MiB all fit
  EXPECT_EQ(cuda::l2_section_pairs(128, 5 << 20, 32 << 20, 8), 48);    // 6 KV heads of 5 MiB, 8 query heads each
  EXPECT_EQ(cuda::l2_section_pairs(64, 64 << 20, 32 << 20), 1);        // one pair over the budget: one at a time
  EXPECT_EQ(cuda::l2_section_pairs(64, 64 << 20, 32 << 20, 4), 4);
  EXPECT_EQ(cuda::l2_section_pairs(64, 2 << 20, 0), 64);               // no budget: no sections
  EXPECT_EQ(cuda::l2_section_pairs(64, 0, 32 << 20), 64);
  EXPECT_EQ(cuda::l2_section_pairs(0, 2 << 20, 32 << 20), 0);
  EXPECT_EQ(cuda::l2_section_pairs(64, 2 << 20, 32 << 20, 1, 9), 16);  // at least min_pairs
  EXPECT_EQ(cuda::l2_section_pairs(64, 4 << 20, 32 << 20, 1, 9), 8);   // 9 -> 8 sections of 8
  EXPECT_EQ(cuda::l2_section_pairs(128, 5 << 20, 32 << 20, 8, 50), 48);  // 56 (whole units) -> 3 sections of 48
  EXPECT_EQ(cuda::l2_section_pairs(64, 2 << 20, 30 << 20), 13);         // 15 -> 5 sections of 13 (the last 12)
  EXPECT_EQ(cuda::l2_section_pairs(64, 1 << 19, 31 << 20), 32);         // 62 -> 2 sections of 32
}

}  // namespace
}  // namespace sinkattn

// FastDivmod (core/kv_rows.hpp), the CUDA loaders' page split: x / d by multiply-high and shift equals the division
// for every divisor up to 4096 (page sizes) and large ones, on small, page-boundary and the largest 31-bit keys.
TEST(FastDivmod, EqualsTheDivision) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d : {5000u, 65535u, 65536u, 65537u, 1000003u, (1u << 29) - 1, 1u << 29, (1u << 30) - 3, 1u << 30,
                     (1u << 31) - 1})
    divisors.push_back(d);
  uint64_t state = 88172645463325252ull;
  for (uint32_t d : divisors) {
    const sinkattn::FastDivmod f(d);
    std::vector<uint32_t> xs = {0, 1, d - 1, d, d + 1, 2 * d - 1 < (1u << 31) ? 2 * d - 1 : 7, (1u << 31) - 1,
                                (1u << 31) - 2, (1u << 31) - d};
    for (uint32_t k = 1; k < 64; ++k) xs.push_back(static_cast<uint32_t>((uint64_t{k} * d) % (1u << 31)));
    for (int r = 0; r < 200; ++r) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      xs.push_back(static_cast<uint32_t>(state & 0x7fffffffu));
    }
    for (uint32_t x : xs) {
      if (x >= (1u << 31)) continue;  // keys are below 2^31
      ASSERT_EQ(f.div(x), x / d) << "x " << x << " d " << d;
      ASSERT_EQ(x - f.div(x) * d, x % d) << "x " << x << " d " << d;
    }
  }
}

// The Hopper dK dV kernel's handovers with its producer warpgroup (cuda/hopper/handover.hpp), run as three agents
// under random interleavings: the math warpgroups (one agent: their per-thread arrivals complete a phase together),
// the step loader (TMA steps land later; the others it loads by cp.async before it arrives, or, at two barriers a
// step, the math loads them a step ahead) and the dq writer. Each mbarrier is modelled by its phase count, and every
// wait by try_wait.parity's rule (the phase with that parity has completed: the count's parity differs); the test
// checks that this equals the wait meant (the count is past the awaited completion), which holds only while no
// barrier runs two completions ahead of a waiter, that no buffer is written while a step still reads it, that every
// step reads what it should, and that the protocol cannot deadlock.
namespace {
using sinkattn::cuda::sm90::ring_parity_of;
using sinkattn::cuda::sm90::ring_slot;
struct SimBar {
  int completed = 0;
  bool parity_done(uint32_t parity) const { return static_cast<uint32_t>(completed & 1) != parity; }
};
// kQ: the dq tile's buffers (DkvSm90Traits::kDqBufs); kAll: the loader loads every step (kOneBarrier), else the math
// loads the cp.async steps itself, a step ahead, and the loader only arrives for them.
template <int kQ, bool kAll>
struct Handover {
  int iters;
  std::vector<bool> tma;  // step it's Q / dO by the loader's TMA (else by its cp.async)
  SimBar bars[2], q_empty[2], dq_full[2], dq_empty[2];  // Q / dO (and LSE2 / D): two buffers; the dq tile: kQ
  int qbuf[2] = {-1, -1}, qbuf_landed[2] = {-1, -1}, sdq[2] = {-1, -1};
  // the math: step, stage within it (0 loads landed, 1 sdQ free, 2 staged, 3 end)
  int m_it = 0, m_stage = 0;
  int l_it = 0;          // the loader's next step
  int l_in_flight = -1;  // a TMA load issued and not landed yet (step)
  int w_it = 0;          // the writer's next step
  std::vector<bool> math_done, writer_done;
  int errors = 0;
  int line = 0;
  void check(bool ok, int at = __builtin_LINE()) {
    if (!ok && errors++ == 0) line = at;
  }
  // a wait for completion number k of bar: the parity rule, checked against the count
  bool wait(const SimBar& b, int k, uint32_t parity, int at = __builtin_LINE()) {
    const bool meant = b.completed > k, got = b.parity_done(parity);
    check(meant == got, at);
    return got;
  }
  void load_cp_async(int s) {  // not kAll: the math loads step s by cp.async (after step s - 1's first barrier)
    const int b = s & 1;
    check(s < 2 || math_done[s - 2]);
    qbuf[b] = s;
    qbuf_landed[b] = s;
  }
  bool math_step() {
    if (m_it >= iters) return false;
    const int it = m_it, b = it & 1;
    switch (m_stage) {
      case 0:
        if (!wait(bars[b], it >> 1, sinkattn::cuda::sm90::ring_parity(it))) return false;
        check(qbuf[b] == it && qbuf_landed[b] == it);
        if (!kAll && it + 1 < iters && !tma[it + 1]) load_cp_async(it + 1);
        m_stage = 1;
        return true;
      case 1:
        if (it >= kQ && !wait(dq_empty[ring_slot<kQ>(it)], (it - kQ) / kQ, ring_parity_of<kQ>(it - kQ))) return false;
        m_stage = 2;
        return true;
      case 2:
        check(it < kQ || writer_done[it - kQ]);
        sdq[ring_slot<kQ>(it)] = it;
        ++dq_full[ring_slot<kQ>(it)].completed;
        m_stage = 3;
        return true;
      default:
        math_done[it] = true;
        ++q_empty[b].completed;
        m_stage = 0;
        ++m_it;
        return true;
    }
  }
  bool loader_step() {  // every step: the wait, then the loads (TMA: land later; cp.async: landed at the arrival)
    if (l_it >= iters || l_in_flight >= 0) return false;
    const int it = l_it, b = it & 1;
    if (it >= 2 && !wait(q_empty[b], (it - 2) >> 1, sinkattn::cuda::sm90::ring_parity(it - 2))) return false;
    check(it < 2 || math_done[it - 2]);
    if (tma[it]) {
      qbuf[b] = it;
      l_in_flight = it;
    } else {
      if (kAll) qbuf[b] = qbuf_landed[b] = it;  // its own cp.async, landed before its arrival
      ++bars[b].completed;
    }
    ++l_it;
    return true;
  }
  bool land() {
    if (l_in_flight < 0) return false;
    const int b = l_in_flight & 1;
    qbuf_landed[b] = l_in_flight;
    ++bars[b].completed;
    l_in_flight = -1;
    return true;
  }
  bool writer_step() {
    if (w_it >= iters) return false;
    const int it = w_it, q = ring_slot<kQ>(it);
    if (!wait(dq_full[q], it / kQ, ring_parity_of<kQ>(it))) return false;
    check(sdq[q] == it);
    writer_done[it] = true;
    ++dq_empty[q].completed;
    ++w_it;
    return true;
  }
};
}  // namespace

template <int kQ, bool kAll>
void run_handover(uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 3000; ++trial) {
    Handover<kQ, kAll> h;
    h.iters = 1 + static_cast<int>(rng() % 40);
    const int partial_every = 1 + static_cast<int>(rng() % 6);  // some steps by cp.async, as partial blocks are
    for (int it = 0; it < h.iters; ++it) h.tma.push_back(rng() % 8 != 0 || it % partial_every != 0);
    h.math_done.assign(h.iters, false);
    h.writer_done.assign(h.iters, false);
    if (!kAll && !h.tma[0]) h.load_cp_async(0);  // the prologue's loads of step 0
    while (h.m_it < h.iters || h.w_it < h.iters) {
      bool moved = false;
      for (int tries = 0; tries < 8 && !moved; ++tries) {
        switch (rng() % 4) {
          case 0: moved = h.math_step(); break;
          case 1: moved = h.loader_step(); break;
          case 2: moved = h.land(); break;
          default: moved = h.writer_step(); break;
        }
      }
      if (!moved) moved = h.math_step() || h.loader_step() || h.land() || h.writer_step();
      ASSERT_TRUE(moved) << "deadlock at math step " << h.m_it << " (stage " << h.m_stage << ") writer step "
                         << h.w_it << " loader step " << h.l_it << ", " << h.iters << " steps, step "
                         << h.m_it << (h.m_it < h.iters && h.tma[h.m_it] ? " by TMA" : " by cp.async")
                         << " tma " << [&] {
                              std::string t;
                              for (bool x : h.tma) t += x ? 'T' : 'c';
                              return t;
                            }() << " errors " << h.errors << " first at line " << h.line;
    }
    ASSERT_EQ(h.errors, 0) << "trial " << trial << ", " << h.iters << " steps";
  }
}

TEST(DkvHandover, RingParityNamesTheAwaitedCompletion) {
  run_handover<1, true>(20261207);   // one barrier a step: one sdQ buffer, the loader loads every step
  run_handover<2, false>(20261208);  // two barriers a step (head dim 128): two sdQ buffers, the math's cp.async
}
