/*
 * sinkattn: fused scaled-dot-product attention with softmax sinks -- C ABI.
 *
 * The math is defined in SPEC.md (shared contract). Section numbers below refer to it:
 *   1 inputs and shapes, 2 forward (masks, dropout), 3 backward, 4 workspace/errors/backends,
 *   5 accuracy, 6 call capture files.
 *
 * Usage (forward):
 *   sinkattn_params_t p;
 *   sinkattn_params_init(&p);
 *   p.q = ...; p.k = ...; p.v = ...; p.out = ...; p.softmax_lse = ...;
 *   size_t ws; sinkattn_forward_workspace_size(&p, &ws);
 *   p.workspace = alloc(ws); p.workspace_bytes = ws;
 *   if (sinkattn_forward(&p) != SINKATTN_OK) fprintf(stderr, "%s\n", sinkattn_last_error());
 * or, validating once with the workspace from an allocator callback (bindings that allocate per call):
 *   sinkattn_forward_alloc(&p, my_alloc, my_allocator_state, 0);
 *
 * Every entry point validates the whole parameter struct first (SPEC.md section 4) and writes nothing to
 * any output when validation fails. Errors are returned as a status; the message (naming the argument and
 * the rule broken) is available from sinkattn_last_error() on the calling thread.
 */
#ifndef SINKATTN_SINKATTN_H_
#define SINKATTN_SINKATTN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SINKATTN_API __declspec(dllexport)
#else
#define SINKATTN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define SINKATTN_VERSION_MAJOR 0
#define SINKATTN_VERSION_MINOR 1
#define SINKATTN_VERSION_PATCH 0

/* Element types. SINKATTN_I32 is for the sequence-length tensors, SINKATTN_I64 for rng tensors
 * (the bits of uint64 values). */
typedef enum {
  SINKATTN_F32 = 0,
  SINKATTN_F16 = 1,
  SINKATTN_BF16 = 2,
  SINKATTN_I32 = 3,
  SINKATTN_I64 = 4,
} sinkattn_dtype_t;

/* SPEC.md section 2: the value of the sink logit sigma.
 *   VANILLA:    sigma = -inf (plain softmax)
 *   OFF_BY_ONE: sigma = 0, no gradient
 *   LEARNABLE:  sigma = sinks[h] (fp32 [h_q]), gradient d_sinks */
typedef enum {
  SINKATTN_SOFTMAX_VANILLA = 0,
  SINKATTN_SOFTMAX_OFF_BY_ONE = 1,
  SINKATTN_SOFTMAX_LEARNABLE = 2,
} sinkattn_softmax_type_t;

/* SPEC.md section 2, masks: off = s_kv_n - s_q_n (BOTTOM_RIGHT, FlashAttention's convention) or 0
 * (TOP_LEFT, TransformerEngine's CAUSAL). */
typedef enum {
  SINKATTN_ALIGN_BOTTOM_RIGHT = 0,
  SINKATTN_ALIGN_TOP_LEFT = 1,
} sinkattn_mask_alignment_t;

typedef enum {
  SINKATTN_BACKEND_AUTO = 0,
  SINKATTN_BACKEND_CPU = 1,
  SINKATTN_BACKEND_CUDA = 2,
} sinkattn_backend_t;

#define SINKATTN_NUM_BACKENDS 2 /* concrete backends: CPU, CUDA */

typedef enum {
  SINKATTN_OK = 0,
  SINKATTN_ERR_INVALID_ARGUMENT = 1,  /* shape, dtype, stride, null pointer, option out of range */
  SINKATTN_ERR_UNSUPPORTED = 2,       /* valid call that no (or not the requested) backend supports */
  SINKATTN_ERR_WORKSPACE_TOO_SMALL = 3,
  SINKATTN_ERR_DEVICE = 4,            /* a CUDA runtime error */
  SINKATTN_ERR_INTERNAL = 5,
} sinkattn_status_t;

#define SINKATTN_MAX_RANK 4

/* A strided view of a tensor. `rank == 0` means "absent" (optional tensors); a present tensor (rank > 0)
 * must have non-NULL data except in the workspace-size queries.
 * shape[i] and strides[i] (in elements, not bytes) for i < rank; the last dimension must have stride 1.
 * Host or device memory: the backend is told by the dispatcher (device pointers go to CUDA). */
