// The device status word: creation, reset, snapshot, read, and the group-offset check op.
#include <stdlib.h>

#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#if defined(SFMOE_WITH_CUDA)
#include "src/cuda/backend.h"
#endif

namespace {

void clear_report(sfmoe_fault_report* r) {
  r->flags = 0;
  r->count = 0;
  r->first_group = -1;
  r->first_value = 0;
}

sfmoe_status check_word(const char* context, const sfmoe_status_word* word) {
  if (word == nullptr) {
    return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: status word is NULL", context);
  }
  return SFMOE_SUCCESS;
}

}  // namespace

extern "C" {

sfmoe_status sfmoe_status_word_create(sfmoe_memory memory, int32_t device,
                                      sfmoe_status_word** out) {
  const char* context = "sfmoe_status_word_create";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (out == nullptr) return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: out is NULL", context);
    *out = nullptr;
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_memory(context, "status word", memory, device));
    auto* word = new sfmoe_status_word{memory, device, nullptr, nullptr};
    if (memory == SFMOE_MEMORY_HOST) {
      word->word = new sfmoe_fault_report;
      word->mirror = word->word;
      clear_report(word->word);
    } else {
#if defined(SFMOE_WITH_CUDA)
      const sfmoe_status status =
          sfmoe::cuda::status_word_allocate(device, &word->word, &word->mirror);
      if (status != SFMOE_SUCCESS) {
        delete word;
        return status;
      }
      clear_report(word->mirror);
#endif
    }
    *out = word;
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_status_word_destroy(sfmoe_status_word* word) {
  return sfmoe::guarded("sfmoe_status_word_destroy", [&]() -> sfmoe_status {
    if (word == nullptr) return SFMOE_SUCCESS;
    if (word->memory == SFMOE_MEMORY_HOST) {
      delete word->word;
    } else {
#if defined(SFMOE_WITH_CUDA)
      sfmoe::cuda::status_word_free(word->device, word->word, word->mirror);
#endif
    }
    delete word;
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_status_word_reset(sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_status_word_reset";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(check_word(context, word));
    if (word->memory == SFMOE_MEMORY_HOST) {
      clear_report(word->word);
      return SFMOE_SUCCESS;
    }
#if defined(SFMOE_WITH_CUDA)
    return sfmoe::cuda::status_word_reset(word->word, stream);
#else
    (void)stream;
    return SFMOE_ERROR_INTERNAL;
#endif
  });
}

sfmoe_status sfmoe_status_word_snapshot(sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_status_word_snapshot";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(check_word(context, word));
    if (word->memory == SFMOE_MEMORY_HOST) return SFMOE_SUCCESS;
#if defined(SFMOE_WITH_CUDA)
    return sfmoe::cuda::status_word_snapshot(word->word, word->mirror, stream);
#else
    (void)stream;
    return SFMOE_ERROR_INTERNAL;
#endif
  });
}

sfmoe_status sfmoe_status_word_read(const sfmoe_status_word* word, sfmoe_fault_report* report) {
  const char* context = "sfmoe_status_word_read";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(check_word(context, word));
    if (report == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: report is NULL", context);
    }
    *report = *word->mirror;
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_check_group_offsets(const sfmoe_grouped_tensor* tensor, sfmoe_status_word* word,
                                       void* stream) {
  const char* context = "sfmoe_check_group_offsets";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_grouped_tensor(context, "tensor", tensor));
    SFMOE_RETURN_IF_ERROR(check_word(context, word));
    if (word->memory != tensor->memory || word->device != tensor->device) {
      return sfmoe::fail(SFMOE_ERROR_MEMORY_SPACE,
                         "%s: the status word and the tensor are in different memory spaces",
                         context);
    }
    // (uniform groups have no offsets: nothing to check)
    return sfmoe::check_offsets_on_stream(tensor, word, stream);
  });
}

}  // extern "C"
