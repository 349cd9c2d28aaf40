// Status and thread-local error message plumbing behind the C API.
#pragma once

#include <exception>
#include <new>

#include "sfmoe/sfmoe.h"
#include "src/common/outcome.h"

namespace sfmoe {

// Records a printf-style message as this thread's last error and returns `status`: the API
// layer's wording, which names the public call.
sfmoe_status fail(sfmoe_status status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

// Records the reason of a failure found below the API layer (a backend's launcher), which names
// no public function, and returns `status`. The API call it returns through words the message
// (guarded() prefixes the call's name), so one launcher serves every caller.
sfmoe_status report(sfmoe_status status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

// After a failed call: a reason report() left, and no message worded since, becomes
// "function: reason".
void word_reported_reason(const char* function);

// Inside a composition (the MoE layer): a pending reason becomes "step: reason" and stays pending,
// so that the public call still prefixes its name.
void name_reported_step(const char* step);

// This thread's last message, and clearing it (sfmoe_last_error, sfmoe_clear_last_error).
const char* last_error_message();
void clear_last_error_message();

// A refusal reported by an internal layer, worded as the call `context`'s error.
inline sfmoe_status fail_with(const char* context, const Outcome& outcome) {
  return fail(outcome.status, "%s: %s", context, outcome.reason);
}

// Runs an API body, turning any C++ exception into a status so none crosses extern "C".
template <class Body>
sfmoe_status guarded(const char* function, Body&& body) noexcept {
  try {
    const sfmoe_status status = body();
    if (status != SFMOE_SUCCESS) word_reported_reason(function);
    return status;
  } catch (const std::bad_alloc&) {
    return fail(SFMOE_ERROR_OUT_OF_MEMORY, "%s: host memory allocation failed", function);
  } catch (const std::exception& e) {
    return fail(SFMOE_ERROR_INTERNAL, "%s: internal error: %s", function, e.what());
  } catch (...) {
    return fail(SFMOE_ERROR_INTERNAL, "%s: internal error (unknown exception)", function);
  }
}

#define SFMOE_RETURN_IF_ERROR(expr)               \
  do {                                            \
    const sfmoe_status status_ = (expr);          \
    if (status_ != SFMOE_SUCCESS) return status_; \
  } while (0)

}  // namespace sfmoe
