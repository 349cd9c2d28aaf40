/* sfmoe: sync-free Mixture-of-Experts training primitives. Core types and status handling.
 *
 * Conventions of the whole C API:
 *  - Every function returns an sfmoe_status; on failure a message for this thread is kept and
 *    sfmoe_last_error() returns it. No C++ exception crosses this boundary.
 *  - Config and descriptor structs begin with `struct_size`, which callers set to sizeof(struct);
 *    the library refuses a size it does not know (a header/library mismatch).
 *  - Operations enqueue work on the caller's CUDA stream (passed as void*) and never wait for the
 *    device, allocate, or read device memory on the host. Sizes that only the device knows (group
 *    row counts) stay on the device; the host passes bounds.
 *  - Where a tensor lives (host or CUDA memory) selects the backend: the CPU reference backend or
 *    the CUDA backend.
 */
#ifndef SFMOE_SFMOE_H_
#define SFMOE_SFMOE_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SFMOE_API __declspec(dllexport)
#else
#define SFMOE_API __attribute__((visibility("default")))
#endif

/* The API's enums are 32-bit integers, and a C caller may store any int32_t in one (the library
 * checks it). In C++ each is declared with int32_t as its underlying type, so that every such
 * value is a value of the type and reading one is defined behaviour. */
#ifdef __cplusplus
#define SFMOE_ENUM_INT32 : int32_t
#else
#define SFMOE_ENUM_INT32
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define SFMOE_VERSION_MAJOR 0
#define SFMOE_VERSION_MINOR 1
#define SFMOE_VERSION_PATCH 0

/* ---- status --------------------------------------------------------------------------------- */
typedef enum sfmoe_status SFMOE_ENUM_INT32 {
  SFMOE_SUCCESS = 0,
  SFMOE_ERROR_INVALID_ARGUMENT = 1, /* a value outside its domain (enum, count, bound) */
  SFMOE_ERROR_NULL_POINTER = 2,     /* a required pointer is NULL */
  SFMOE_ERROR_MISALIGNED = 3,       /* a pointer is not aligned as the layout needs */
  SFMOE_ERROR_SHAPE_MISMATCH = 4,   /* sizes disagree with each other or with the layout */
  SFMOE_ERROR_DTYPE_MISMATCH = 5,   /* dtype and scaling (or operands) do not go together */
  SFMOE_ERROR_UNSUPPORTED = 6,      /* valid, but not implemented for this combination */
  SFMOE_ERROR_MEMORY_SPACE = 7,     /* tensors in different memory spaces or devices */
  SFMOE_ERROR_NO_BACKEND = 8,       /* CUDA memory but no CUDA backend or device */
  SFMOE_ERROR_CUDA = 9,             /* a CUDA runtime call failed */
  SFMOE_ERROR_OUT_OF_MEMORY = 10,
  SFMOE_ERROR_STRUCT_SIZE = 11, /* struct_size does not match this library's struct */
  SFMOE_ERROR_INTERNAL = 12,
  SFMOE_ERROR_COMMUNICATION = 13 /* a collective between ranks failed (NCCL) */
} sfmoe_status;

SFMOE_API const char* sfmoe_status_name(sfmoe_status status);
/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
SFMOE_API const char* sfmoe_last_error(void);
SFMOE_API void sfmoe_clear_last_error(void);

/* ---- types ---------------------------------------------------------------------------------- */
typedef enum sfmoe_dtype SFMOE_ENUM_INT32 {
  SFMOE_DTYPE_FP32 = 0,
  SFMOE_DTYPE_BF16 = 1,
  SFMOE_DTYPE_FP16 = 2,
  SFMOE_DTYPE_FP8_E4M3 = 3,
  SFMOE_DTYPE_FP8_E5M2 = 4,
  SFMOE_DTYPE_FP4_E2M1 = 5, /* two per byte: element 2i in the low nibble */
  SFMOE_DTYPE_E8M0 = 6,     /* power-of-two scales */
  SFMOE_DTYPE_INT32 = 7,
  SFMOE_DTYPE_INT64 = 8
} sfmoe_dtype;
#define SFMOE_DTYPE_COUNT 9

