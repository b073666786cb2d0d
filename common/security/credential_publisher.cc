#include "common/security/credential_publisher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/remove_tree.h"
#include "common/status_macros.h"

namespace asympo::security {
namespace {

constexpr char kCert[] = "cert.pem";
constexpr char kKey[] = "key.pem";
constexpr char kCa[] = "ca.pem";

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

std::string ParentDir(const std::string& configured) {
  if (!configured.empty()) return configured;
  struct stat st {};
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK | X_OK) == 0) {
    return "/dev/shm";
  }
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// Writes `text` to a new file `path` (0600) with modification time `mtime`.
absl::Status WriteFile(const std::string& path, const std::string& text, int64_t mtime) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", path);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = Errno("cannot write", path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  const struct timespec times[2] = {{static_cast<time_t>(mtime), 0},
                                    {static_cast<time_t>(mtime), 0}};
  absl::Status s = futimens(fd, times) == 0 ? absl::OkStatus() : Errno("cannot set times of", path);
  if (close(fd) != 0 && s.ok()) s = Errno("cannot close", path);
  return s;
}

}  // namespace

CredentialPublisher::CredentialPublisher(CredentialPublisherOptions options, std::string dir,
                                         prometheus::Registry& registry)
    : options_(std::move(options)), dir_(std::move(dir)), files_(options_.files, registry) {}

absl::StatusOr<std::unique_ptr<CredentialPublisher>> CredentialPublisher::Start(
    CredentialPublisherOptions options, prometheus::Registry& registry) {
  if (options.files.cert_file.empty() != options.files.key_file.empty()) {
    return absl::InvalidArgumentError("a certificate and its key go together: both or neither");
  }
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the reload interval must be positive");
  }
  std::string pattern = ParentDir(options.parent_dir) + "/asympo-tls-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return Errno("cannot make a directory like", pattern);
  std::unique_ptr<CredentialPublisher> p(
      new CredentialPublisher(std::move(options), pattern, registry));
  {
    absl::MutexLock lock(&p->mu_);
    ASYMPO_RETURN_IF_ERROR(p->files_.Load());
    ASYMPO_RETURN_IF_ERROR(p->Publish(p->files_.current()));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

CredentialPublisher::~CredentialPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  (void)RemoveTree(dir_);
}

std::string CredentialPublisher::cert_path() const {
  return options_.files.cert_file.empty() ? "" : absl::StrCat(dir_, "/current/", kCert);
}
std::string CredentialPublisher::key_path() const {
  return options_.files.key_file.empty() ? "" : absl::StrCat(dir_, "/current/", kKey);
}
std::string CredentialPublisher::ca_path() const {
  return options_.files.ca_file.empty() ? "" : absl::StrCat(dir_, "/current/", kCa);
}

int64_t CredentialPublisher::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

absl::Status CredentialPublisher::Publish(const CredentialTexts& texts) {
  const int64_t next = generation_ + 1;
  const std::string name = absl::StrCat("gen-", next);
  const std::string gen_dir = absl::StrCat(dir_, "/", name);
  (void)RemoveTree(gen_dir);  // left by a failed try
  if (mkdir(gen_dir.c_str(), 0700) != 0) return Errno("cannot make", gen_dir);
  // A later second than the generation before, whatever the clock says:
  // what tells gRPC that the files changed while it read them.
  const int64_t mtime = std::max<int64_t>(absl::ToUnixSeconds(absl::Now()), mtime_ + 1);
  for (auto [configured, file, text] :
       {std::make_tuple(!options_.files.cert_file.empty(), kCert, &texts.cert),
        std::make_tuple(!options_.files.key_file.empty(), kKey, &texts.key),
        std::make_tuple(!options_.files.ca_file.empty(), kCa, &texts.ca)}) {
    if (configured)
      ASYMPO_RETURN_IF_ERROR(WriteFile(absl::StrCat(gen_dir, "/", file), *text, mtime));
  }
  const std::string link = absl::StrCat(dir_, "/current.tmp");
  unlink(link.c_str());
  if (symlink(name.c_str(), link.c_str()) != 0) return Errno("cannot make the link", link);
  const std::string current = absl::StrCat(dir_, "/current");
  if (rename(link.c_str(), current.c_str()) != 0) return Errno("cannot rename over", current);
  generation_ = next;
  mtime_ = mtime;
  published_ = texts;
  (void)RemoveTree(absl::StrCat(dir_, "/gen-", next - 2));
  return absl::OkStatus();
}

CredentialFiles::Reload CredentialPublisher::ReloadNow() {
  absl::MutexLock lock(&mu_);
  const CredentialFiles::Reload r = files_.Reread();
  if (files_.current() == published_) return r;
  // A generation that could not be written (a full /dev/shm, say) is tried
  // again at the next reload; gRPC keeps what it has.
  if (absl::Status s = Publish(files_.current()); !s.ok()) {
    LOG(ERROR) << "cannot hand the renewed TLS files to gRPC: " << s.message()
               << "; the credentials loaded before stay in force";
    return CredentialFiles::Reload::kRefused;
  }
  return CredentialFiles::Reload::kTaken;
}

void CredentialPublisher::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.interval)) return;
    }
    ReloadNow();
  }
}

}  // namespace asympo::security
