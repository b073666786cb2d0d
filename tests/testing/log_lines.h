// Test helper: counts the log lines (glog) that contain a text, from
// construction to destruction.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include <glog/logging.h>

namespace asympo::testing {

class LineCounter : public google::LogSink {
 public:
  explicit LineCounter(std::string text) : text_(std::move(text)) { google::AddLogSink(this); }
  ~LineCounter() override { google::RemoveLogSink(this); }
  LineCounter(const LineCounter&) = delete;
  LineCounter& operator=(const LineCounter&) = delete;

  void send(google::LogSeverity, const char*, const char*, int, const google::LogMessageTime&,
            const char* message, size_t length) override {
    if (std::string(message, length).find(text_) != std::string::npos) ++count_;
  }
  int count() const { return count_.load(); }

 private:
  std::string text_;
  std::atomic<int> count_{0};
};

}  // namespace asympo::testing
