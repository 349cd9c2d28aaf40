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

namespace {

// Shifts the pending reason right in place behind "prefix: " (the tail is cut at the buffer's
// end).
void prefix_pending_reason(const char* prefix) {
  const size_t room = strlen(prefix) + 2;
  const size_t length = strlen(g_last_error);
  if (room < sizeof(g_last_error)) {
    const size_t kept =
        length + room < sizeof(g_last_error) ? length : sizeof(g_last_error) - 1 - room;
    memmove(g_last_error + room, g_last_error, kept);
    g_last_error[room + kept] = '\0';
    memcpy(g_last_error, prefix, room - 2);
    g_last_error[room - 2] = ':';
    g_last_error[room - 1] = ' ';
  }
}

}  // namespace

void word_reported_reason(const char* function) {
  if (!g_reason_pending) return;
  prefix_pending_reason(function);
  g_reason_pending = false;
}

void name_reported_step(const char* step) {
  if (g_reason_pending) prefix_pending_reason(step);
}

const char* last_error_message() { return g_last_error; }

void clear_last_error_message() {
  g_last_error[0] = '\0';
  g_reason_pending = false;
}

}  // namespace sfmoe