typedef struct {
  void* data;
  sinkattn_dtype_t dtype;
  int32_t rank;
  int64_t shape[SINKATTN_MAX_RANK];
  int64_t strides[SINKATTN_MAX_RANK];
} sinkattn_tensor_t;

/* One attention call, forward or backward (SPEC.md sections 1-4). Initialise with sinkattn_params_init().
 *
 * Layout (SPEC.md section 1). Dense: q [b, s_q, h_q, d], k [b, s_kv, h_kv, d], v [b, s_kv, h_kv, d_v],
 * out [b, s_q, h_q, d_v], softmax_lse [b, h_q, s_q]. Varlen (cu_seqlens_q given): q [total_q, h_q, d],
 * k [total_kv, h_kv, d], v [total_kv, h_kv, d_v], out [total_q, h_q, d_v], softmax_lse [h_q, total_q].
 * Any strides are allowed (BSHD, SBHD, BHSD, packed QKV) as long as the last dimension is contiguous.
 *
 * Which tensors are read or written by forward and backward:
 *   forward  reads  q, k, v, [sinks], [bias], [batch tensors], [rng_seed_offset]
 *            writes out, softmax_lse, [rng_state]
 *   backward reads  q, k, v, [sinks], [bias], out, softmax_lse, d_out, [d_lse], [batch tensors], [rng_state]
 *            writes dq, dk, dv, [d_sinks] (learnable), [d_bias] (when bias is given)
 * Tensors a pass does not use are ignored by it. */
