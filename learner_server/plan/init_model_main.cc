// asympo-init-model: a model of a named shape (or a config.json's) with
// random weights, written as a Hugging Face directory (config.json and
// safetensors) that the daemons load with --model: for rehearsals at the
// sizes users train (bench/rehearsal.py) where the real weights are not at
// hand. The weights are the policy's own initialization (ModelOptions:
// normal with --init_std, norms at one), reproducible for a --seed.
//
//   asympo-init-model --model=qwen3-0.6b --out=/tmp/qwen3-0.6b-random
//
// Exit status: 0 when written, 1 when it could not be, 2 for a bad flag.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flag_ranges.h"
#include "common/flag_usage.h"
#include "common/model/model_config.h"
#include "common/model/model_io.h"
#include "common/model/policy_model.h"
#include "learner_server/plan/memory_plan_report.h"

ABSL_FLAG(std::string, model, "",
          "The shape: qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b or llama3.2-3b (their published "
          "shapes), or a config.json.");
ABSL_FLAG(std::string, out, "", "The directory to write (created; files in it are replaced).");
ABSL_FLAG(int64_t, seed, 1, "The random weights' seed.");
ABSL_FLAG(double, init_std, 0.02, "The standard deviation of the random weights.");
ABSL_FLAG(std::string, dtype, "bfloat16",
          "The dtype the weights are written in: float32 or "
          "bfloat16.");
ASYMPO_FLAG_RANGE(init_std, 1e-6, 10);
ASYMPO_FLAG_RANGE(seed, 0, 1e15);

namespace {

absl::StatusOr<asympo::ModelConfig> ShapeOf(const std::string& model) {
  if (model.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model is required: ", absl::StrJoin(asympo::learner::NamedModelShapeNames(), ", "),
        " or a config.json"));
  }
  absl::StatusOr<asympo::ModelConfig> named = asympo::learner::NamedModelShape(model);
  if (named.ok()) return named;
  absl::StatusOr<asympo::ModelConfig> file = asympo::ModelConfig::FromFile(model);
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model=", model, ": neither a named shape (",
                     absl::StrJoin(asympo::learner::NamedModelShapeNames(), ", "),
                     ") nor a readable config.json: ", file.status().message()));
  }
  return file;
}

int Write() {
  const absl::StatusOr<asympo::ModelConfig> config = ShapeOf(absl::GetFlag(FLAGS_model));
  const std::string out = absl::GetFlag(FLAGS_out);
  const absl::StatusOr<at::ScalarType> dtype = asympo::ParseModelDType(absl::GetFlag(FLAGS_dtype));
  for (const absl::Status& s :
       {config.status(), dtype.status(),
        out.empty() ? absl::InvalidArgumentError("--out is required") : absl::OkStatus()}) {
    if (!s.ok()) {
      std::cerr << "asympo-init-model: " << s.message() << "\n";
      return 2;
    }
  }
  asympo::ModelOptions o;
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.init_std = absl::GetFlag(FLAGS_init_std);
  absl::StatusOr<std::unique_ptr<asympo::PolicyModel>> model =
      asympo::PolicyModel::CreateRandom(*config, o);
  absl::Status written = model.status();
  if (written.ok()) written = asympo::ExportPolicyModel(**model, out, int64_t{5} << 30, *dtype);
  if (!written.ok()) {
    std::cerr << "asympo-init-model: " << written.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << (*model)->config().NumParameters() << " parameters to " << out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  asympo::SetProgramUsage(
      "asympo-init-model: a model of a named shape with random weights, written as a Hugging "
      "Face directory the daemons load with --model. Exit 0: written; 1: it could not be; 2: a "
      "bad flag.\n"
      "  asympo-init-model --model=qwen3-0.6b --out=/tmp/qwen3-0.6b-random",
      "learner_server/plan/init_model_main.cc");
  if (absl::Status s = asympo::ParseFlagsAndStartLogging(argc, argv); !s.ok()) {
    std::cerr << "asympo-init-model: " << s.message() << "\n";
    return 2;
  }
  return Write();
}
