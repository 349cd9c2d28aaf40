/* The MoE layer: a whole MoE FFN (router top-k, permute, FC1 grouped GEMM, activation, FC2
 * grouped GEMM, weighted combine), forward and backward, each enqueued as one sequence on one
 * stream with no allocation and no device-to-host synchronization (docs/moe_layer.md).
 *
 * A layer is created once from host-known bounds; sfmoe_moe_layer_get_plan gives the bytes of
 * its two buffers, which the caller allocates once: `saved` (what a forward leaves for its
 * backward) and `workspace` (the temporaries of one call: forward_workspace_bytes for a forward,
 * workspace_bytes for a backward; the two may share one buffer when they do not overlap). The
 * router's logits come from the caller (its gate GEMM); the backward returns their gradient.
 * `saved` holds the routing and FC1's output only (saved_bytes per token is about
 * top_k * fc1_cols * dtype bytes): the activation is recomputed, d probs come from FC2's dgrad
 * and the activations, and x is gathered again in the backward, which therefore takes x too.
 *
 * Recipes (docs/moe_layer.md, "Recipes"): BF16 (BF16 x, weights, rows and gradients, FP32
 * accumulation; on the host also FP32 throughout), and four quantized ones in which each grouped
 * GEMM reads its operands quantized from the layer's BF16 rows and weights: FP8 per-tensor
 * (current scaling, one scale per expert, gradients in E5M2), FP8 blockwise (DeepSeek-V3: 1x128
 * rows, 128x128 weights), MXFP8, and NVFP4 (stochastic rounding on gradients, the random
 * Hadamard transform on the wgrad operands). On Hopper MXFP8 and NVFP4 run emulated (their
 * operands decoded to BF16 for the BF16 kernels; sfmoe_moe_layer_plan.emulated says so).
 * Backends: the CPU reference on host memory, the CUDA kernels on device memory (there H and F
 * multiples of 8, for the grouped GEMM's 16-byte rows).
 */
#ifndef SFMOE_MOE_LAYER_H_
#define SFMOE_MOE_LAYER_H_

#include "sfmoe/activation.h"
#include "sfmoe/ep.h"
#include "sfmoe/router.h"
#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sfmoe_moe_recipe SFMOE_ENUM_INT32 {
  SFMOE_MOE_RECIPE_BF16 = 0,       /* the layer's dtype throughout (BF16, or FP32 on the host) */
  SFMOE_MOE_RECIPE_FP8_TENSOR = 1, /* H, F multiples of 16 and row_alignment of 16 on the device */
  SFMOE_MOE_RECIPE_FP8_BLOCKWISE = 2, /* H, F multiples of 128, row_alignment 128 */
  SFMOE_MOE_RECIPE_MXFP8 = 3,         /* H, F multiples of 32, row_alignment 32 or more */
  SFMOE_MOE_RECIPE_NVFP4 = 4          /* H, F multiples of 16, row_alignment 16 or more */
} sfmoe_moe_recipe;

