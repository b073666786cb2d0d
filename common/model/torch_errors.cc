#include "common/model/torch_errors.h"

#include <new>
#include <string>

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace asympo {
namespace {

// The message without LibTorch's backtrace: the first non-empty line.
std::string FirstLine(const char* message) {
  absl::string_view m(message == nullptr ? "" : message);
  while (!m.empty() && (m.front() == '\n' || m.front() == ' ')) m.remove_prefix(1);
  const size_t end = m.find('\n');
  return std::string(end == absl::string_view::npos ? m : m.substr(0, end));
}

}  // namespace

absl::Status StatusFromException(const std::exception& e, absl::string_view what) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of memory: ", FirstLine(oom->what_without_backtrace())));
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory: ", e.what()));
  }
  if (const auto* err = dynamic_cast<const c10::Error*>(&e)) {
    const std::string message = FirstLine(err->what_without_backtrace());
    if (dynamic_cast<const c10::IndexError*>(&e) != nullptr ||
        dynamic_cast<const c10::ValueError*>(&e) != nullptr ||
        dynamic_cast<const c10::TypeError*>(&e) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", message));
    }
    return absl::InternalError(absl::StrCat(what, ": ", message));
  }
  return absl::InternalError(absl::StrCat(what, ": ", FirstLine(e.what())));
}

absl::Status StatusFromUnknownException(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": unknown exception"));
}

}  // namespace asympo
