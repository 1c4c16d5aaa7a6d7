#include <sinkattn/sinkattn.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, S = 64, HQ = 4, HKV = 2, D = 16, NQ = B * S * HQ * D, NK = B * S * HKV * D };
static float q[NQ], k[NK], v[NK], out[NQ], lse[B * HQ * S], sinks[HQ] = {0, 1, 2, 20};  /* fp32, host memory: CPU */
static float d_out[NQ], dq[NQ], dk[NK], dv[NK], d_sinks[HQ];
#define F32(data, rank, shape) sinkattn_make_tensor(data, SINKATTN_F32, rank, shape, NULL)  /* NULL: contiguous */

int main(void) {
  for (int i = 0; i < NQ; ++i) q[i] = rand() / (float)RAND_MAX - 0.5f, d_out[i] = rand() / (float)RAND_MAX;
  for (int i = 0; i < NK; ++i) k[i] = rand() / (float)RAND_MAX - 0.5f, v[i] = rand() / (float)RAND_MAX;
  int64_t qs[4] = {B, S, HQ, D}, ks[4] = {B, S, HKV, D}, ls[3] = {B, HQ, S}, hs[1] = {HQ};  /* [b, s, h, d] */
  sinkattn_params_t p;
  sinkattn_params_init(&p);  /* defaults: vanilla softmax, scale 1/sqrt(d), no window, bottom-right */
  p.q = F32(q, 4, qs), p.k = F32(k, 4, ks), p.v = F32(v, 4, ks);
  p.out = F32(out, 4, qs), p.softmax_lse = F32(lse, 3, ls);
  p.softmax_type = SINKATTN_SOFTMAX_LEARNABLE, p.sinks = F32(sinks, 1, hs);  /* fp32 [h_q] */
  p.window_left = 31, p.window_right = 0;                                    /* causal, window of 32 keys */
  p.d_out = F32(d_out, 4, qs), p.d_sinks = F32(d_sinks, 1, hs);              /* the backward's tensors */
  p.dq = F32(dq, 4, qs), p.dk = F32(dk, 4, ks), p.dv = F32(dv, 4, ks);
  size_t fwd_bytes, bwd_bytes;
  if (sinkattn_forward_workspace_size(&p, &fwd_bytes) || sinkattn_backward_workspace_size(&p, &bwd_bytes)) goto fail;
  p.workspace_bytes = fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes;
  p.workspace = malloc(p.workspace_bytes + 1);
  int ok = sinkattn_forward(&p) == SINKATTN_OK && sinkattn_backward(&p) == SINKATTN_OK;
  free(p.workspace);
  if (!ok) goto fail;
  printf("lse[0] = %.4f, d_sinks = %.4g %.4g %.4g %.4g\n", lse[0], d_sinks[0], d_sinks[1], d_sinks[2], d_sinks[3]);
  return 0;
fail:
  fprintf(stderr, "sinkattn: %s\n", sinkattn_last_error());  /* names the argument and the rule it broke */
  return 1;
}
