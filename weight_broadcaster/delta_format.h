// The parts of the delta format (delta_codec.h) that its encoder
// (delta_encode.cc) and its reader (delta_codec.cc) share.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace asympo::broadcast {

inline constexpr char kDeltaMagic[4] = {'A', 'S', 'D', '1'};     // values whole
inline constexpr char kDeltaXorMagic[4] = {'A', 'S', 'D', '2'};  // XOR planes

inline bool ValidDeltaWordBytes(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

inline absl::Status DeltaError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("delta: ", what));
}

}  // namespace asympo::broadcast
