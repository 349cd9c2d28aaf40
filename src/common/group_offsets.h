// The group-offset contract (sfmoe.h, grouped tensors), checked the same way on host and device.
// Every grouped kernel bounds its rows with clamp_group_rows so that bad offsets can never make it
// read or write outside [0, row_capacity); check_group records what was wrong.
#pragma once

#include "src/common/fault.h"

namespace sfmoe {

// One check of a grouped tensor's offsets against its bounds (sfmoe_check_group_offsets).
struct GroupOffsetsCheckArgs {
  const int64_t* offsets;  // [num_groups + 1]
  int64_t num_groups, row_capacity, row_alignment;
  sfmoe_fault_report* word;
};

struct GroupRows {
  int64_t begin;
  int64_t end;  // begin <= end <= row_capacity always
};

// Rows of group g, clamped into [0, row_capacity] and made non-decreasing.
SFMOE_HD GroupRows clamp_group_rows(const int64_t* offsets, int64_t g, int64_t row_capacity) {
  int64_t begin = offsets[g];
  int64_t end = offsets[g + 1];
  begin = begin < 0 ? 0 : (begin > row_capacity ? row_capacity : begin);
  end = end < begin ? begin : (end > row_capacity ? row_capacity : end);
  return GroupRows{begin, end};
}

// A group's count of real rows clamped into its block, [0, block_rows]. A count outside it is a
// fault the caller reports once per group: SFMOE_FAULT_GROUP_OVER_CAPACITY, the group and the
// given count.
SFMOE_HD int64_t clamp_real_rows(int64_t given, int64_t block_rows) {
  return given < 0 ? 0 : (given > block_rows ? block_rows : given);
}

// Checks the entries owned by group g (its start, and its end) and raises faults in `word`.
// Group 0 also checks offsets[0] == 0.
SFMOE_HD void check_group(const int64_t* offsets, int64_t g, int64_t row_capacity,
                          int64_t row_alignment, sfmoe_fault_report* word) {
  const int64_t begin = offsets[g];
  const int64_t end = offsets[g + 1];
  if (g == 0 && begin != 0) raise_fault(word, SFMOE_FAULT_BAD_GROUP_OFFSETS, g, begin);
  if (end < begin) raise_fault(word, SFMOE_FAULT_BAD_GROUP_OFFSETS, g, end);
  if (begin % row_alignment != 0) raise_fault(word, SFMOE_FAULT_BAD_GROUP_OFFSETS, g, begin);
  if (end > row_capacity) raise_fault(word, SFMOE_FAULT_GROUP_OVER_CAPACITY, g, end);
}

// The group holding row r < offsets[G]: the last g with offsets[g] <= r (empty groups share their
// offset with the next one and are skipped this way). `offsets` may be any copy of the offsets, or
// any other non-decreasing prefix such as a group's first tile (kernels search a copy staged in
// shared memory, of int64_t or a narrower integer).
template <class Offset>
SFMOE_HD int64_t group_of_offset_row(const Offset* offsets, int64_t num_groups, int64_t r) {
  int64_t lo = 0, hi = num_groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace sfmoe
