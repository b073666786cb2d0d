// Included once by each fuzz target that parses protobuf messages: protobuf
// logs an error for every string field that is not UTF-8, which the fuzzer
// produces by the million (hundreds of MB of log a minute). The parse still
// fails as it should; only the log is dropped.
#pragma once

#include <google/protobuf/stubs/logging.h>

namespace asympo::fuzz {

inline const bool kProtobufQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

}  // namespace asympo::fuzz
