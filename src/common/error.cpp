// The thread-local last-error message behind the C API (src/common/error.h).
#include "src/common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

namespace sfmoe {
namespace {

thread_local char g_last_error[1024] = "";
// Whether g_last_error holds a reason report() left that no API call has worded yet.
thread_local bool g_reason_pending = false;

void record(const char* format, va_list args) {
  vsnprintf(g_last_error, sizeof(g_last_error), format, args);
}

}  // namespace

sfmoe_status fail(sfmoe_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  record(format, args);
  va_end(args);
  g_reason_pending = false;
  return status;
}

sfmoe_status report(sfmoe_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  record(format, args);
  va_end(args);
  g_reason_pending = true;
  return status;
}

void word_reported_reason(const char* function) {
  if (!g_reason_pending) return;
  // Shifted right in place behind "function: " (the tail is cut at the buffer's end).
  const size_t prefix = strlen(function) + 2;
  const size_t length = strlen(g_last_error);
  if (prefix < sizeof(g_last_error)) {
    const size_t kept =
        length + prefix < sizeof(g_last_error) ? length : sizeof(g_last_error) - 1 - prefix;
    memmove(g_last_error + prefix, g_last_error, kept);
    g_last_error[prefix + kept] = '\0';
    memcpy(g_last_error, function, prefix - 2);
    g_last_error[prefix - 2] = ':';
    g_last_error[prefix - 1] = ' ';
  }
  g_reason_pending = false;
}

const char* last_error_message() { return g_last_error; }

void clear_last_error_message() {
  g_last_error[0] = '\0';
  g_reason_pending = false;
}

}  // namespace sfmoe
