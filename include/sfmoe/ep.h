/* Expert parallelism (docs/ep.md): R ranks own disjoint sets of experts (rank r owns the global
 * experts [r E_l, (r + 1) E_l)); `dispatch` moves each token's row to the rank of each of its
 * top-k experts, where the rows arrive grouped by local expert, padded, ready for FC1; `combine`
 * brings the experts' outputs back and sums them per token, weighted by the routing
 * probabilities. Each has its backward (dispatch's is a combine of the gradients with weight 1;
 * combine's scatters the weighted gradient and gives d probs).
 *
 * Receive capacity: a rank keeps at most `receive_capacity` rows (token, expert pairs), so its
 * buffers are bounded and sized on the host. The rows a rank is sent are ordered by source rank,
 * then token index, then top-k slot; the first receive_capacity are kept, the rest dropped, and
 * counted exactly (per source rank and global expert, and per destination rank and local expert
 * before and after the capacity). A dropped row contributes zero in combine. Overflow policies:
 * DROP carries on; TRAP also raises SFMOE_FAULT_EP_OVERFLOW in the status word; SPILL keeps the
 * next `spill_capacity` rows in a second round (a second grouped tensor of the received buffer,
 * after the first round's rows, with offsets of its own), so combine gives the bits of an
 * unlimited capacity; rows past both are dropped, counted and raise SFMOE_FAULT_EP_OVERFLOW.
 * Within a local expert, rows are ordered by source rank, then token index: the layout, the
 * combine's slot-order FP32 sums, and hence every output bit, do not depend on arrival order.
 *
 * Payloads: BF16, FP16, FP32 rows, or FP8 codes (E4M3, E5M2) with their scales travelling beside
 * the rows (`payload_scaling`): TENSOR, the source rank's FP32 scale_inv repeated on each row (one
 * column; received rows come from ranks of different scales); BLOCK_1X128, the rows' FP32
 * scale_inv per 128 columns; MX_1X32, their E8M0 scales per 32 columns, unswizzled. Dispatch
 * moves bytes: the received codes and scales are the sent ones.
 *
 * Transports: LOOPBACK holds every rank in one process (each call takes an array of `world`
 * descriptors, rank by rank): the test bed of the EP logic, on the CPU backend or on one GPU (up
 * to 64 ranks there; the same bits). On the host the expert ids are checked before anything is
 * written; on the device a bad id is skipped and reported (SFMOE_FAULT_BAD_INDEX). NCCL holds one
 * rank a process (device memory, up to 64 ranks; each call takes arrays of one descriptor): the
 * ranks exchange their counts on the device and move rows in fixed blocks of `pair_rows` rows per
 * pair of ranks with NCCL's collectives on the call's stream, so a step captures in one CUDA
 * graph on every rank; the same bits as the loopback. The group owns its staging
 * (`plan.staging_bytes` of device memory, allocated at creation); its calls go on one stream at a
 * time, in the same order on every rank. NCCL (libnccl.so.2) is loaded when the first NCCL group
 * is created.
 */
#ifndef SFMOE_EP_H_
#define SFMOE_EP_H_

#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sfmoe_ep_transport SFMOE_ENUM_INT32 {
  SFMOE_EP_TRANSPORT_LOOPBACK = 0, /* every rank in this process */
  SFMOE_EP_TRANSPORT_NCCL = 1,     /* one rank per process, NCCL between them */
  SFMOE_EP_TRANSPORT_EXTERNAL = 2  /* one rank a call, the caller's collectives between the
                                      calls: an MoE layer's stages only (include/sfmoe/moe_layer.h,
                                      sfmoe_moe_layer_forward_stage); groups refuse it */
} sfmoe_ep_transport;

typedef enum sfmoe_ep_overflow SFMOE_ENUM_INT32 {
  SFMOE_EP_OVERFLOW_DROP = 0, /* rows beyond the capacity dropped, counted */
  SFMOE_EP_OVERFLOW_TRAP = 1, /* as DROP, and SFMOE_FAULT_EP_OVERFLOW raised in the word */
  SFMOE_EP_OVERFLOW_SPILL = 2 /* a second round of spill_capacity rows for those that did not fit */
} sfmoe_ep_overflow;

/* receive_capacity: every row any rank could be sent (world * max_tokens_per_rank * top_k);
 * spill_capacity: every row that can overflow the receive capacity (worst case - capacity). */
#define SFMOE_EP_CAPACITY_WORST_CASE (-1)

