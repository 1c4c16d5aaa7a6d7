// A separate project that finds the installed sinkattn with find_package and runs one forward (learnable sinks).
#include <sinkattn/sinkattn.hpp>
#include <cstdio>
#include <vector>
int main() {
  auto p = sinkattn::default_params();
  std::vector<float> q(1*4*2*8, 0.5f), k(q), v(q), out(q.size()), lse(1*2*4), sinks{1.f, 2.f};
  p.q = sinkattn::tensor(q.data(), SINKATTN_F32, {1, 4, 2, 8});
  p.k = sinkattn::tensor(k.data(), SINKATTN_F32, {1, 4, 2, 8});
  p.v = sinkattn::tensor(v.data(), SINKATTN_F32, {1, 4, 2, 8});
  p.out = sinkattn::tensor(out.data(), SINKATTN_F32, {1, 4, 2, 8});
  p.softmax_lse = sinkattn::tensor(lse.data(), SINKATTN_F32, {1, 2, 4});
  p.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  p.sinks = sinkattn::tensor(sinks.data(), SINKATTN_F32, {2});
  std::vector<char> ws(sinkattn::forward_workspace_size(p));
  p.workspace = ws.data(); p.workspace_bytes = ws.size();
  sinkattn::forward(p);
  std::printf("version %s lse[0]=%f out[0]=%f backend report:\n%s", sinkattn_version(), lse[0], out[0],
              sinkattn::query_backend(p, false).report.c_str());
}
