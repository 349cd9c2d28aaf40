// The layout-planning functions of the C API (sfmoe.h, "layout planning") as _C functions that take
// a request dict and return the plan as a dict, so that the Python package allocates what the
// library plans and states no size rule of its own. Framework-free: plain Python objects only.
#pragma once

#include <nanobind/nanobind.h>

namespace sfmoe_binding {

void register_planning(nanobind::module_& m);

}  // namespace sfmoe_binding
