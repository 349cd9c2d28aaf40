// The guarded arena (tests/cpp/guarded_arena.h).
#include "tests/cpp/guarded_arena.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace sfmoe {
namespace testing {

namespace {

constexpr size_t kGuard = 512;  // keeps each buffer 256-byte aligned after the leading guard
uint8_t guard_byte(size_t i) { return static_cast<uint8_t>(0xA5u + 37u * i); }

}  // namespace

Arena::~Arena() = default;

void Arena::release_all() {
  if (word_ != nullptr) sfmoe_status_word_destroy(word_);
  word_ = nullptr;
  for (Block& b : blocks_) raw_free(b.base);
  blocks_.clear();
}

void* Arena::place(const void* src, size_t bytes, bool input, uint8_t fill) {
  Block b;
  b.bytes = bytes;
  b.input = input;
  b.base = static_cast<uint8_t*>(raw_alloc(kGuard + bytes + kGuard));
  std::vector<uint8_t> image(kGuard + bytes + kGuard);
  for (size_t i = 0; i < kGuard; ++i) image[i] = image[kGuard + bytes + i] = guard_byte(i);
  if (src != nullptr) {
    memcpy(image.data() + kGuard, src, bytes);
  } else {
    memset(image.data() + kGuard, fill, bytes);
  }
  b.contents.assign(image.begin() + kGuard, image.begin() + kGuard + bytes);
  copy_in(b.base, image.data(), image.size());
  blocks_.push_back(std::move(b));
  return blocks_.back().base + kGuard;
}

void* Arena::out(size_t bytes, uint8_t fill) { return place(nullptr, bytes, false, fill); }

bool Arena::untouched(const void* buffer) {
  for (const Block& b : blocks_) {
    if (b.base + kGuard != buffer) continue;
    std::vector<uint8_t> now = get<uint8_t>(buffer, b.bytes);
    return now == b.contents;
  }
  ADD_FAILURE() << "untouched(): not a buffer of this arena";
  return false;
}

sfmoe_status_word* Arena::word() {
  if (word_ == nullptr) {
    EXPECT_EQ(sfmoe_status_word_create(memory(), 0, &word_), SFMOE_SUCCESS) << sfmoe_last_error();
  }
  return word_;
}

sfmoe_fault_report Arena::fault() {
  sfmoe_fault_report report{};
  EXPECT_EQ(sfmoe_status_word_snapshot(word(), stream()), SFMOE_SUCCESS);
  sync();
  EXPECT_EQ(sfmoe_status_word_read(word(), &report), SFMOE_SUCCESS);
  return report;
}

std::string Arena::damage() {
  sync();
  std::string found;
  for (size_t n = 0; n < blocks_.size(); ++n) {
    const Block& b = blocks_[n];
    std::vector<uint8_t> image(kGuard + b.bytes + kGuard);
    copy_out(image.data(), b.base, image.size());
    for (size_t i = 0; i < kGuard; ++i) {
      if (image[i] != guard_byte(i)) {
        found += "buffer " + std::to_string(n) + ": guard before it written at -" +
                 std::to_string(kGuard - i) + "; ";
        break;
      }
    }
    for (size_t i = 0; i < kGuard; ++i) {
      if (image[kGuard + b.bytes + i] != guard_byte(i)) {
        found += "buffer " + std::to_string(n) + " (" + std::to_string(b.bytes) +
                 " bytes): guard after it written at +" + std::to_string(i) + "; ";
        break;
      }
    }
    if (b.input && memcmp(image.data() + kGuard, b.contents.data(), b.bytes) != 0) {
      found += "input buffer " + std::to_string(n) + " changed; ";
    }
  }
  return found;
}

void* HostArena::raw_alloc(size_t bytes) { return aligned_alloc(256, (bytes + 255) / 256 * 256); }
void HostArena::raw_free(void* p) { free(p); }

}  // namespace testing
}  // namespace sfmoe
