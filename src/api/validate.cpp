#include "src/api/validate.h"

#include <limits>
#include <string>

#include "src/api/status_word_impl.h"
#include "src/common/error.h"
#include "src/common/group_offsets.h"
#include "src/common/quantize_args.h"
#include "src/ops/backend.h"
#if defined(SFMOE_WITH_CUDA)
#include "src/cuda/backend.h"
#endif

namespace sfmoe {
namespace {

bool dtype_is_valid(int dtype) { return dtype >= 0 && dtype < SFMOE_DTYPE_COUNT; }
bool scaling_is_valid(int scaling) { return scaling >= 0 && scaling < SFMOE_SCALING_COUNT; }

bool is_misaligned(const void* p, uintptr_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) % alignment) != 0;
}

// Bytes of rows x cols elements of `bits` each, or -1 on overflow.
int64_t checked_bytes(int64_t rows, int64_t cols, int bits) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / 64;
  if (rows < 0 || cols < 0 || (cols != 0 && rows > limit / cols)) return -1;
  return (rows * cols * bits + 7) / 8;
}

// Elements per scale along the scaled (column) dimension of the rowwise copy.
int64_t scaling_block_cols(sfmoe_scaling scaling) {
  const int64_t block = scaling_block_size(scaling);
  return block > 0 ? block : 1;
}

}  // namespace

sfmoe_status check_struct_size(const char* context, const char* name, const void* s,
                               size_t struct_size, size_t expected, const char* init_name) {
  if (s == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s is NULL", context, name);
  if (struct_size != expected) {
    return fail(SFMOE_ERROR_STRUCT_SIZE,
                "%s: %s struct_size is %zu but this library's struct has %zu bytes (use %s)",
                context, name, struct_size, expected, init_name);
  }
  return SFMOE_SUCCESS;
}

int64_t tensor_element_count(const sfmoe_tensor* t) {
  int64_t count = 1;
  for (int32_t d = 0; d < t->ndim; ++d) count *= t->shape[d];
  return count;
}

sfmoe_status validate_memory(const char* context, const char* name, const sfmoe_memory& memory,
                             int32_t device) {
  const int32_t value = enum_value(memory);
  if (value != SFMOE_MEMORY_HOST && value != SFMOE_MEMORY_CUDA) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: %s: memory %d is not a valid sfmoe_memory (HOST=0, CUDA=1)", context, name,
                static_cast<int>(value));
  }
  if (memory == SFMOE_MEMORY_HOST) return SFMOE_SUCCESS;
#if defined(SFMOE_WITH_CUDA)
  const int count = cuda::device_count();
  if (count == 0) {
    return fail(SFMOE_ERROR_NO_BACKEND,
                "%s: %s: tensor is in CUDA memory but no CUDA device is usable on this machine",
                context, name);
  }
  if (device < 0 || device >= count) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: %s: CUDA device %d does not exist (%d device(s) visible)", context, name,
                device, count);
  }
  return SFMOE_SUCCESS;
#else
  (void)device;
  return fail(SFMOE_ERROR_NO_BACKEND,
              "%s: %s: tensor is in CUDA memory but this build of sfmoe has no CUDA backend",
              context, name);
#endif
}

sfmoe_status validate_pointer_memory(const char* context, const char* name, const char* field,
                                     const void* pointer, sfmoe_memory memory, int32_t device) {
#if defined(SFMOE_WITH_CUDA)
  if (pointer == nullptr) return SFMOE_SUCCESS;
  int32_t pointer_device = -1;
  const cuda::PointerKind kind = cuda::classify_pointer(pointer, &pointer_device);
  if (kind == cuda::PointerKind::kDeviceMemory && memory == SFMOE_MEMORY_HOST) {
    return fail(SFMOE_ERROR_MEMORY_SPACE,
                "%s: %s: %s points to CUDA device memory but the descriptor says host memory",
                context, name, field);
  }
  if (kind == cuda::PointerKind::kHostMemory && memory == SFMOE_MEMORY_CUDA) {
    return fail(SFMOE_ERROR_MEMORY_SPACE,
                "%s: %s: %s points to host memory but the descriptor says CUDA memory", context,
                name, field);
  }
  if (kind == cuda::PointerKind::kDeviceMemory && pointer_device != device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE,
                "%s: %s: %s is on CUDA device %d but the descriptor says device %d", context, name,
                field, pointer_device, device);
  }
