// All of sfmoe's numerics in one include: header-only, __host__ __device__, bit-exact on both.
#pragma once

#include "sfmoe/numerics/bits.h"
#include "sfmoe/numerics/elementary.h"
#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/numerics/hadamard.h"
#include "sfmoe/numerics/random.h"
#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/numerics/scaling.h"
