#include "common/daemon/metrics_http.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace asympo::daemon::http {
namespace {

Verdict Answer(std::string response) {
  Verdict v;
  v.kind = Verdict::Kind::kAnswer;
  v.answer = std::move(response);
  return v;
}

Verdict BadRequest(absl::string_view why) {
  return Answer(Response("400 Bad Request", "text/plain", absl::StrCat(why, "\n")));
}

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsVisible(char c) { return c > 0x20 && c < 0x7f; }

// `method SP path SP HTTP/1.<digit>`, CRLF removed: the method and the
// path; false for anything else.
bool SplitRequestLine(absl::string_view line, absl::string_view* method, absl::string_view* path) {
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty()) return false;
  const absl::string_view version = parts[2];
  if (!std::all_of(parts[0].begin(), parts[0].end(), IsTokenChar) || parts[1].front() != '/' ||
      !std::all_of(parts[1].begin(), parts[1].end(), IsVisible) || version.size() != 8 ||
      !absl::StartsWith(version, "HTTP/1.") ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version.back()))) {
    return false;
  }
  *method = parts[0];
  *path = parts[1];
  return true;
}

// True when every CR in `head` is followed by LF and every LF follows a
// CR; a CR that ends `head` may still get its LF when `more` can come.
bool LineEndsArePairs(absl::string_view head, bool more) {
  for (size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) return false;
    if (head[i] == '\r' && (i + 1 < head.size() ? head[i + 1] != '\n' : !more)) return false;
  }
  return true;
}

}  // namespace

Verdict Judge(absl::string_view received, bool eof) {
  const size_t blank = received.find("\r\n\r\n");
  const bool complete = blank != absl::string_view::npos && blank + 4 <= kMaxRequestHead;
  const absl::string_view head =
      received.substr(0, complete ? blank + 4 : std::min(received.size(), kMaxRequestHead));
  if (!LineEndsArePairs(head, !complete && !eof)) return BadRequest("bare CR or LF");
  const size_t line_end = head.find("\r\n");
  absl::string_view method, path;
  if (line_end != absl::string_view::npos &&
      !SplitRequestLine(head.substr(0, line_end), &method, &path)) {
    return BadRequest("malformed request line; expected GET /metrics HTTP/1.1");
  }
  if (!complete) {
    if (received.size() > kMaxRequestHead) {
      return Answer(Response("431 Request Header Fields Too Large", "text/plain",
                             absl::StrCat("request head over ", kMaxRequestHead, " bytes\n")));
    }
    if (eof) return BadRequest("request head cut short");
    return Verdict();
  }
  const bool head_only = method == "HEAD";
  const absl::string_view resource = path.substr(0, path.find('?'));
  if (resource != "/metrics" && resource != "/ready") {
    return Answer(Response("404 Not Found", "text/plain",
                           "only /metrics and /ready are served here\n", !head_only));
  }
  if (method != "GET" && !head_only) {
    return Answer(Response("405 Method Not Allowed", "text/plain", "only GET and HEAD\n", true,
                           "Allow: GET, HEAD\r\n"));
  }
  Verdict v;
  v.kind = resource == "/ready" ? Verdict::Kind::kReady : Verdict::Kind::kScrape;
  v.head_only = head_only;
  return v;
}

std::string Response(absl::string_view status, absl::string_view type, absl::string_view body,
                     bool with_body, absl::string_view extra) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra,
                      "Connection: close\r\n\r\n", with_body ? body : absl::string_view());
}

std::string Busy() {
  return Response("503 Service Unavailable", "text/plain", "metrics endpoint busy\n");
}

}  // namespace asympo::daemon::http
