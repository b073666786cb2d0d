// The built-in environment of "add_tool": the calculator
// (rollout_server/tasks/calculator.h) answers each turn that ends with
// CALL; a turn that ends otherwise ends the episode, scored by the task's
// verifier on the whole transcript.
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rollout_server/episodes/environment.h"
#include "rollout_server/tasks/addition_task.h"
#include "rollout_server/tasks/calculator.h"

namespace asympo::rollout {
namespace {

class CalculatorEnvironment : public Environment {
 public:
  explicit CalculatorEnvironment(const Task* task) : task_(task) {}

  void Reset(const TaskPrompt& prompt, uint32_t, uint64_t, ResetDone done) override {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = absl::StrCat("calc-", next_++);
      episodes_[id].prompt = prompt;
    }
    done(id);
  }

  void Step(const std::string& id, const Turn& turn, StepDone done) override {
    absl::StatusOr<TurnAnswer> answer = Answer(id, turn);
    done(std::move(answer));
  }

  void Close(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    episodes_.erase(id);
  }

  std::string name() const override { return "the built-in calculator"; }

 private:
  struct Episode {
    TaskPrompt prompt;
    std::vector<int32_t> transcript;
    std::optional<int32_t> previous;
  };

  absl::StatusOr<TurnAnswer> Answer(const std::string& id, const Turn& turn) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = episodes_.find(id);
    if (it == episodes_.end()) return absl::NotFoundError(absl::StrCat("no episode ", id));
    Episode& e = it->second;
    e.transcript.insert(e.transcript.end(), turn.tokens.begin(), turn.tokens.end());
    TurnAnswer answer;
    const bool called = !turn.tokens.empty() && turn.tokens.back() == addition::kCallId;
    if (called && !turn.final) {
      answer.append = CalculatorAnswer(turn.tokens, &e.previous);
      if (answer.append.size() < turn.tokens_left) {
        e.transcript.insert(e.transcript.end(), answer.append.begin(), answer.append.end());
        return answer;
      }
      answer.append.clear();  // no room for the answer: the episode ends here
    }
    const TaskScore score = task_->Score(e.prompt, e.transcript);
    answer.done = true;
    answer.reward = score.reward;
    answer.correct = score.correct;
    return answer;
  }

  const Task* task_;
  std::mutex mu_;
  std::map<std::string, Episode> episodes_;
  int64_t next_ = 0;
};

}  // namespace

std::unique_ptr<Environment> CreateBuiltinEnvironment(const Task* task) {
  if (task->name() == "add_tool") return std::make_unique<CalculatorEnvironment>(task);
  return nullptr;
}

}  // namespace asympo::rollout
