// Test helper: what a server sent back in a call's trailing metadata.
#pragma once

#include <string>

#include <grpcpp/grpcpp.h>

namespace asympo::testing {

// The value of trailing metadata `key` of a finished call; empty when absent.
inline std::string Trailing(const grpc::ClientContext& ctx, const std::string& key) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find(key);
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

}  // namespace asympo::testing