#else
  (void)context;
  (void)name;
  (void)field;
  (void)pointer;
  (void)memory;
  (void)device;
#endif
  return SFMOE_SUCCESS;
}

sfmoe_status validate_tensor(const char* context, const char* name, const sfmoe_tensor* t) {
  if (t == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s: descriptor pointer is NULL", context, name);
  }
  if (t->struct_size != sizeof(sfmoe_tensor)) {
    return fail(SFMOE_ERROR_STRUCT_SIZE,
                "%s: %s: struct_size is %zu but this library's sfmoe_tensor has %zu bytes "
                "(set struct_size = sizeof(sfmoe_tensor); header and library must match)",
                context, name, t->struct_size, sizeof(sfmoe_tensor));
  }
  if (!dtype_is_valid(enum_value(t->dtype))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: dtype %d is not a valid sfmoe_dtype",
                context, name, static_cast<int>(enum_value(t->dtype)));
  }
  if (t->ndim < 0 || t->ndim > SFMOE_MAX_DIMS) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: ndim %d is outside [0, %d]", context, name,
                t->ndim, SFMOE_MAX_DIMS);
  }
  // The extent (the product of the dimensions, a zero counted as one) bounds every stride, so it
  // must fit too: [0, 2^62] holds no element, but its rows are 2^62 elements apart.
  int64_t count = 1, extent = 1;
  for (int32_t d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: shape[%d] = %lld is negative", context,
                  name, d, static_cast<long long>(t->shape[d]));
    }
    if (t->shape[d] != 0 && extent > std::numeric_limits<int64_t>::max() / 64 / t->shape[d]) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: the shape's extent overflows int64",
                  context, name);
    }
    count *= t->shape[d];
    extent *= t->shape[d] != 0 ? t->shape[d] : 1;
  }
  if (t->dtype == SFMOE_DTYPE_FP4_E2M1 && t->ndim > 0 && (t->shape[t->ndim - 1] % 2) != 0) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s: fp4_e2m1 packs two elements per byte, so the innermost dimension must "
                "be even (got %lld)",
                context, name, static_cast<long long>(t->shape[t->ndim - 1]));
  }
  SFMOE_RETURN_IF_ERROR(validate_memory(context, name, t->memory, t->device));
  if (count > 0 && t->data == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s: data is NULL but the tensor has %lld elements",
                context, name, static_cast<long long>(count));
  }
  if (is_misaligned(t->data, kDataAlignment)) {
    return fail(SFMOE_ERROR_MISALIGNED, "%s: %s: data %p is not %zu-byte aligned", context, name,
                t->data, static_cast<size_t>(kDataAlignment));
  }
  return validate_pointer_memory(context, name, "data", t->data, t->memory, t->device);
}