typedef struct sfmoe_moe_layer_config {
  size_t struct_size;
  int64_t hidden;              /* H */
  int64_t ffn_hidden;          /* F: FC1 writes 2F columns for gated activations, F otherwise */
  int64_t num_experts;         /* E */
  int64_t max_tokens;          /* every call's T is at most this */
  sfmoe_router_config router;  /* top_k, score function, groups, scaling, the losses */
  sfmoe_activation activation; /* SWIGLU by default */
  float activation_limit, activation_alpha; /* clamped SwiGLU (7, 1.702) */
  int64_t expert_capacity; /* > 0: an expert keeps at most this many tokens; 0: no limit */
  int64_t row_alignment;   /* each expert's rows padded to a multiple of this: 1, 8, 16, 32, 64
                              or 128 (16) */
  sfmoe_dtype dtype;       /* x, W1, W2, y and their gradients: BF16 (FP32 on the host too) */
  sfmoe_moe_recipe recipe;
  int32_t accumulate_weight_grads; /* 1: d_w1 and d_w2 are FP32 buffers the backward adds to
                                      (main gradients); 0: written in dtype */
  uint64_t seed;                   /* NVFP4: the Philox key of the gradients' stochastic rounding */
  /* Expert parallelism (docs/moe_layer.md, docs/ep.md): the experts split evenly over
   * ep_world_size ranks (rank r owns [r E_l, (r + 1) E_l), E_l = E / ep_world_size); each rank
   * receives at most ep_receive_capacity rows (SFMOE_EP_CAPACITY_WORST_CASE by default), DROP,
   * TRAP or SPILL beyond it (SPILL: a second round of ep_spill_capacity rows through the experts;
   * it needs accumulate_weight_grads and the BF16 recipe). The loopback transport holds every rank
   * in this process: the calls take each rank's arguments (sfmoe_moe_layer_forward_ranks).
   * expert_capacity must be 0. */
  int32_t ep_world_size; /* 1: no expert parallelism */
  int64_t ep_receive_capacity;
  sfmoe_ep_overflow ep_overflow;
  int64_t ep_spill_capacity; /* SPILL: rows >= 1 or SFMOE_EP_CAPACITY_WORST_CASE; else 0 */
  /* Or an NCCL EP group (one rank a process; include/sfmoe/ep.h) the layer's expert parallelism
   * runs over: its world size must be ep_world_size, its capacities and policy replace the three
   * fields above (leave them at their defaults), and its experts_per_rank, max_tokens_per_rank,
   * top_k, hidden, row_alignment and payload (dtype, no scaling) must be the layer's. The calls
   * then take one rank's arguments (sfmoe_moe_layer_forward or _ranks with one set), on one
   * stream with the group's other calls, in the same order on every rank. Borrowed: the group
   * must outlive the layer. NULL: the loopback. */
  const sfmoe_ep_group* ep_group;
  /* LOOPBACK (the default: the loopback, or ep_group's transport), or EXTERNAL: one rank a call,
   * the rank read on the device, the bytes between ranks moved by the caller's own collectives
   * between the calls' stages (sfmoe_moe_layer_forward_stage below; JAX's shard_map). EXTERNAL
   * takes ep_world_size and the ep_* fields, no ep_group. */
  sfmoe_ep_transport ep_transport;
  /* Rows one rank sends another at most (sfmoe_ep_config.pair_capacity: it bounds the per-rank
   * transports' blocks, the bytes moved); SFMOE_EP_CAPACITY_WORST_CASE by default. With
   * ep_group, the group's applies (leave it at the default). */
  int64_t ep_pair_capacity;
} sfmoe_moe_layer_config;

SFMOE_API sfmoe_moe_layer_config sfmoe_moe_layer_config_init(void);

typedef struct sfmoe_moe_layer sfmoe_moe_layer;

/* Checks the configuration and plans the layer for tensors in `memory` on `device` (device
 * workspaces are planned only for SFMOE_MEMORY_CUDA). */
SFMOE_API sfmoe_status sfmoe_moe_layer_create(const sfmoe_moe_layer_config* config,
                                              sfmoe_memory memory, int32_t device,
                                              sfmoe_moe_layer** out);
SFMOE_API sfmoe_status sfmoe_moe_layer_destroy(sfmoe_moe_layer* layer);

typedef struct sfmoe_moe_layer_plan {
  size_t struct_size;
  int64_t saved_bytes;     /* the forward's state for the backward, at max_tokens */
  int64_t workspace_bytes; /* the temporaries of a backward, which also serve a forward */
  int64_t fc1_backward_workspace_bytes; /* what the backward's FC1 part needs (a prefix of the
                                           rest): see sfmoe_moe_backward_part */
  int64_t forward_workspace_bytes;      /* what a forward's workspace needs at least (its
                                           temporaries are the first part of the backward's) */
  int64_t row_capacity;  /* expert rows: every kept slot plus each expert's padding */
  int64_t fc1_cols;      /* W1 is [E, fc1_cols, H] */
  int32_t emulated;      /* the recipe's GEMMs run emulated on this device */
  int32_t local_ranks;   /* argument sets each call takes: ep_world_size (loopback) or 1 (no
                            expert parallelism, or an NCCL group) */
  int64_t local_experts; /* E_l: each rank's W1 is [E_l, fc1_cols, H], W2 [E_l, H, F] */
  /* A backward's peak at max_tokens: the bytes it holds at once (saved state, workspace, and the
   * gradients it makes: d_w1 and d_w2 unless accumulated into main gradients, d_x, d_logits) called
   * in two parts and in three (sfmoe_moe_backward_part; 0 where three are refused), and whether
   * three hold less by more than the [R, H] rows they gather again (1: the order to call). */
  int64_t backward_peak_bytes_two_parts;
  int64_t backward_peak_bytes_three_parts;
  int32_t three_part_backward;
  /* A quantized recipe's weight cache (the calls' weight_cache): w1's and w2's quantized copies,
   * for the forward's GEMMs and the backward's dgrad; 0 under BF16, which quantizes nothing. */
  int64_t weight_cache_bytes;
} sfmoe_moe_layer_plan;

