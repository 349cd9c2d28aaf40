// How the binding files turn a failed C API status into a Python exception: CApiError carries the
// library's own message to the translator that sfmoe_python.cpp registers (sfmoe.Error).
#pragma once

#include <stdexcept>

#include "sfmoe/sfmoe.h"

namespace sfmoe_binding {

// A failed C API call. The message is captured at once: the library keeps one per thread and the
// next failing call replaces it.
class CApiError : public std::runtime_error {
 public:
  explicit CApiError(sfmoe_status status)
      : std::runtime_error(sfmoe_last_error()), status_(status) {}
  sfmoe_status status() const { return status_; }

 private:
  sfmoe_status status_;
};

inline void check(sfmoe_status status) {
  if (status != SFMOE_SUCCESS) throw CApiError(status);
}

}  // namespace sfmoe_binding