typedef struct sfmoe_ep_config {
  size_t struct_size;
  sfmoe_ep_transport transport;
  int32_t world_size;          /* R >= 1 */
  int32_t rank;                /* this process's rank (NCCL); 0 with LOOPBACK */
  int64_t experts_per_rank;    /* E_l >= 1; global experts E = R E_l */
  int64_t max_tokens_per_rank; /* every rank's T is at most this */
  int64_t top_k;               /* 1 <= k <= E; a token names an expert at most once */
  int64_t hidden;              /* H: the dispatched rows' width */
  sfmoe_dtype payload;         /* the dispatched rows: BF16, FP16, FP32, FP8_E4M3 or FP8_E5M2 */
  int64_t row_alignment;       /* each local expert's rows padded to a multiple of this: 1, 8, 16,
                                  32, 64 or 128 (1) */
  int64_t receive_capacity;    /* rows a rank keeps at most, >= 1 (typically capacity_factor T k
                                  / R), or SFMOE_EP_CAPACITY_WORST_CASE (the default) */
  sfmoe_ep_overflow overflow;
  sfmoe_scaling payload_scaling; /* NONE for BF16 / FP16 / FP32; TENSOR, BLOCK_1X128 or MX_1X32
                                    for FP8 codes */
  int64_t spill_capacity;        /* SPILL: rows of the second round, >= 1, or
                                    SFMOE_EP_CAPACITY_WORST_CASE; 0 otherwise */
  /* NCCL: either the SFMOE_EP_NCCL_UNIQUE_ID_BYTES bytes of an id one rank made with
   * sfmoe_ep_nccl_unique_id and shared with the others (the group then makes and owns its
   * communicator; every rank's create blocks until all have called it), or an ncclComm_t of
   * world_size ranks in which this process is `rank` (borrowed: it must outlive the group). */
  const uint8_t* nccl_unique_id;
  void* nccl_comm;
  /* Rows one source sends one rank at most, >= 1; SFMOE_EP_CAPACITY_WORST_CASE (the default) or
   * 0: all it could. A slot past it (in the source's token, slot order) is dropped as one past the
   * receive capacity is (counted; TRAP and SPILL raise SFMOE_FAULT_EP_OVERFLOW), its row still
   * taking its place in the destination's order. It bounds a per-rank transport's blocks
   * (pair_rows) and so the bytes moved, e.g. to 1.25 T k / R rows; the device loopback, which
   * moves nothing between ranks, refuses it (SFMOE_ERROR_UNSUPPORTED). */
  int64_t pair_capacity;
} sfmoe_ep_config;

#define SFMOE_EP_NCCL_UNIQUE_ID_BYTES 128
/* A fresh NCCL unique id (one rank makes it; SFMOE_ERROR_UNSUPPORTED when NCCL is not found). */
SFMOE_API sfmoe_status sfmoe_ep_nccl_unique_id(uint8_t out[SFMOE_EP_NCCL_UNIQUE_ID_BYTES]);

/* struct_size set, LOOPBACK, world 1, row_alignment 1, BF16 (scaling NONE), DROP, the worst-case
 * capacities (receive and pair), everything else 0. */
SFMOE_API sfmoe_ep_config sfmoe_ep_config_init(void);

typedef struct sfmoe_ep_group sfmoe_ep_group;

SFMOE_API sfmoe_status sfmoe_ep_group_create(const sfmoe_ep_config* config, sfmoe_memory memory,
                                             int32_t device, sfmoe_ep_group** out);
SFMOE_API sfmoe_status sfmoe_ep_group_destroy(sfmoe_ep_group* group);

typedef struct sfmoe_ep_plan {
  size_t struct_size;
  int32_t local_ranks;      /* descriptors each call takes: world_size (LOOPBACK) or 1 */
  int64_t receive_capacity; /* the rows a rank keeps at most in the first round (the worst case
                               resolved) */
  int64_t receive_rows;     /* rows of a rank's received buffer: capacity + E_l (a - 1), plus
                               spill_rows */
  int64_t handle_bytes;     /* a rank's routing, written by dispatch, read by the other calls */
  int32_t rounds;           /* 2 with SPILL, else 1: the grouped tensors in the received buffer */
  int64_t spill_capacity;   /* SPILL: the second round's rows at most (resolved); else 0 */
  int64_t spill_row_base;   /* SPILL: the second round's first row (capacity + E_l (a - 1)) */
  int64_t spill_rows;       /* SPILL: spill_capacity + E_l (a - 1); else 0 */
  int64_t scale_columns;    /* columns of the scales beside each row (0 without them) */
  sfmoe_dtype scale_dtype;  /* FP32 (TENSOR, BLOCK_1X128) or E8M0 (MX_1X32) */
  int64_t pair_rows;        /* NCCL: rows of each pair of ranks' staging block (what one source
                               can send one rank: min(T k, T E_l, both capacities,
                               pair_capacity)); else 0 */
  int64_t staging_bytes;    /* NCCL: the device memory the group holds for its staging; else 0 */
} sfmoe_ep_plan;

SFMOE_API sfmoe_ep_plan sfmoe_ep_plan_init(void);
SFMOE_API sfmoe_status sfmoe_ep_group_get_plan(const sfmoe_ep_group* group, sfmoe_ep_plan* plan);

