// asympo-eval: evaluates a model or a learner checkpoint on a task's held-out
// prompts (rollout_server/evaluation.h) and prints the JSON report, then a
// one-line summary.
//
//   asympo-eval --checkpoint=runs/x/checkpoints --task=copy
//   asympo-eval --model=runs/x/export --task=math --task_data=test.jsonl
//       --tokenizer=/models/Qwen3-0.6B/tokenizer.json --k=16
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flag_ranges.h"
#include "common/flag_usage.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"
#include "rollout_server/evaluation.h"
#include "rollout_server/tasks/tasks.h"

ABSL_FLAG(std::string, model, "",
          "\"tiny\" or a Hugging Face model directory (e.g. the learner's --export_dir); empty: "
          "the --model the checkpoint's learner had, else tiny.");
ABSL_FLAG(int64_t, tiny_vocab_size, 0,
          "Vocabulary of the tiny model; 0: the checkpoint's learner's, else 64.");
ABSL_FLAG(std::string, checkpoint, "",
          "A learner checkpoint: a ckpt-<version> directory, or the --checkpoint_dir root (its "
          "newest valid checkpoint). Empty: evaluate --model's own weights.");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N.");
ABSL_FLAG(std::string, dtype, "float32", "float32 or bfloat16.");
ABSL_FLAG(int32_t, threads, 1, "CPU threads for tensor work (LibTorch's and OpenBLAS's).");
ABSL_FLAG(std::string, task, "copy", "Task whose held-out prompts are evaluated.");
ABSL_FLAG(std::string, task_data, "", "math: JSONL file of the evaluation split.");
ABSL_FLAG(int32_t, task_min_length, 0,
          "Synthetic tasks: the shortest prompt, in symbols (add, add_tool: operands; 0: the "
          "task's default).");
ABSL_FLAG(int32_t, task_max_length, 0,
          "Synthetic tasks: the longest prompt, in symbols (add, add_tool: operands; 0: the "
          "task's default).");
ABSL_FLAG(std::string, tokenizer, "", "math: the model's tokenizer.json.");
ABSL_FLAG(std::string, prompt_template, "", "math: template with {prompt} (empty: chat turn).");
ABSL_FLAG(std::string, stop_token, "", "math: token that ends a response (empty: the EOS).");
ABSL_FLAG(int64_t, max_prompts, 0, "Most held-out prompts (0: the task's whole split).");
ABSL_FLAG(int32_t, k, 8, "Samples per prompt for mean@k and pass@k (0: greedy only).");
ABSL_FLAG(int32_t, samples, 0, "n >= k samples per prompt for the pass@k estimator (0: k).");
ABSL_FLAG(double, temperature, 1.0, "Temperature of the k samples (> 0).");
ABSL_FLAG(double, top_p, 1.0, "Nucleus mass of the k samples.");
ABSL_FLAG(int32_t, max_new_tokens, 0, "Most tokens per response (0: the task's default).");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the samples.");
ABSL_FLAG(int32_t, prompts_per_batch, 32, "Prompts generated together.");
ABSL_FLAG(std::string, output, "", "Also write the JSON report to this file.");
ABSL_FLAG(bool, per_prompt, false, "Include each prompt's greedy tokens and counts in the JSON.");

// The documented ranges (--help shows them; a value outside is refused at
// start, before the options are read: they need no check of their own).
ASYMPO_FLAG_RANGE(tiny_vocab_size, 0, 1 << 20);
ASYMPO_FLAG_RANGE(threads, 1, 1024);
ASYMPO_FLAG_RANGE(max_prompts, 0, 1e12);
ASYMPO_FLAG_RANGE(k, 0, 65536);
ASYMPO_FLAG_RANGE(samples, 0, 65536);
ASYMPO_FLAG_RANGE(temperature, 0, 100);
ASYMPO_FLAG_RANGE(top_p, 0, 1);
ASYMPO_FLAG_RANGE(task_min_length, 0, 4096);
ASYMPO_FLAG_RANGE(task_max_length, 0, 4096);
ASYMPO_FLAG_RANGE(max_new_tokens, 0, 1 << 20);
ASYMPO_FLAG_RANGE(seed, 0, 1.8446744073709552e19);
ASYMPO_FLAG_RANGE(prompts_per_batch, 1, 65536);