SFMOE_API sfmoe_moe_layer_plan sfmoe_moe_layer_plan_init(void);
SFMOE_API sfmoe_status sfmoe_moe_layer_get_plan(const sfmoe_moe_layer* layer,
                                                sfmoe_moe_layer_plan* plan);

typedef struct sfmoe_moe_forward_args {
  size_t struct_size;
  const sfmoe_tensor* x;           /* [T, H] dtype, T <= max_tokens */
  const sfmoe_tensor* logits;      /* [T, E] FP32 or BF16 */
  const sfmoe_tensor* expert_bias; /* [E] FP32 (selection only), or NULL */
  const sfmoe_tensor* w1;          /* [E, fc1_cols, H] dtype: [gate; up] for gated kinds */
  const sfmoe_tensor* w2;          /* [E, H, F] dtype */
  const sfmoe_tensor* y;           /* [T, H] dtype, written */
  const sfmoe_tensor* saved;       /* 1-D, at least saved_bytes */
  const sfmoe_tensor* workspace;   /* 1-D, at least workspace_bytes */
  /* Gradient accumulation under a quantized recipe: calls over weights that do not change (the
   * micro-batches of one optimizer step) can quantize w1 and w2 once. weight_cache: 1-D, at
   * least weight_cache_bytes, in the layer's memory, kept by the caller between calls (one per
   * layer, and per rank); NULL: the weights are quantized in the workspace on every call.
   * weight_cache_filled = 0: this forward quantizes the weights for its GEMMs into the cache;
   * 1: it reads the copies an earlier forward made there and quantizes nothing -- the caller
   * promises that w1 and w2 are unchanged since (the copies are read as they are). The results
   * are the bits of a call without a cache. */
  const sfmoe_tensor* weight_cache;
  int32_t weight_cache_filled;
  const sfmoe_tensor* aux_loss;           /* [1] FP32, written when the router's aux_loss_coeff > 0;
                                             else NULL */
  const sfmoe_tensor* z_loss;             /* [1] FP32, likewise for z_loss_coeff */
  const sfmoe_tensor* tokens_per_expert;  /* [E] INT64, written: tokens each expert kept, or NULL */
  const sfmoe_tensor* dropped_per_expert; /* [E] INT64, written: dropped by the capacity, or NULL */
  const sfmoe_tensor* routed_per_expert;  /* [E] INT64, written: slots the router gave each
                                             expert before the capacity (what the load-balancing
                                             loss counts), or NULL */
  sfmoe_status_word* word;                /* device faults (bad ids, clamped offsets), or NULL */
  void* stream;
} sfmoe_moe_forward_args;

/* The backward whole, or in parts called in one of two orders on the same saved state.
 *
 * Two parts: FC2 (d y through FC2's dgrad and wgrad and the activation's backward; writes d_w2
 * and leaves d FC1 rows and d probs in `saved`) then FC1 (x gathered again, FC1's wgrad and
 * dgrad, permute's and the router's backward; writes d_w1, d_x, d_logits). Two calls let a
 * framework allocate d_w1 only after the FC2 part's workspace (its [R, F] rows) is free, as
 * autograd frees activations during a backward.
 *
 * Three parts: FC2_DGRAD (the FC2 part without its wgrad: d FC1 rows and d probs into `saved`,
 * the weighted activations and a copy of the routing into `workspace`), FC1 (as above, on the same
 * workspace: it uses only its prefix), then FC2_WGRAD (d y gathered again, FC2's wgrad into d_w2;
 * it reads neither `saved` nor w2). `saved` is free once FC1 has run, so d_w2 need not coexist
 * with FC1's rows: the lower peak when those rows are large against [R, H] (2F well above H, as
 * in Mixtral), for one more gather of d y. Layers without expert parallelism.
 *
 * Each part reads only the arguments it names below; the others may be NULL. */
typedef enum sfmoe_moe_backward_part SFMOE_ENUM_INT32 {
  SFMOE_MOE_BACKWARD_ALL = 0,
  SFMOE_MOE_BACKWARD_FC2 = 1, /* d_y, w2, saved, workspace (workspace_bytes), d_w2 */
  SFMOE_MOE_BACKWARD_FC1 = 2, /* x, logits, w1, saved, workspace (fc1_backward_workspace_bytes),
                                 d_x, d_logits, d_w1, d_aux_loss, d_z_loss */
  SFMOE_MOE_BACKWARD_FC2_DGRAD = 3, /* d_y, w2, saved, workspace (workspace_bytes) */
  SFMOE_MOE_BACKWARD_FC2_WGRAD = 4  /* d_y, workspace (FC2_DGRAD's, after FC1), d_w2 */
} sfmoe_moe_backward_part;

