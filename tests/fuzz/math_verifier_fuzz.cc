// libFuzzer target: the math answer verifier (rollout_server/tasks/math_verifier.h),
// which reads model output, on a response and a reference answer cut from
// the input at its first NUL byte (the whole input is the response when
// there is none). Beyond not crashing: the reward is 0 or 1, it is 1 exactly
// when the extracted answer matches, and an answer that normalizes matches
// itself and its own canonical form.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rollout_server/tasks/math_verifier.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view response = input.substr(0, nul);
  const std::string_view reference =
      nul == std::string_view::npos ? std::string_view("42") : input.substr(nul + 1);

  namespace r = asympo::rollout;
  const std::optional<std::string> extracted = r::ExtractFinalAnswer(response);
  const double reward = r::MathReward(response, reference);
  ASYMPO_FUZZ_CHECK(reward == 0.0 || reward == 1.0);
  ASYMPO_FUZZ_CHECK((reward == 1.0) ==
                    (extracted.has_value() && r::AnswersMatch(*extracted, reference)));

  const std::optional<std::string> canonical = r::NormalizeAnswer(reference);
  if (canonical.has_value()) {
    ASYMPO_FUZZ_CHECK(r::AnswersMatch(reference, reference));
    ASYMPO_FUZZ_CHECK(!canonical->empty());
  } else {
    ASYMPO_FUZZ_CHECK(!r::AnswersMatch(reference, reference));
  }
  return 0;
}