typedef enum sfmoe_scaling SFMOE_ENUM_INT32 {
  SFMOE_SCALING_NONE = 0,          /* FP32 / BF16 / FP16 */
  SFMOE_SCALING_TENSOR = 1,        /* FP8: one FP32 scale_inv per group */
  SFMOE_SCALING_BLOCK_1X128 = 2,   /* FP8: FP32 scale_inv per 1x128 block (activations, grads) */
  SFMOE_SCALING_BLOCK_128X128 = 3, /* FP8: FP32 scale_inv per 128x128 block (weights) */
  SFMOE_SCALING_MX_1X32 = 4,       /* MXFP8: E8M0 per 32 elements */
  SFMOE_SCALING_NV_1X16 = 5,       /* NVFP4: E4M3 per 16 elements + FP32 global scale */
  SFMOE_SCALING_NV_16X16 = 6       /* NVFP4 2D blocks (weights) */
} sfmoe_scaling;
#define SFMOE_SCALING_COUNT 7

typedef enum sfmoe_scale_layout SFMOE_ENUM_INT32 {
  SFMOE_SCALE_LAYOUT_COMPACT = 0,  /* row-major [rows, cols / block] */
  SFMOE_SCALE_LAYOUT_SWIZZLED = 1, /* 128x4 tensor-core tiles (docs/numerics.md) */
  /* BLOCK_1X128 only: the rowwise copy's scales compact, the columnwise copy's [C, R / 128]
   * matrix stored transposed, [R / 128, C] (each group's blocks with leading dimension C: the
   * layout the grouped GEMM's blockwise wgrad reads) */
  SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED = 2
} sfmoe_scale_layout;

typedef enum sfmoe_memory SFMOE_ENUM_INT32 {
  SFMOE_MEMORY_HOST = 0, /* ordinary host memory: the CPU reference backend */
  SFMOE_MEMORY_CUDA = 1  /* device memory of CUDA device `device`: the CUDA backend */
} sfmoe_memory;

SFMOE_API const char* sfmoe_dtype_name(sfmoe_dtype dtype);
SFMOE_API const char* sfmoe_scaling_name(sfmoe_scaling scaling);
/* Bits per element (4 for FP4), 0 for an unknown dtype. */
SFMOE_API int sfmoe_dtype_bits(sfmoe_dtype dtype);
/* Elements per scale along a copy's rows (the side of 2D blocks): 128, 32 or 16; 0 for NONE and
 * TENSOR (one scale per group) and for unknown values. */
SFMOE_API int64_t sfmoe_scaling_block_size(sfmoe_scaling scaling);
/* The smallest output row_alignment a quantized grouped tensor of this scaling may have
 * (docs/quantization.md): the block height for 2D blocks or with a columnwise copy, else 1. */
SFMOE_API int64_t sfmoe_min_row_alignment(sfmoe_scaling scaling, int32_t has_columnwise);
/* The dtype of a scaling's scale entries: FP32 (TENSOR, BLOCK_1X128, BLOCK_128X128), E8M0
 * (MX_1X32), FP8_E4M3 (NV_1X16, NV_16X16). SFMOE_ERROR_INVALID_ARGUMENT for NONE (no scales) and
 * unknown values. */
