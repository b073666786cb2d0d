// Removes a file or a directory tree without std::filesystem.
//
// The LibTorch inside PyTorch >= 2.5 wheels exports its own copies of
// libstdc++'s std::filesystem directory iterators (pytorch/pytorch#133437).
// A learner linked against it died with SIGSEGV the first time it pruned an
// old checkpoint (fs::remove_all over a non-empty directory; seen on a GPU
// node with PyTorch 2.11, docs/operations.md), though listing, creating and
// renaming worked. RemoveTree walks the tree with POSIX calls alone.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace asympo {

// Removes `path` and, when it is a directory, everything under it. Symbolic
// links are removed, never followed. A missing path is not an error. On an
// error the walk goes on and removes what it can; the status names the first
// path that could not be removed and why.
absl::Status RemoveTree(const std::string& path);

}  // namespace asympo
