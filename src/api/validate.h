// Host-side descriptor checks shared by every entry point. They read descriptors only, never the
// data, so they cost no device work and are safe inside graph capture.
#pragma once

#include <string.h>

#include <initializer_list>

#include "sfmoe/sfmoe.h"

namespace sfmoe {

// A config struct with every field zero and struct_size set: where each *_config_init starts.
template <class Config>
Config sized_zero_config() {
  Config c;
  memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  return c;
}

// A config, request or info struct the caller made with `init_name` (or sized with sizeof):
// SFMOE_ERROR_NULL_POINTER when NULL, SFMOE_ERROR_STRUCT_SIZE when its struct_size is not this
// library's (a header/library mismatch).
sfmoe_status check_struct_size(const char* context, const char* name, const void* s,
                               size_t struct_size, size_t expected, const char* init_name);
template <class Struct>
sfmoe_status check_struct(const char* context, const char* name, const Struct* s,
                          const char* init_name) {
  return check_struct_size(context, name, s, s ? s->struct_size : 0, sizeof(Struct), init_name);
}

// The integer a caller stored in an enum field or argument. The C API's enums come from C code,
// where any int is allowed; loading one outside the enumeration's range as the C++ enum type is
// undefined behaviour, so validation reads the integer and compares it before trusting the enum.
template <class Enum>
int32_t enum_value(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "the API's enums are int-sized");
  int32_t value;
  memcpy(&value, &field, sizeof(value));
  return value;
}

// Data alignment every tensor must have: 16-byte vector accesses and TMA.
constexpr uintptr_t kDataAlignment = 16;

sfmoe_status validate_tensor(const char* context, const char* name, const sfmoe_tensor* t);
sfmoe_status validate_grouped_tensor(const char* context, const char* name,
                                     const sfmoe_grouped_tensor* t);
// Checks that `memory`/`device` can be served by a backend of this build on this machine.
sfmoe_status validate_memory(const char* context, const char* name, const sfmoe_memory& memory,
                             int32_t device);
// Checks that a pointer really lives where the descriptor says (when the runtime can tell).
sfmoe_status validate_pointer_memory(const char* context, const char* name, const char* field,
                                     const void* pointer, sfmoe_memory memory, int32_t device);
int64_t tensor_element_count(const sfmoe_tensor* t);

// A valid tensor of one of `dtypes` (the first is named in the message), exactly `shape`, and in
// the memory space of `home` (named `home_name`) when `home` is not NULL.
sfmoe_status expect_tensor(const char* context, const char* name, const sfmoe_tensor* t,
                           std::initializer_list<sfmoe_dtype> dtypes,
                           std::initializer_list<int64_t> shape, const sfmoe_tensor* home,
                           const char* home_name);
// A valid grouped tensor of unquantized rows (FP32, BF16 or FP16, scaling NONE, rowwise data
// only) with `cols` columns.
sfmoe_status expect_unquantized_rows(const char* context, const char* name,
                                     const sfmoe_grouped_tensor* t, int64_t cols);
// Host-side group offsets read and checked with the shared rule of src/common/group_offsets.h
// (check_group) before anything is written; SFMOE_ERROR_INVALID_ARGUMENT on the first fault.
sfmoe_status check_host_group_offsets(const char* context, const char* name,
                                      const sfmoe_grouped_tensor* t);
// A device workspace: a valid 1-D tensor of any dtype holding at least `bytes` bytes beside `home`;
// SFMOE_ERROR_NULL_POINTER naming `size_function` (the API call that sizes it) when it is NULL.
sfmoe_status expect_workspace(const char* context, const sfmoe_tensor* workspace, int64_t bytes,
                              const char* size_function, const sfmoe_tensor* home,
                              const char* home_name);
// A buffer the caller allocated from a plan in bytes (the MoE layer's saved state and workspace, an
// EP handle): a valid 1-D tensor of any dtype holding at least `bytes`, in `memory` on `device`;
// a NULL or short one is refused naming `plan_function`, which gives the size.
sfmoe_status expect_planned_buffer(const char* context, const char* name, const sfmoe_tensor* t,
                                   int64_t bytes, const char* plan_function, sfmoe_memory memory,
                                   int32_t device);
// With a status word, a tensor's group offsets checked by its backend (on the device on the stream:
// faults go to the word, nothing is read back, sync-free); nothing to do without one.
sfmoe_status check_offsets_on_stream(const sfmoe_grouped_tensor* t, sfmoe_status_word* word,
                                     void* stream);
// A status word (or NULL) in the tensors' memory space.
sfmoe_status check_word(const char* context, const sfmoe_status_word* word, sfmoe_memory memory,
                        int32_t device);
// A valid one-element FP32 tensor in the memory space of `home`.
sfmoe_status expect_scalar(const char* context, const char* name, const sfmoe_tensor* t,
                           const sfmoe_tensor* home, const char* home_name);

}  // namespace sfmoe