typedef struct sfmoe_moe_backward_args {
  size_t struct_size;
  sfmoe_moe_backward_part part; /* SFMOE_MOE_BACKWARD_ALL by default */
  const sfmoe_tensor* x;        /* the forward's [T, H] (gathered into expert rows again) */
  const sfmoe_tensor* d_y;      /* [T, H] dtype, the forward's T */
  const sfmoe_tensor* logits;   /* the forward's */
  const sfmoe_tensor* w1;       /* the forward's */
  const sfmoe_tensor* w2;
  const sfmoe_tensor* saved; /* as the forward left it; the backward overwrites part of it (FC1's
                                output with its gradient), so a forward has one backward */
  const sfmoe_tensor* workspace;
  /* As the forward's, for the copies the dgrad GEMMs read (w1's and w2's transposed): filled = 0
   * makes them, 1 reads those an earlier backward made. The forward's and the backward's copies
   * are apart, so each call's flag speaks for its own (the first micro-batch's forward and
   * backward both pass 0, the later ones 1). */
  const sfmoe_tensor* weight_cache;
  int32_t weight_cache_filled;
  float d_aux_loss, d_z_loss; /* upstream gradients of the losses (usually 1 or 0) */
  uint64_t rng_offset; /* NVFP4: the Philox offset of this step's stochastic rounding (advance it
                          each step; a captured graph replays the value it was captured with) */
  const sfmoe_tensor* rng_offset_device; /* NVFP4: NULL, or INT64 [1] in the layer's memory, added
                          to rng_offset when the step runs: read on the device, so the caller
                          advances it between replays of a captured graph or calls of a compiled
                          step (its 8 bytes are read as an unsigned offset) */
  const sfmoe_tensor* d_x;               /* [T, H] dtype, written */
  const sfmoe_tensor* d_logits;          /* [T, E] FP32, written */
  const sfmoe_tensor* d_w1;              /* [E, fc1_cols, H]: dtype written, or FP32 added to */
  const sfmoe_tensor* d_w2;              /* [E, H, F]: likewise */
  sfmoe_status_word* word;
  void* stream;
} sfmoe_moe_backward_args;

SFMOE_API sfmoe_moe_forward_args sfmoe_moe_forward_args_init(void);
SFMOE_API sfmoe_moe_backward_args sfmoe_moe_backward_args_init(void);

SFMOE_API sfmoe_status sfmoe_moe_layer_forward(const sfmoe_moe_layer* layer,
                                               const sfmoe_moe_forward_args* args);
/* Fills a weight cache (weight_cache_bytes, the layer's memory) from w1 and w2 (one rank's:
 * [E_l, ...]) with every copy the forward's and the backward's GEMMs read, enqueued on `stream`:
 * calls given the cache with weight_cache_filled = 1 then quantize no weight. The same copies as
 * the forward and backward that fill the cache themselves make (weight_cache_filled = 0). The
 * layout depends on the layer's sizes and recipe, not on max_tokens. A layer that quantizes no
 * weight (BF16) needs 0 bytes: it takes any cache tensor and writes nothing. */
SFMOE_API sfmoe_status sfmoe_moe_layer_fill_weight_cache(const sfmoe_moe_layer* layer,
                                                         const sfmoe_tensor* w1,
                                                         const sfmoe_tensor* w2,
                                                         const sfmoe_tensor* weight_cache,
                                                         sfmoe_status_word* word, void* stream);
SFMOE_API sfmoe_status sfmoe_moe_layer_backward(const sfmoe_moe_layer* layer,
                                                const sfmoe_moe_backward_args* args);

/* An expert-parallel layer over the loopback transport: args[r] is rank r's (local_ranks of them;
 * its tokens, logits [T_r, E], its local experts' weights [E_l, ...], its outputs, saved state and
 * workspace of the plan's sizes, each rank's own), every rank's work enqueued on args[0]'s stream
 * and reported to args[0]'s word. The counts are each rank's: tokens_per_expert [E_l] (rows its
 * local experts kept, in both of SPILL's rounds), dropped_per_expert [E] (its rows dropped, by
 * global expert), routed_per_expert [E] (its router's slots per expert). The single-rank calls
 * above refuse such a layer, these accept any (with local_ranks 1 they are the calls above). */
