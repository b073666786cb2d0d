// Why the daemons serve /metrics with their own endpoint instead of
// prometheus-cpp's Exposer (common/daemon/metrics_endpoint.h), reproduced.
//
// This program links what the daemons link: LibTorch (with the BLAS it
// loads), gRPC, glog and prometheus-cpp. civetweb, under the Exposer,
// creates its worker threads with a fixed 100 KiB stack (civetweb's
// USE_STACK_SIZE). glibc puts a thread's static TLS on its stack and
// refuses (EINVAL) a stack that cannot hold it; Debian's LibTorch brings
// libopenblas (60 KiB of TLS) and glog (30 KiB) among others. Past
// 100 KiB, every civetweb thread fails to start and the Exposer throws
// "null context when constructing CivetServer", whatever the address.
//
// The tests measure the process's static TLS; where it is small (another
// LibTorch or BLAS), they skip: the Exposer would then work.
#include <link.h>
#include <pthread.h>

#include <string>
#include <vector>

#include <CivetServer.h>
#include <glog/logging.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/exposer.h>
#include <torch/types.h>

#include "common/daemon/metrics_endpoint.h"
#include "tests/testing/http.h"
#include "tests/testing/status_matchers.h"

namespace asympo::daemon {
namespace {

using ::testing::HasSubstr;

// civetweb's worker stack (its default build setting, used by Debian).
constexpr size_t kCivetwebStack = 102400;

// The static TLS of every loaded object: what each thread's stack must hold.
size_t StaticTlsBytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) {
            *static_cast<size_t*>(data) += info->dlpi_phdr[i].p_memsz;
          }
        }
        return 0;
      },
      &total);
  return total;
}

void UseLibTorchGrpcAndGlog() {
  EXPECT_EQ(torch::ones({4}).sum().item<float>(), 4.0f);
  // A channel that tries to connect: gRPC's threads and pollers are up.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  channel->GetState(/*try_to_connect=*/true);
  LOG(INFO) << "LibTorch, gRPC and glog are in use";
}

std::string CivetwebLog;

TEST(ExposerReproducerTest, TheExposerCannotStartItsThreadsBesideLibTorch) {
  UseLibTorchGrpcAndGlog();
  const size_t tls = StaticTlsBytes();
  RecordProperty("static_tls_bytes", std::to_string(tls));
  if (tls + 16384 < kCivetwebStack) {
    GTEST_SKIP() << "static TLS is only " << tls << " bytes here: the Exposer would start";
  }
  CivetCallbacks callbacks;
  callbacks.log_message = [](const mg_connection*, const char* message) {
    CivetwebLog = message;
    return 1;
  };
  for (const char* address : {"127.0.0.1:0", "0.0.0.0:0", "localhost:0"}) {
    CivetwebLog.clear();
    try {
      prometheus::Exposer exposer(
          std::vector<std::string>{"listening_ports", address, "num_threads", "2"}, &callbacks);
      ADD_FAILURE() << "the Exposer started on " << address << " with " << tls
                    << " bytes of static TLS";
    } catch (const std::exception& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr("null context when constructing CivetServer"));
      EXPECT_THAT(CivetwebLog, HasSubstr("Cannot create threads")) << address;
    }
  }
}

TEST(ExposerReproducerTest, TheCauseIsTheThreadStackTooSmallForTheStaticTls) {
  UseLibTorchGrpcAndGlog();
  if (StaticTlsBytes() + 16384 < kCivetwebStack) GTEST_SKIP() << "small static TLS here";
  const auto start = [](size_t stack) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack);
    pthread_t thread;
    const int rc = pthread_create(
        &thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
    pthread_attr_destroy(&attr);
    if (rc == 0) pthread_join(thread, nullptr);
    return rc;
  };
  EXPECT_EQ(start(kCivetwebStack), EINVAL);
  EXPECT_EQ(start(8 << 20), 0);
}

TEST(ExposerReproducerTest, TheDaemonsEndpointServesInTheSameProcess) {
  UseLibTorchGrpcAndGlog();
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", std::make_shared<prometheus::Registry>());
  ASSERT_OK(endpoint);
  EXPECT_THAT(asympo::testing::HttpGet("127.0.0.1", (*endpoint)->port(), "/metrics"),
              ::testing::StartsWith("HTTP/1.1 200"));
}

// The message the daemons once quoted comes from civetweb for any failure
// to start, a malformed address among them.
TEST(ExposerReproducerTest, AMalformedAddressGivesTheSameGenericMessage) {
  try {
    prometheus::Exposer exposer(":0");
    FAIL() << "\":0\" was accepted";
  } catch (const std::exception& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("null context when constructing CivetServer"));
  }
}

}  // namespace
}  // namespace asympo::daemon
