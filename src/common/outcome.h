// What the internal layers (planners, backends) report: a status and, on failure, a short reason.
// The reason names no public function: the API layer that called words the message, prefixing the
// call's name (sfmoe::fail_with in src/common/error.h), and a layer step can name its step instead.
#pragma once

#include <stdarg.h>
#include <stdio.h>

#include "sfmoe/sfmoe.h"

namespace sfmoe {

struct Outcome {
  sfmoe_status status = SFMOE_SUCCESS;
  char reason[224] = "";

  bool ok() const { return status == SFMOE_SUCCESS; }
};

inline Outcome refuse(sfmoe_status status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
inline Outcome refuse(sfmoe_status status, const char* format, ...) {
  Outcome o;
  o.status = status;
  va_list args;
  va_start(args, format);
  vsnprintf(o.reason, sizeof(o.reason), format, args);
  va_end(args);
  return o;
}

#define SFMOE_RETURN_IF_REFUSED(expr)    \
  do {                                   \
    ::sfmoe::Outcome outcome_ = (expr);  \
    if (!outcome_.ok()) return outcome_; \
  } while (0)

}  // namespace sfmoe