typedef struct {
  /* ---- inputs ---- */
  sinkattn_tensor_t q;      /* fp32 | fp16 | bf16 */
  sinkattn_tensor_t k;      /* dtype of q */
  sinkattn_tensor_t v;      /* dtype of q */
  sinkattn_tensor_t sinks;  /* fp32 [h_q], natural-log units (not scaled). Required iff LEARNABLE. Any finite value
                             * or -inf (that head is then vanilla; its key-less rows add d_lse_i to d_sinks[h]); a
                             * +inf or NaN sink leaves that head's outputs unspecified, other heads unaffected
                             * (SPEC.md section 3, "Sink values"). */
  /* optional post-scale bias, fp32 or dtype of q, [b|1, h_q|1, s_q, s_kv]; dense only. Accuracy (SPEC.md sections 3,
   * 5) holds for logits and sinks with |S_ij|, |sigma| <= 1e4: exclude a key with -inf (or a mask / window), never
   * with a huge finite value such as float32's lowest, whose LSE an fp32 softmax_lse cannot carry. */
  sinkattn_tensor_t bias;

  /* ---- batch description (SPEC.md section 1); all int32, memory of q. Their contents (monotonic, in range)
   * are checked by every entry point. In device memory that reads them with a synchronising copy of b + 1
   * entries on `stream`, except while `stream` is being captured into a CUDA graph (no synchronisation is
   * allowed there): captured calls trust the contents. ---- */
  sinkattn_tensor_t cu_seqlens_q;   /* varlen: [b+1], non-decreasing, cu_seqlens_q[0] == 0 */
  sinkattn_tensor_t cu_seqlens_kv;  /* varlen: [b+1]; required together with cu_seqlens_q */
  sinkattn_tensor_t seqused_kv;     /* varlen only, optional [b]: keys actually used per sequence */
  sinkattn_tensor_t seqlens_q;      /* dense only, optional [b]: rows i >= seqlens_q[n] are padding */
  sinkattn_tensor_t seqlens_kv;     /* dense only, optional [b]: keys j >= seqlens_kv[n] are masked */
  int64_t max_seqlen_q;             /* varlen: upper bound of every sequence's query length (required) */
  int64_t max_seqlen_kv;            /* varlen: upper bound of every sequence's key length (required) */
  /* Paged KV (SPEC.md section 1; forward only): with a page table, k and v are page pools
   * [num_pages, page_size, h_kv, d] / [num_pages, page_size, h_kv, d_v], key j < seqused_kv[n] of sequence n is
   * row j % page_size of page page_table[n, j / page_size], and seqused_kv [b] is required (dense or varlen q).
   * Entries past ceil(seqused_kv[n] / page_size) are never read. A backward with a page table is rejected. */
  sinkattn_tensor_t page_table;     /* int32 [b, max_pages] */
  /* 1: do not read batch tensors (cu_seqlens_*, seqused_kv, seqlens_*, page_table) in device memory back to the
   * host to check their contents (no synchronisation: a CUDA-graph-capturable call; the caller vouches for them).
   * 0 (default): they are checked, except while the call's stream is being captured. */
  int32_t trust_device_batch_tensors;

  /* ---- forward outputs ---- */
  sinkattn_tensor_t out;          /* dtype of q */
  sinkattn_tensor_t softmax_lse;  /* fp32, natural log, includes the sink */

  /* ---- backward inputs / outputs ---- */
  sinkattn_tensor_t d_out;    /* dtype of q, shape of out */
  sinkattn_tensor_t d_lse;    /* optional fp32, shape of softmax_lse */
  sinkattn_tensor_t dq;       /* dtype of q, shape of q */
  sinkattn_tensor_t dk;       /* dtype of q, shape of k */
  sinkattn_tensor_t dv;       /* dtype of q, shape of v */
  sinkattn_tensor_t d_sinks;  /* fp32 [h_q]; required iff LEARNABLE; written, never accumulated into */
  sinkattn_tensor_t d_bias;   /* dtype and shape of bias; required iff bias is given */

  /* ---- options ---- */
  sinkattn_softmax_type_t softmax_type;       /* default VANILLA */
  float softmax_scale;                        /* NaN (the default) means 1/sqrt(d) */
  int64_t window_left;                        /* < 0: unbounded (default -1) */
  int64_t window_right;                       /* < 0: unbounded (default -1); causal is 0 */
  sinkattn_mask_alignment_t mask_alignment;   /* default BOTTOM_RIGHT */

  /* Dropout (SPEC.md section 2). dropout_p in [0, 1). The forward takes seed/offset from
   * rng_seed_offset (I64 [2], memory of q) when given, otherwise from the scalars `seed`, `offset`,
   * and writes them to rng_state (I64 [2]) when given. The backward reads rng_state (required when
   * dropout_p > 0). */
  double dropout_p;
  uint64_t seed;
  uint64_t offset;
  sinkattn_tensor_t rng_seed_offset;
  sinkattn_tensor_t rng_state;

  int32_t deterministic;    /* backward: bitwise reproducible dq, dk, dv, d_sinks, d_bias */
  int32_t num_splits;       /* forward: key splits per row (split-KV / flash-decoding); 0 (default) = the backend's
                               heuristic, 1 = no split, N > 1 = at most N splits */
  sinkattn_backend_t backend; /* AUTO (default), CPU, CUDA */
  void* stream;             /* cudaStream_t for the CUDA backend; NULL = default stream */
  int32_t num_threads;      /* CPU backend: 0 (default) = all cores */

  void* workspace;          /* scratch, at least the size the matching size query reported */
  size_t workspace_bytes;
} sinkattn_params_t;

/* Fills *p with the defaults above (all tensors absent). */
SINKATTN_API void sinkattn_params_init(sinkattn_params_t* p);

/* Bytes per element of `dtype` (0 for an unknown value). */
SINKATTN_API size_t sinkattn_dtype_size(sinkattn_dtype_t dtype);

/* Convenience: a tensor view. `strides == NULL` means row-major contiguous. */
SINKATTN_API sinkattn_tensor_t sinkattn_make_tensor(void* data, sinkattn_dtype_t dtype, int32_t rank,
                                                    const int64_t* shape, const int64_t* strides);

/* SPEC.md section 2. Writes out, softmax_lse, and rng_state (if given).
 * Returns INVALID_ARGUMENT / UNSUPPORTED / WORKSPACE_TOO_SMALL / DEVICE with a message. */
SINKATTN_API sinkattn_status_t sinkattn_forward(const sinkattn_params_t* p);

/* SPEC.md section 3. Writes dq, dk, dv, d_sinks (learnable), d_bias (with bias). */
SINKATTN_API sinkattn_status_t sinkattn_backward(const sinkattn_params_t* p);