sfmoe_status validate_grouped_tensor(const char* context, const char* name,
                                     const sfmoe_grouped_tensor* t) {
  if (t == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s: descriptor pointer is NULL", context, name);
  }
  if (t->struct_size != sizeof(sfmoe_grouped_tensor)) {
    return fail(SFMOE_ERROR_STRUCT_SIZE,
                "%s: %s: struct_size is %zu but this library's sfmoe_grouped_tensor has %zu "
                "bytes (use sfmoe_grouped_tensor_init(); header and library must match)",
                context, name, t->struct_size, sizeof(sfmoe_grouped_tensor));
  }
  if (!dtype_is_valid(enum_value(t->dtype))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: dtype %d is not a valid sfmoe_dtype",
                context, name, static_cast<int>(enum_value(t->dtype)));
  }
  if (!scaling_is_valid(enum_value(t->scaling))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: scaling %d is not a valid sfmoe_scaling",
                context, name, static_cast<int>(enum_value(t->scaling)));
  }
  const int32_t layout = enum_value(t->scale_layout);
  if (layout != SFMOE_SCALE_LAYOUT_COMPACT && layout != SFMOE_SCALE_LAYOUT_SWIZZLED &&
      layout != SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: %s: scale_layout %d is not a valid sfmoe_scale_layout", context, name,
                static_cast<int>(layout));
  }
  if (!scaling_accepts(t->scaling, t->dtype)) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: %s: scaling '%s' cannot hold dtype '%s'", context,
                name, sfmoe_scaling_name(t->scaling), sfmoe_dtype_name(t->dtype));
  }
  if (t->num_groups <= 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: num_groups is %lld; it must be >= 1",
                context, name, static_cast<long long>(t->num_groups));
  }
  if (t->row_capacity < 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: row_capacity is %lld; it must be >= 0",
                context, name, static_cast<long long>(t->row_capacity));
  }
  if (t->cols <= 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: cols is %lld; it must be >= 1", context,
                name, static_cast<long long>(t->cols));
  }
  if (t->row_alignment <= 0 || (t->row_alignment & (t->row_alignment - 1)) != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: %s: row_alignment is %lld; it must be a power of two >= 1", context, name,
                static_cast<long long>(t->row_alignment));
  }
  // (at least one row: a row's size bounds the strides even where there is none)
  if (checked_bytes(t->row_capacity > 0 ? t->row_capacity : 1, t->cols,
                    sfmoe_dtype_bits(t->dtype)) < 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: row_capacity x cols overflows int64",
                context, name);
  }
  const int64_t block_cols = scaling_block_cols(t->scaling);
  if (t->cols % block_cols != 0) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s: cols = %lld is not a multiple of the %s block width %lld", context, name,
                static_cast<long long>(t->cols), sfmoe_scaling_name(t->scaling),
                static_cast<long long>(block_cols));
  }
  if (t->dtype == SFMOE_DTYPE_FP4_E2M1 && (t->cols % 2 != 0 || t->row_capacity % 2 != 0)) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s: fp4_e2m1 packs two per byte, so cols and row_capacity must be even",
                context, name);
  }
  if (t->uniform_group_rows < 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s: uniform_group_rows is %lld (negative)",
                context, name, static_cast<long long>(t->uniform_group_rows));
  }
  if (t->uniform_group_rows > 0) {
    if (t->uniform_group_rows > t->row_capacity / t->num_groups) {
      return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                  "%s: %s: %lld groups of uniform_group_rows = %lld exceed row_capacity %lld",
                  context, name, static_cast<long long>(t->num_groups),
                  static_cast<long long>(t->uniform_group_rows),
                  static_cast<long long>(t->row_capacity));
    }
    if (t->uniform_group_rows % t->row_alignment != 0) {
      return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                  "%s: %s: uniform_group_rows = %lld is not a multiple of row_alignment %lld",
                  context, name, static_cast<long long>(t->uniform_group_rows),
                  static_cast<long long>(t->row_alignment));
    }
  } else if (t->group_offsets == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER,
                "%s: %s: group_offsets is NULL and uniform_group_rows is 0: group sizes are "
                "unknown",
                context, name);
  }
  if (t->group_offsets != nullptr && is_misaligned(t->group_offsets, alignof(int64_t))) {
    return fail(SFMOE_ERROR_MISALIGNED, "%s: %s: group_offsets %p is not 8-byte aligned", context,
                name, static_cast<const void*>(t->group_offsets));
  }
  if (t->rowwise_data == nullptr && t->columnwise_data == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s: neither rowwise_data nor columnwise_data is set",
                context, name);
  }
  const bool scaled = t->scaling != SFMOE_SCALING_NONE;
  if (scaled && t->rowwise_data != nullptr && t->rowwise_scale_inv == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER,
                "%s: %s: scaling '%s' needs rowwise_scale_inv for the rowwise copy", context, name,
                sfmoe_scaling_name(t->scaling));
  }
  if (scaled && t->columnwise_data != nullptr && t->columnwise_scale_inv == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER,
                "%s: %s: scaling '%s' needs columnwise_scale_inv for the columnwise copy", context,
                name, sfmoe_scaling_name(t->scaling));
  }
  if (!scaled && (t->rowwise_scale_inv != nullptr || t->columnwise_scale_inv != nullptr)) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH,
                "%s: %s: scale_inv pointers are set but scaling is 'none'", context, name);
  }
  struct Field {
    const char* name;
    const void* pointer;
    uintptr_t alignment;
  };
  // E8M0 / E4M3 scale arrays are bytes; FP32 scales and amax need 4-byte alignment.
  const bool byte_scales = t->scaling == SFMOE_SCALING_MX_1X32 ||
                           t->scaling == SFMOE_SCALING_NV_1X16 ||
                           t->scaling == SFMOE_SCALING_NV_16X16;
  const uintptr_t scale_alignment = byte_scales ? 1 : 4;
  const Field fields[] = {{"rowwise_data", t->rowwise_data, kDataAlignment},
                          {"columnwise_data", t->columnwise_data, kDataAlignment},
                          {"rowwise_scale_inv", t->rowwise_scale_inv, scale_alignment},
                          {"columnwise_scale_inv", t->columnwise_scale_inv, scale_alignment},
                          {"amax", t->amax, alignof(float)},
                          {"columnwise_amax", t->columnwise_amax, alignof(float)}};
  for (const Field& f : fields) {
    if (is_misaligned(f.pointer, f.alignment)) {
      return fail(SFMOE_ERROR_MISALIGNED, "%s: %s: %s %p is not %zu-byte aligned", context, name,
                  f.name, f.pointer, static_cast<size_t>(f.alignment));
    }
  }
  SFMOE_RETURN_IF_ERROR(validate_memory(context, name, t->memory, t->device));
  const Field pointer_fields[] = {{"rowwise_data", t->rowwise_data, 0},
                                  {"columnwise_data", t->columnwise_data, 0},
                                  {"rowwise_scale_inv", t->rowwise_scale_inv, 0},
                                  {"columnwise_scale_inv", t->columnwise_scale_inv, 0},
                                  {"group_offsets", t->group_offsets, 0},
                                  {"amax", t->amax, 0},
                                  {"columnwise_amax", t->columnwise_amax, 0}};
  for (const Field& f : pointer_fields) {
    SFMOE_RETURN_IF_ERROR(
        validate_pointer_memory(context, name, f.name, f.pointer, t->memory, t->device));
  }
  return SFMOE_SUCCESS;
}