SFMOE_API sfmoe_status sfmoe_scale_dtype(sfmoe_scaling scaling, sfmoe_dtype* dtype);
/* The shape of one copy's scale array (docs/quantization.md, "scale storage"), so that callers
 * allocate what the ops write: the copy is [copy_rows, copy_cols] elements, [R, C] for the
 * rowwise copy and [C, R] for the columnwise one. Writes *ndim (1 or 2) and shape[0..ndim):
 * [num_groups] for TENSOR; [rows, cols / B] for 1D blocks; [rows / B, cols / B] for 2D blocks;
 * one dimension of swizzled_scale_padded_size bytes for the swizzled layout (MX_1X32, NV_1X16);
 * one dimension of copy_rows * (copy_cols / 128) entries for the columnwise-transposed layout
 * (BLOCK_1X128; the same count for both copies). Divisions round up. Fails on NONE or unknown
 * scalings, negative sizes, a layout the scaling does not have, or a size beyond int64. */
SFMOE_API sfmoe_status sfmoe_scale_shape(sfmoe_scaling scaling, sfmoe_scale_layout layout,
                                         int64_t num_groups, int64_t copy_rows, int64_t copy_cols,
                                         int32_t* ndim, int64_t shape[2]);

/* ---- plain tensors -------------------------------------------------------------------------- */
#define SFMOE_MAX_DIMS 4

/* A dense row-major tensor. Data must be 16-byte aligned (vector loads, TMA). */
typedef struct sfmoe_tensor {
  size_t struct_size;
  void* data;
  sfmoe_dtype dtype;
  int32_t ndim; /* 0..SFMOE_MAX_DIMS; 0 is a scalar */
  int64_t shape[SFMOE_MAX_DIMS];
  sfmoe_memory memory;
  int32_t device; /* CUDA device ordinal when memory is CUDA */
} sfmoe_tensor;

/* A filled-in descriptor (struct_size set). */
SFMOE_API sfmoe_tensor sfmoe_tensor_make(void* data, sfmoe_dtype dtype, int32_t ndim,
                                         const int64_t* shape, sfmoe_memory memory, int32_t device);
/* Checks a descriptor without touching its data. `name` appears in the error message. */
SFMOE_API sfmoe_status sfmoe_tensor_validate(const sfmoe_tensor* tensor, const char* name);

/* ---- grouped tensors -------------------------------------------------------------------------
 * Groups stacked along the rows of one buffer. Host-known: pointers, dtype, scaling, the number
 * of groups, the row capacity (allocation bound) and the column count. Device-known: the group
 * row offsets, an int64 prefix sum of num_groups + 1 entries in the tensor's memory, with
 * group_offsets[0] = 0, non-decreasing, each start a multiple of row_alignment, and
 * group_offsets[num_groups] <= row_capacity. Rows between groups (alignment padding) hold zeros.
 * Weights use uniform_group_rows > 0 instead: group g is rows [g*n, (g+1)*n) and group_offsets
 * may be NULL.
 * The columnwise copy stores the same values quantized along the other dimension, transposed:
 * [cols, row_capacity] (K-major operands for Hopper's FP8 tensor cores).
 */
typedef struct sfmoe_grouped_tensor {
  size_t struct_size;
  sfmoe_memory memory;
  int32_t device;
  sfmoe_dtype dtype;
  sfmoe_scaling scaling;
  sfmoe_scale_layout scale_layout;
  int64_t num_groups;
  int64_t row_capacity;
  int64_t cols;
  int64_t row_alignment;      /* power of two, >= 1 */
  int64_t uniform_group_rows; /* 0: sizes come from group_offsets */
  int64_t* group_offsets;     /* device-side; written by ops that produce a grouped tensor */
  void* rowwise_data;         /* [row_capacity, cols] or NULL */
  void* rowwise_scale_inv;    /* layout per scaling; NULL when scaling is NONE */
  void* columnwise_data;      /* [cols, row_capacity] or NULL */
  void* columnwise_scale_inv;
  /* [num_groups] or NULL: per-group amax (of the rowwise values). Written by the op producing
   * the tensor where it has one (grouped quantize for FP8 per-tensor and NVFP4; permute's and the
   * activations' outputs when set) and read where a quantized input's scales need it (NVFP4's
   * global scale); ignored on inputs of unquantized rows. */
  float* amax;
  float* columnwise_amax; /* [num_groups] or NULL: amax of the columnwise values where they
                             differ (NVFP4 with the Hadamard transform) */
} sfmoe_grouped_tensor;