namespace {

int Fail(const std::string& message) {
  std::cerr << "asympo-eval: " << message << "\n";
  return 2;
}

absl::StatusOr<asympo::rollout::EvaluationOptions> EvaluationOptionsFromFlags() {
  asympo::rollout::EvaluationOptions o;
  o.k = absl::GetFlag(FLAGS_k);
  o.samples = absl::GetFlag(FLAGS_samples);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_p = absl::GetFlag(FLAGS_top_p);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.prompts_per_batch = absl::GetFlag(FLAGS_prompts_per_batch);
  if (o.k > 0 && o.temperature <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature is ", o.temperature,
                     "; the k samples need a positive temperature (greedy is reported anyway)"));
  }
  if (absl::Status s = asympo::rollout::ValidateEvaluationOptions(o); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  return o;
}

asympo::rollout::TaskOptions TaskOptionsFromFlags(int64_t vocab_size) {
  asympo::rollout::TaskOptions o;
  o.name = absl::GetFlag(FLAGS_task);
  o.vocab_size = vocab_size;
  o.data_path = absl::GetFlag(FLAGS_task_data);
  o.synthetic_min_length = absl::GetFlag(FLAGS_task_min_length);
  o.synthetic_max_length = absl::GetFlag(FLAGS_task_max_length);
  o.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  o.prompt_template = absl::GetFlag(FLAGS_prompt_template);
  o.stop_token = absl::GetFlag(FLAGS_stop_token);
  if (absl::GetFlag(FLAGS_max_new_tokens) > 0) {
    o.math_max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  }
  return o;
}

// The whole evaluation; the report's JSON and summary on success.
absl::Status Run() {
  ASYMPO_ASSIGN_OR_RETURN(const asympo::rollout::EvaluationOptions options,
                          EvaluationOptionsFromFlags());
  // Before the model (or a checkpoint) is loaded.
  ASYMPO_RETURN_IF_ERROR(asympo::rollout::CheckTaskFlag(absl::GetFlag(FLAGS_task)));
  asympo::ModelOptions model_options;
  ASYMPO_ASSIGN_OR_RETURN(model_options.dtype, asympo::ParseModelDType(absl::GetFlag(FLAGS_dtype)));
  ASYMPO_ASSIGN_OR_RETURN(model_options.device, asympo::ParseDevice(absl::GetFlag(FLAGS_device)));
  asympo::rollout::EvaluationModelSource source;
  source.model = absl::GetFlag(FLAGS_model);
  source.tiny_vocab_size = absl::GetFlag(FLAGS_tiny_vocab_size);
  source.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  std::string described;
  ASYMPO_ASSIGN_OR_RETURN(
      std::unique_ptr<asympo::PolicyModel> model,
      asympo::rollout::LoadModelForEvaluation(source, model_options, &described));
  ASYMPO_ASSIGN_OR_RETURN(
      std::unique_ptr<asympo::rollout::Task> task,
      asympo::rollout::CreateTask(TaskOptionsFromFlags(model->config().vocab_size)));
  const std::vector<asympo::rollout::TaskPrompt> prompts =
      task->EvaluationPrompts(absl::GetFlag(FLAGS_max_prompts));
  const asympo::rollout::GenerationEngine engine(model.get());
  ASYMPO_ASSIGN_OR_RETURN(const asympo::rollout::EvaluationReport report,
                          asympo::rollout::Evaluate(engine, *task, prompts, options));
  const std::string json = asympo::rollout::EvaluationJson(report, absl::GetFlag(FLAGS_per_prompt));
  const std::string output = absl::GetFlag(FLAGS_output);
  if (!output.empty()) {
    std::ofstream out(output);
    out << json << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("--output ", output, ": cannot write"));
  }
  std::cout << json << "\n"
            << "asympo-eval: task=" << task->name() << " "
            << asympo::rollout::EvaluationSummary(report) << " (" << described << ")\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  asympo::SetProgramUsage(
      "asympo-eval: evaluates a model or learner checkpoint on a task's held-out prompts: "
      "greedy accuracy, mean@k, pass@k, response length.\n"
      "  asympo-eval --checkpoint=runs/<run>/checkpoints --task=copy",
      "rollout_server/evaluate_main.cc");
  if (absl::Status s = asympo::ParseFlagsAndStartLogging(argc, argv); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  asympo::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  const absl::Status status = asympo::GuardTorch("evaluation", [] { return Run(); });
  if (!status.ok()) return Fail(std::string(status.message()));
  return 0;
}
