// Test certificates made by openssl (tests/testing/make_certs.sh) once per
// test program, in a temporary directory removed at exit. Needs
// ASYMPO_SOURCE_DIR defined to the source tree. Not thread-safe on first
// use.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"

namespace asympo::testing {

class TestCertificates {
 public:
  // The directory's file `name` (e.g. "ca.pem"); the certificates are made
  // on the first call. Empty (and a test failure) when openssl failed.
  static std::string Path(const std::string& name) {
    static std::unique_ptr<ScopedTempDir> dir = Make();
    return dir == nullptr ? "" : dir->Path(name);
  }

 private:
  static std::unique_ptr<ScopedTempDir> Make() {
    auto dir = std::make_unique<ScopedTempDir>("certs");
    const std::string command = std::string(ASYMPO_SOURCE_DIR) + "/tests/testing/make_certs.sh " +
                                dir->path() + " >/dev/null";
    if (std::system(command.c_str()) != 0) {
      ADD_FAILURE() << "could not make the test certificates: " << command;
      return nullptr;
    }
    return dir;
  }
};

}  // namespace asympo::testing