/* A descriptor with struct_size set, row_alignment 1 and everything else zero / NULL. */
SFMOE_API sfmoe_grouped_tensor sfmoe_grouped_tensor_init(void);
SFMOE_API sfmoe_status sfmoe_grouped_tensor_validate(const sfmoe_grouped_tensor* tensor,
                                                     const char* name);

/* ---- layout planning -------------------------------------------------------------------------
 * Every buffer an op writes or needs follows from host-known bounds alone. The planning functions
 * (sfmoe_plan_grouped_quantize, sfmoe_plan_permute, sfmoe_plan_grouped_activation and each op's
 * *_workspace_bytes) state them, so that callers (the Python package, framework shape functions,
 * the MoE layer's planner) allocate exactly what the ops address and restate no rule.
 */
#define SFMOE_PLAN_ALIGNMENT 256 /* where sfmoe_grouped_tensor_bind starts each buffer */

/* One planned buffer: `ndim` 0 means the buffer is absent (its pointer stays NULL). `shape` is
 * in elements of `dtype` (FP4: elements, two per byte); `bytes` is what to allocate. */
typedef struct sfmoe_buffer_plan {
  sfmoe_dtype dtype;
  int32_t ndim;
  int64_t shape[2];
  int64_t bytes;
} sfmoe_buffer_plan;

/* The layout of a grouped tensor an op writes: its descriptor's host fields and each buffer.
 * total_bytes covers every present buffer, each started at an SFMOE_PLAN_ALIGNMENT boundary: one
 * allocation of that size, bound with sfmoe_grouped_tensor_bind, holds the whole tensor. */
typedef struct sfmoe_grouped_tensor_plan {
  size_t struct_size;
  sfmoe_dtype dtype;
  sfmoe_scaling scaling;
  sfmoe_scale_layout scale_layout;
  int64_t num_groups;
  int64_t row_capacity;
  int64_t cols;
  int64_t row_alignment;
  int64_t uniform_group_rows;
  sfmoe_buffer_plan group_offsets; /* INT64 [num_groups + 1]; absent with uniform groups */
  sfmoe_buffer_plan rowwise_data;
  sfmoe_buffer_plan rowwise_scale_inv;
  sfmoe_buffer_plan columnwise_data;
  sfmoe_buffer_plan columnwise_scale_inv;
  sfmoe_buffer_plan amax;
  sfmoe_buffer_plan columnwise_amax;
  int64_t total_bytes;
} sfmoe_grouped_tensor_plan;

/* A descriptor for `plan` whose buffers are carved, in the order of the plan's fields and each at
 * an SFMOE_PLAN_ALIGNMENT boundary, out of `base` (plan->total_bytes in `memory` on `device`;
 * base itself SFMOE_PLAN_ALIGNMENT-aligned). Absent buffers stay NULL. Host-only, no allocation. */
SFMOE_API sfmoe_status sfmoe_grouped_tensor_bind(const sfmoe_grouped_tensor_plan* plan,
                                                 sfmoe_memory memory, int32_t device, void* base,
                                                 sfmoe_grouped_tensor* out);

/* ---- device status word ----------------------------------------------------------------------
 * Faults found by kernels (group sizes over capacity, EP overflow, NaN amax) are never written out
 * of bounds: kernels clamp, carry on, and record the fault in a status word in device memory.
 * Every operation on the word is enqueued on a stream (so it can sit inside a captured graph):
 * reset clears it; snapshot copies it into a pinned host mirror; read returns the mirror without
 * touching the device. A typical step: reset at the start, snapshot at the end, and read after
 * whatever synchronization the host already does (e.g. once per step).
 */
