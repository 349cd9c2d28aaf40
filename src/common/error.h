// Status and thread-local error message plumbing behind the C API.
#pragma once

#include <exception>
#include <new>

#include "sfmoe/sfmoe.h"
#include "src/common/outcome.h"

namespace sfmoe {

// Records a printf-style message as this thread's last error and returns `status`.
sfmoe_status fail(sfmoe_status status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

// A refusal reported by an internal layer, worded as the call `context`'s error.
inline sfmoe_status fail_with(const char* context, const Outcome& outcome) {
  return fail(outcome.status, "%s: %s", context, outcome.reason);
}

// Runs an API body, turning any C++ exception into a status so none crosses extern "C".
template <class Body>
sfmoe_status guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
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