/* SPEC.md section 4: bytes of workspace the forward / backward with these parameters needs on the backend
 * that would run it. Same validation and code path as the run (the workspace fields are ignored here).
 * Shape-only queries are allowed: data pointers may be NULL, which bindings use to size scratch buffers
 * before any memory exists; with a NULL q pointer the backend is p->backend, or CPU when that is AUTO.
 * The CPU backend's workspace follows the keys each sequence reads (seqlens_kv, seqused_kv, cu_seqlens_kv): given
 * the batch tensors' data it reports exactly what the run uses; a shape-only query gets a bound from the shapes
 * (s_kv, max_pages * page_size), which for a large page table can be far more than the run needs. The CUDA
 * backend's workspace comes from the shapes alone and holds nothing per key: a paged forward's is at most the
 * partial outputs of 128 key splits of its query rows, whatever the page table's capacity. */
SINKATTN_API sinkattn_status_t sinkattn_forward_workspace_size(const sinkattn_params_t* p, size_t* bytes);
SINKATTN_API sinkattn_status_t sinkattn_backward_workspace_size(const sinkattn_params_t* p, size_t* bytes);

/* SPEC.md section 1: rows of packed (varlen) tensors after cu_seqlens_q[b] (of out, dq, softmax_lse) and after
 * cu_seqlens_kv[b] (of dk, dv) belong to no sequence, and sinkattn_forward / sinkattn_backward never read or write
 * them. A binding that allocates the outputs itself calls this (with the same params, before or after the pass) so
 * that they hold out = 0, softmax_lse = -inf (is_backward = 0) or dq = dk = dv = 0 (is_backward = 1), as SPEC.md
 * says. Dense calls: nothing to do. Same validation as the pass. Device memory: one kernel on p->stream that reads
 * cu_seqlens[b] on the device (no synchronisation; graph-capturable); host memory: done before returning. */
SINKATTN_API sinkattn_status_t sinkattn_clear_unowned_rows(const sinkattn_params_t* p, int32_t is_backward);

/* The caller's workspace allocator for sinkattn_forward_alloc / sinkattn_backward_alloc: returns at least `bytes`
 * (> 0) bytes in the memory of the call's tensors (device memory of q's device for the CUDA backend), or NULL when it
 * cannot. `user` is the caller's pointer, passed through. The library neither frees nor keeps the pointer: the memory
 * must stay valid until the pass's work on p->stream is done (a stream-ordered caching allocator, such as PyTorch's,
 * may hand it out again after that). The allocator must not throw (C++ callers catch inside it and return NULL). */
typedef void* (*sinkattn_workspace_alloc_t)(size_t bytes, void* user);

/* flags of sinkattn_forward_alloc / sinkattn_backward_alloc */
#define SINKATTN_RUN_CLEAR_UNOWNED_ROWS 1u /* after the pass, what sinkattn_clear_unowned_rows does (varlen) */

/* sinkattn_forward / sinkattn_backward with the workspace from the caller's allocator, for bindings that allocate
 * per call: *p is validated ONCE (every rule of the size query and of the run, the batch tensors' contents included,
 * read back as trust_device_batch_tensors says), the workspace is sized as sinkattn_*_workspace_size would size it,
 * alloc(bytes, user) is called once when that is > 0 (never for 0, never when validation fails), the pass runs with
 * that workspace (p->workspace and p->workspace_bytes are ignored, *p is not modified), and with
 * flags & SINKATTN_RUN_CLEAR_UNOWNED_ROWS the rows of no sequence are then filled as sinkattn_clear_unowned_rows fills
 * them (varlen; nothing for dense calls). Same tensors read and written, results, statuses and messages as the
 * sequence size query, run (and clear_unowned_rows) with the same params. Further errors: INVALID_ARGUMENT for a NULL
 * alloc or unknown flag bits; WORKSPACE_TOO_SMALL when alloc returns NULL ("workspace: the allocator returned NULL
 * for the workspace ... needs, N bytes (G GiB: what the backend keeps there)"), with nothing written to any output. */
SINKATTN_API sinkattn_status_t sinkattn_forward_alloc(const sinkattn_params_t* p, sinkattn_workspace_alloc_t alloc,
                                                      void* user, uint32_t flags);