typedef enum sfmoe_fault SFMOE_ENUM_INT32 {
  SFMOE_FAULT_BAD_GROUP_OFFSETS = 1u << 0,   /* offsets[0] != 0, decreasing, or misaligned */
  SFMOE_FAULT_GROUP_OVER_CAPACITY = 1u << 1, /* a group ends beyond row_capacity: clamped */
  SFMOE_FAULT_EP_OVERFLOW = 1u << 2,         /* rows beyond an EP receive capacity: dropped */
  SFMOE_FAULT_NAN_AMAX = 1u << 3,            /* an amax was NaN (when trapping is asked for) */
  SFMOE_FAULT_BAD_INDEX = 1u << 4            /* an expert id or row index outside its range, or
                                                named twice: that entry was skipped */
} sfmoe_fault;

typedef struct sfmoe_fault_report {
  uint32_t flags;      /* OR of sfmoe_fault */
  uint32_t count;      /* number of fault events (saturates at UINT32_MAX) */
  int64_t first_group; /* the group of the first recorded fault, or -1 */
  int64_t first_value; /* the offending value of that fault (e.g. the offset), or 0 */
} sfmoe_fault_report;

typedef struct sfmoe_status_word sfmoe_status_word;

/* Allocates the word (device memory and a pinned mirror for CUDA; host memory otherwise), cleared.
 * Call outside the step: it allocates and synchronizes. */
SFMOE_API sfmoe_status sfmoe_status_word_create(sfmoe_memory memory, int32_t device,
                                                sfmoe_status_word** out);
SFMOE_API sfmoe_status sfmoe_status_word_destroy(sfmoe_status_word* word);
/* Enqueues a clear on `stream` (host memory: clears at once). */
SFMOE_API sfmoe_status sfmoe_status_word_reset(sfmoe_status_word* word, void* stream);
/* Enqueues a copy of the word into the host mirror (host memory: nothing to do). */
SFMOE_API sfmoe_status sfmoe_status_word_snapshot(sfmoe_status_word* word, void* stream);
/* Returns the mirror as the last snapshot left it. Does not wait: the caller synchronizes with the
 * snapshot's stream first, in its own way. */
SFMOE_API sfmoe_status sfmoe_status_word_read(const sfmoe_status_word* word,
                                              sfmoe_fault_report* report);

/* Checks a grouped tensor's device-side offsets against its bounds on the stream, raising
 * SFMOE_FAULT_BAD_GROUP_OFFSETS / SFMOE_FAULT_GROUP_OVER_CAPACITY in `word`. Sync-free. */
SFMOE_API sfmoe_status sfmoe_check_group_offsets(const sfmoe_grouped_tensor* tensor,
                                                 sfmoe_status_word* word, void* stream);

/* ---- build and device information ------------------------------------------------------------ */
typedef struct sfmoe_build_info {
  size_t struct_size;
  int32_t version_major, version_minor, version_patch;
  int32_t has_cuda_backend;      /* compiled with the CUDA backend */
  int32_t cuda_compiled_version; /* CUDART_VERSION at build time, 0 without CUDA */
  char cuda_archs[64];           /* e.g. "sm_90a" */
  char compiler[64];
} sfmoe_build_info;

typedef struct sfmoe_device_info {
  size_t struct_size;
  int32_t device_count; /* CUDA devices visible (0 without backend or GPU) */
  int32_t runtime_version;
  int32_t driver_version;
  char name[256]; /* of device 0 */
  int32_t compute_major, compute_minor;
  int32_t multiprocessors;
  int64_t global_memory_bytes;
  int64_t l2_cache_bytes;
  int32_t kernels_supported; /* the build holds machine code this device runs */
} sfmoe_device_info;

SFMOE_API sfmoe_status sfmoe_get_build_info(sfmoe_build_info* info);
SFMOE_API sfmoe_status sfmoe_get_device_info(sfmoe_device_info* info);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_SFMOE_H_ */