sfmoe_status expect_tensor(const char* context, const char* name, const sfmoe_tensor* t,
                           std::initializer_list<sfmoe_dtype> dtypes,
                           std::initializer_list<int64_t> shape, const sfmoe_tensor* home,
                           const char* home_name) {
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, name, t));
  bool dtype_ok = false;
  for (sfmoe_dtype d : dtypes) dtype_ok = dtype_ok || t->dtype == d;
  if (!dtype_ok) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: %s has dtype '%s', expected '%s'%s", context, name,
                sfmoe_dtype_name(t->dtype), sfmoe_dtype_name(*dtypes.begin()),
                dtypes.size() > 1 ? " or another accepted one (see the header)" : "");
  }
  bool shape_ok = t->ndim == static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t extent : shape) shape_ok = shape_ok && t->shape[d++] == extent;
  if (!shape_ok) {
    std::string want, got;
    for (int64_t extent : shape) want += (want.empty() ? "" : ", ") + std::to_string(extent);
    for (int32_t i = 0; i < t->ndim && i < SFMOE_MAX_DIMS; ++i)
      got += (i ? ", " : "") + std::to_string(t->shape[i]);
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: %s must be [%s] but is [%s]", context, name,
                want.c_str(), got.c_str());
  }
  if (home != nullptr && (t->memory != home->memory || t->device != home->device)) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the same memory space as %s", context,
                name, home_name);
  }
  return SFMOE_SUCCESS;
}

sfmoe_status expect_scalar(const char* context, const char* name, const sfmoe_tensor* t,
                           const sfmoe_tensor* home, const char* home_name) {
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, name, t));
  if (t->dtype != SFMOE_DTYPE_FP32 || tensor_element_count(t) != 1) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: %s must be one fp32 element", context, name);
  }
  if (t->memory != home->memory || t->device != home->device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the same memory space as %s", context,
                name, home_name);
  }
  return SFMOE_SUCCESS;
}