SFMOE_API sfmoe_status sfmoe_moe_layer_forward_ranks(const sfmoe_moe_layer* layer,
                                                     const sfmoe_moe_forward_args* const* args);
SFMOE_API sfmoe_status sfmoe_moe_layer_backward_ranks(const sfmoe_moe_layer* layer,
                                                      const sfmoe_moe_backward_args* const* args);

/* The EXTERNAL transport (ep_transport; docs/ep.md, "The EXTERNAL transport"): each call runs
 * as stages 0 .. n on one rank, n the sequence's collectives; stage i does the work between
 * collective i - 1 and collective i, and the caller runs collective i between stages i and i + 1
 * over every rank (the same program on each: JAX's shard_map), handing stage i + 1 what it
 * received. An all-gather's rank sends `bytes` and receives world_size blocks of `bytes`, block q
 * rank q's; an all-to-all's rank sends and receives world_size blocks of `bytes`, block q going to
 * (coming from) rank q. The sizes are fixed at creation: no host synchronization anywhere. A
 * sequence's stages take the same arguments (the same saved state and workspace, whose contents
 * carry from one stage to the next), in order; the forward's counts are written at its last
 * stage. The rank's faults name rank 0 as the source where the loopback names the rank. */
typedef enum sfmoe_ep_collective_kind SFMOE_ENUM_INT32 {
  SFMOE_EP_COLLECTIVE_ALL_GATHER = 0,
  SFMOE_EP_COLLECTIVE_ALL_TO_ALL = 1
} sfmoe_ep_collective_kind;

typedef struct sfmoe_ep_collective {
  sfmoe_ep_collective_kind kind;
  int64_t bytes; /* all-gather: what a rank sends; all-to-all: what it sends each rank */
} sfmoe_ep_collective;

#define SFMOE_MOE_MAX_COLLECTIVES 8
typedef struct sfmoe_moe_stages {
  size_t struct_size;
  int32_t collectives; /* n: the sequence has n + 1 stages */
  sfmoe_ep_collective collective[SFMOE_MOE_MAX_COLLECTIVES];
} sfmoe_moe_stages;

typedef struct sfmoe_moe_stage {
  size_t struct_size;
  int32_t index;                /* 0 .. collectives */
  const sfmoe_tensor* rank;     /* [1] INT32 in the layer's memory: this rank, in [0, world) (one
                                   outside raises SFMOE_FAULT_BAD_INDEX and is clamped) */
  const sfmoe_tensor* received; /* index > 0: 1-D, what collective index - 1 delivered to this
                                   rank (world_size blocks of its bytes); else NULL */
  const sfmoe_tensor* sent;     /* index < collectives: 1-D, written: what this rank sends in
                                   collective index (bytes, or world_size blocks of them); else
                                   NULL */
} sfmoe_moe_stage;

SFMOE_API sfmoe_moe_stages sfmoe_moe_stages_init(void);
SFMOE_API sfmoe_moe_stage sfmoe_moe_stage_init(void);
/* The forward's collectives, and the backward's (whole or a part): an EXTERNAL layer's only. */
SFMOE_API sfmoe_status sfmoe_moe_layer_get_forward_stages(const sfmoe_moe_layer* layer,
                                                          sfmoe_moe_stages* stages);
SFMOE_API sfmoe_status sfmoe_moe_layer_get_backward_stages(const sfmoe_moe_layer* layer,
                                                           sfmoe_moe_backward_part part,
                                                           sfmoe_moe_stages* stages);
/* One stage of an EXTERNAL layer's forward or backward, on this rank's arguments (as for
 * sfmoe_moe_layer_forward: its tokens, logits [T, E], local experts' weights [E_l, ...], counts
 * tokens_per_expert [E_l], dropped_per_expert [E], routed_per_expert [E]). */
SFMOE_API sfmoe_status sfmoe_moe_layer_forward_stage(const sfmoe_moe_layer* layer,
                                                     const sfmoe_moe_forward_args* args,
                                                     const sfmoe_moe_stage* stage);
SFMOE_API sfmoe_status sfmoe_moe_layer_backward_stage(const sfmoe_moe_layer* layer,
                                                      const sfmoe_moe_backward_args* args,
                                                      const sfmoe_moe_stage* stage);

#ifdef __cplusplus
}
#endif

#endif /* SFMOE_MOE_LAYER_H_ */