/* Every array below has local_ranks entries, rank by rank; an optional output is NULL as a whole
 * or present for every rank. T_r is rank r's token count (tokens[r]'s rows). G = rounds E_l
 * groups: the first round's local experts, then (SPILL) the second round's; group_offsets holds
 * rounds (E_l + 1) entries, each round's offsets counted from its first row (0, then
 * spill_row_base). */
typedef struct sfmoe_ep_dispatch_args {
  size_t struct_size;
  const sfmoe_tensor* const* tokens;   /* [T_r, H] payload dtype */
  const sfmoe_tensor* const* topk_ids; /* [T_r, k] INT32 global expert ids */
  const sfmoe_tensor* const* received; /* [receive_rows, H] payload dtype, written: each group's
                                          rows at its round's first row + its offset, its
                                          padding rows zero, rows past each round's last group
                                          untouched */
  const sfmoe_tensor* const* group_offsets;      /* [rounds (E_l + 1)] INT64, written */
  const sfmoe_tensor* const* handle;             /* 1-D, handle_bytes, written */
  const sfmoe_tensor* const* tokens_per_expert;  /* [G] INT64: rows kept per group, or NULL */
  const sfmoe_tensor* const* routed_per_expert;  /* [E_l] INT64: rows sent to each local expert
                                                    before the capacity (size it from these), or
                                                    NULL */
  const sfmoe_tensor* const* dropped_per_expert; /* [E] INT64: the source rank's rows dropped, by
                                                    global expert, or NULL */
  sfmoe_status_word* word;                       /* TRAP's and SPILL's overflow; or NULL */
  void* stream;
  const sfmoe_tensor* const* token_scales;    /* FP8 payloads: [T_r, scale_columns] scale_dtype;
                                                 else NULL */
  const sfmoe_tensor* const* received_scales; /* FP8 payloads: [receive_rows, scale_columns],
                                                 written beside the received rows (padding rows'
                                                 scales zero); else NULL */
} sfmoe_ep_dispatch_args;

/* Combine: out_r[t] = sum_i probs_r[t, i] rows_d[row of (r, t, i)] over the kept slots (FP32 sums
 * in slot order), d the rank of expert topk_ids_r[t, i]. With probs NULL the weight is 1: that is
 * dispatch's backward (d tokens from d received rows). With NCCL, a row of H' values is at most
 * a staging row (H values of the wider of the payload and 16 bits): SFMOE_ERROR_UNSUPPORTED
 * otherwise. */
typedef struct sfmoe_ep_combine_args {
  size_t struct_size;
  const sfmoe_tensor* const* rows;   /* [receive_rows, H'] laid out as dispatch received them */
  const sfmoe_tensor* const* probs;  /* [T_r, k] FP32, or NULL */
  const sfmoe_tensor* const* handle; /* the dispatch's */
  const sfmoe_tensor* const* out;    /* [T_r, H'], written */
  sfmoe_status_word* word;
  void* stream;
} sfmoe_ep_combine_args;

/* Combine's backward: d_rows_d[row of (r, t, i)] = probs_r[t, i] d_out_r[t] (each local expert's
 * padding rows zero, rows past the last expert untouched); d_probs_r[t, i] = <d_out_r[t], the
 * forward's rows_d[row]> (0 for a dropped slot), summed in the order docs/ep.md gives (the same
 * bits on every backend). Combine and combine's backward read the handle a dispatch of this
 * group wrote for the same token counts; a handle that none wrote gives wrong rows, but every slot
 * is bounds-checked: no access outside the buffers. */
typedef struct sfmoe_ep_combine_backward_args {
  size_t struct_size;
  const sfmoe_tensor* const* d_out; /* [T_r, H'] */
  const sfmoe_tensor* const* rows;  /* the forward's [receive_rows, H'] */
  const sfmoe_tensor* const* probs; /* [T_r, k] FP32 */
  const sfmoe_tensor* const* handle;
  const sfmoe_tensor* const* d_rows;  /* [receive_rows, H'], written */
  const sfmoe_tensor* const* d_probs; /* [T_r, k] FP32, written */
  sfmoe_status_word* word;
  void* stream;
} sfmoe_ep_combine_backward_args;

SFMOE_API sfmoe_ep_dispatch_args sfmoe_ep_dispatch_args_init(void);
SFMOE_API sfmoe_ep_combine_args sfmoe_ep_combine_args_init(void);
SFMOE_API sfmoe_ep_combine_backward_args sfmoe_ep_combine_backward_args_init(void);

SFMOE_API sfmoe_status sfmoe_ep_dispatch(const sfmoe_ep_group* group,
                                         const sfmoe_ep_dispatch_args* args);
SFMOE_API sfmoe_status sfmoe_ep_combine(const sfmoe_ep_group* group,
                                        const sfmoe_ep_combine_args* args);
SFMOE_API sfmoe_status sfmoe_ep_combine_backward(const sfmoe_ep_group* group,
                                                 const sfmoe_ep_combine_backward_args* args);

#ifdef __cplusplus
}
#endif

#endif /* SFMOE_EP_H_ */