sfmoe_status expect_unquantized_rows(const char* context, const char* name,
                                     const sfmoe_grouped_tensor* t, int64_t cols) {
  SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, name, t));
  if (t->scaling != SFMOE_SCALING_NONE ||
      (t->dtype != SFMOE_DTYPE_FP32 && t->dtype != SFMOE_DTYPE_BF16 &&
       t->dtype != SFMOE_DTYPE_FP16)) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: %s must hold unquantized fp32, bf16 or fp16 rows",
                context, name);
  }
  if (t->rowwise_data == nullptr || t->columnwise_data != nullptr) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s must have rowwise data only", context, name);
  }
  if (t->cols != cols) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: %s has %lld cols, expected %lld", context, name,
                static_cast<long long>(t->cols), static_cast<long long>(cols));
  }
  return SFMOE_SUCCESS;
}

sfmoe_status check_host_group_offsets(const char* context, const char* name,
                                      const sfmoe_grouped_tensor* t) {
  if (t->group_offsets == nullptr || t->uniform_group_rows != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s must be grouped by group_offsets", context,
                name);
  }
  sfmoe_fault_report report{0, 0, -1, 0};
  for (int64_t g = 0; g < t->num_groups && report.flags == 0; ++g) {
    check_group(t->group_offsets, g, t->row_capacity, t->row_alignment, &report);
  }
  if (report.flags != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: %s group_offsets break the grouped-tensor contract at group %lld (value "
                "%lld): %s",
                context, name, static_cast<long long>(report.first_group),
                static_cast<long long>(report.first_value),
                (report.flags & SFMOE_FAULT_GROUP_OVER_CAPACITY) ? "beyond row_capacity"
                                                                 : "decreasing, misaligned or not "
                                                                   "starting at 0");
  }
  return SFMOE_SUCCESS;
}

sfmoe_status check_word(const char* context, const sfmoe_status_word* word, sfmoe_memory memory,
                        int32_t device) {
  if (word != nullptr && (word->memory != memory || word->device != device)) {
    return fail(SFMOE_ERROR_MEMORY_SPACE,
                "%s: the status word and the tensors are in different memory spaces", context);
  }
  return SFMOE_SUCCESS;
}

sfmoe_status expect_workspace(const char* context, const sfmoe_tensor* workspace, int64_t bytes,
                              const char* size_function, const sfmoe_tensor* home,
                              const char* home_name) {
  if (bytes < 0) {  // (the size function's answer for sizes whose workspace overflows int64)
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: the sizes' workspace overflows int64 (see %s)",
                context, size_function);
  }
  if (workspace == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: the device needs a workspace of %lld bytes (see %s)",
                context, static_cast<long long>(bytes), size_function);
  }
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, "workspace", workspace));
  const int64_t held =
      checked_bytes(tensor_element_count(workspace), 1, sfmoe_dtype_bits(workspace->dtype));
  if (workspace->ndim != 1 || held < bytes) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: workspace must be a 1-D tensor of at least %lld bytes (see %s), got %lld",
                context, static_cast<long long>(bytes), size_function,
                static_cast<long long>(held));
  }
  if (home != nullptr && (workspace->memory != home->memory || workspace->device != home->device)) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: workspace is not in the memory space of %s", context,
                home_name);
  }
  return SFMOE_SUCCESS;
}

sfmoe_status expect_planned_buffer(const char* context, const char* name, const sfmoe_tensor* t,
                                   int64_t bytes, const char* plan_function, sfmoe_memory memory,
                                   int32_t device) {
  if (t == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s is NULL; it takes %lld bytes (%s)", context, name,
                static_cast<long long>(bytes), plan_function);
  }
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, name, t));
  const int64_t held = checked_bytes(tensor_element_count(t), 1, sfmoe_dtype_bits(t->dtype));
  if (t->ndim != 1 || held < bytes) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s must be a 1-D tensor of at least %lld bytes (%s), got %lld", context, name,
                static_cast<long long>(bytes), plan_function, static_cast<long long>(held));
  }
  if (t->memory != memory || t->device != device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the memory space of the call", context,
                name);
  }
  return SFMOE_SUCCESS;
}

sfmoe_status check_offsets_on_stream(const sfmoe_grouped_tensor* t, sfmoe_status_word* word,
                                     void* stream) {
  if (word == nullptr || t->group_offsets == nullptr) return SFMOE_SUCCESS;
  const GroupOffsetsCheckArgs args{t->group_offsets, t->num_groups, t->row_capacity,
                                   t->row_alignment, word->word};
  return ops::backend_for(t->memory).check_group_offsets(args, stream);
}

}  // namespace sfmoe
