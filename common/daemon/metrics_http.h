// The HTTP/1.x side of MetricsEndpoint (metrics_endpoint.h): judging the
// bytes a client has sent so far, strictly, and writing whole responses.
// Only the endpoint uses it. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace asympo::daemon::http {

// The most a request head may have, its final blank line included.
inline constexpr size_t kMaxRequestHead = 8192;

// What to do with a client's bytes.
struct Verdict {
  enum class Kind {
    kIncomplete,  // wait for more
    kScrape,      // a well-formed GET or HEAD of /metrics
    kReady,       // a well-formed GET or HEAD of /ready (the readiness check)
    kAnswer,      // send `answer` and close
  };
  Kind kind = Kind::kIncomplete;
  // Whether the request was HEAD: its answer has no body.
  bool head_only = false;
  // kAnswer: the whole response.
  std::string answer;
};

// Judges `received`, every byte the client has sent so far (reading more
// than kMaxRequestHead + 1 is never needed); `eof` when it will send no
// more. The head is the request line and header lines, each ending in
// CRLF, then CRLF. kAnswer with
// - 400 when the request line is not exactly `method SP path SP
//   HTTP/1.<digit> CRLF` (method an RFC 9110 token, path starting with
//   '/' and made of visible ASCII), when a CR or LF stands alone, or when
//   the client ends before the head does (`eof`);
// - 431 when the head goes past kMaxRequestHead bytes;
// - 404 when the path without its "?query" is neither /metrics nor /ready;
// - 405 (Allow: GET, HEAD) for another method.
// A bad request line is answered as soon as it has ended. Bytes after the
// head are ignored.
Verdict Judge(absl::string_view received, bool eof);

// A whole HTTP/1.1 response that closes the connection; `extra` holds
// further header lines, each ending in CRLF. Content-Length is the body's
// size even when `with_body` is false (the answer to HEAD).
std::string Response(absl::string_view status, absl::string_view type, absl::string_view body,
                     bool with_body = true, absl::string_view extra = "");

// The 503 sent to a client the endpoint has no room for.
std::string Busy();

}  // namespace asympo::daemon::http