SINKATTN_API sinkattn_status_t sinkattn_backward_alloc(const sinkattn_params_t* p, sinkattn_workspace_alloc_t alloc,
                                                       void* user, uint32_t flags);

/* SPEC.md section 4: which backend would run this call (is_backward = 0: forward, 1: backward).
 * *chosen is the backend (CPU or CUDA), or AUTO if none can. `report` (may be NULL) receives a
 * NUL-terminated text with one line per backend: "cpu: chosen (...)" or "cuda: not chosen: <why>"; the chosen
 * backend's line may go on with "; kernels: <the kernels that run the pass and why>" (for example
 * "cuda: chosen (tensors in device memory); kernels: hopper fwd (wgmma), tile 128 x 64, TMA").
 * Returns OK when some backend can run the call, otherwise the status the run would return. */
SINKATTN_API sinkattn_status_t sinkattn_query_backend(const sinkattn_params_t* p, int32_t is_backward,
                                                      sinkattn_backend_t* chosen, char* report,
                                                      size_t report_len);

/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
SINKATTN_API const char* sinkattn_last_error(void);

/* sizeof(sinkattn_params_t) as compiled into this library, so bindings that mirror the struct (ctypes) can check
 * their mirror against the library that actually reads it. */
SINKATTN_API size_t sinkattn_params_size(void);

/* "0.1.0" */
SINKATTN_API const char* sinkattn_version(void);

/* Is the backend compiled into this library (1) or not (0). */
SINKATTN_API int32_t sinkattn_backend_available(sinkattn_backend_t backend);

/* Human-readable description of a backend: a first line "NAME: summary", then one line "  TOPIC: text" per topic
 * (each device found, dtypes, head dims, features). Writes a NUL-terminated text of at most len bytes to buf. */
SINKATTN_API void sinkattn_backend_describe(sinkattn_backend_t backend, char* buf, size_t len);

/* What `sinkattn info` shows of a backend's kernels and switches (SPEC.md section 4: a backend declares what it runs
 * and why). Every string is static: valid while the library is loaded. */
typedef struct {
  const char* name;       /* kernel family, e.g. "hopper fwd" */
  const char* sources;    /* where it is, e.g. "src/cuda/hopper/fwd_sm90_ws.cuh" */
  const char* runs_when;  /* the calls it runs, in one short line */
  const char* rule;       /* the full rule: conditions, tiles, variants */
} sinkattn_kernel_family_t;

typedef struct {
  const char* name;    /* environment variable, e.g. "SINKATTN_CUDA_NO_SM90" (read once per process) */
  const char* values;  /* what it may be set to, e.g. "1" or "N" */
  const char* effect;  /* what it does */
  const char* use;     /* when to use it */
} sinkattn_switch_t;

/* The kernel families of a backend: sets *rows to a static array and returns its length (0 and NULL for a backend
 * not compiled in). */
SINKATTN_API int32_t sinkattn_backend_kernel_families(sinkattn_backend_t backend,
                                                      const sinkattn_kernel_family_t** rows);

/* The environment switches a backend reads (the fallbacks a user or an A/B run needs): sets *rows to a static array
 * and returns its length (0 and NULL for a backend without switches or not compiled in). */
SINKATTN_API int32_t sinkattn_backend_switches(sinkattn_backend_t backend, const sinkattn_switch_t** rows);

/* SPEC.md section 2, dropout: Philox4x32-10 (Random123) and the keep decision, exposed for tests
 * and bindings. counter, key: 4 and 2 uint32 words; writes 4 words to out. */
SINKATTN_API void sinkattn_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* keep(seed, offset, n, h, i, j) of SPEC.md section 2 with the call's h_q, max_s_q, max_s_kv and p.
 * Returns 1 (kept) or 0 (dropped). */
SINKATTN_API int32_t sinkattn_dropout_keep(uint64_t seed, uint64_t offset, int64_t n, int64_t h, int64_t i,
                                           int64_t j, int64_t h_q, int64_t max_s_q, int64_t max_s_kv,
                                           double dropout_p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SINKATTN_SINKATTN_H_ */
