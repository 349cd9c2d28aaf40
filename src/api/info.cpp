// Build and device information.
#include <stdio.h>
#include <string.h>

#include "src/api/validate.h"
#include "src/common/error.h"
#if defined(SFMOE_WITH_CUDA)
#include "src/cuda/backend.h"
#endif

#ifndef SFMOE_CUDA_ARCHS
#define SFMOE_CUDA_ARCHS ""
#endif

namespace {

// An info struct the caller sized (struct_size = sizeof), cleared for the call to fill.
template <class Info>
sfmoe_status cleared(const char* context, Info* info, const char* how) {
  SFMOE_RETURN_IF_ERROR(sfmoe::check_struct(context, "info", info, how));
  memset(info, 0, sizeof(*info));
  info->struct_size = sizeof(*info);
  return SFMOE_SUCCESS;
}

}  // namespace

extern "C" {

sfmoe_status sfmoe_get_build_info(sfmoe_build_info* info) {
  const char* context = "sfmoe_get_build_info";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(cleared(context, info, "sizeof(sfmoe_build_info) as struct_size"));
    info->version_major = SFMOE_VERSION_MAJOR;
    info->version_minor = SFMOE_VERSION_MINOR;
    info->version_patch = SFMOE_VERSION_PATCH;
#if defined(SFMOE_WITH_CUDA)
    info->has_cuda_backend = 1;
    info->cuda_compiled_version = sfmoe::cuda::compiled_cuda_version();
#endif
    snprintf(info->cuda_archs, sizeof(info->cuda_archs), "%s", SFMOE_CUDA_ARCHS);
#if defined(__clang__)
    snprintf(info->compiler, sizeof(info->compiler), "clang %s", __clang_version__);
#elif defined(__GNUC__)
    snprintf(info->compiler, sizeof(info->compiler), "gcc %d.%d.%d", __GNUC__, __GNUC_MINOR__,
             __GNUC_PATCHLEVEL__);
#endif
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_get_device_info(sfmoe_device_info* info) {
  const char* context = "sfmoe_get_device_info";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(cleared(context, info, "sizeof(sfmoe_device_info) as struct_size"));
#if defined(SFMOE_WITH_CUDA)
    return sfmoe::cuda::fill_device_info(info);
#else
    return SFMOE_SUCCESS;
#endif
  });
}

}  // extern "C"
