// Test helper: what an Authorizer counts into (security::Authorizer::Create),
// for tests that make one. The learner registers its own refusal family
// (learner_metrics.cc); a test's family has a name of its own.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

namespace asympo::testing {

struct AuthorizerMetrics {
  prometheus::Registry registry;  // also the CA file's asympo_tls_* metrics
  prometheus::Family<prometheus::Counter>& refusals = prometheus::BuildCounter()
                                                          .Name("test_refusals_total")
                                                          .Help("Refusals, by code and cause")
                                                          .Register(registry);
};

}  // namespace asympo::testing
