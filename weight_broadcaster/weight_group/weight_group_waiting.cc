// The weight group's parked calls (weight_group.h, "Calls"): a Join, a
// Next or a store wait holds no thread while it waits; the answering thread
// finishes each once it is settled.
#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/wire/raw_messages.h"
#include "weight_broadcaster/weight_group/weight_group_state.h"
#include "weight_broadcaster/weight_group/weight_group_store.h"

namespace asympo::broadcast {
namespace {

// How often parked calls are looked at without a change in the group: for
// cancelled calls and for store keys set by rank 0's own process group,
// which does not signal the group.
constexpr absl::Duration kStorePoll = absl::Milliseconds(10);
constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);

}  // namespace

grpc::ServerUnaryReactor* WeightGroup::State::ParkLocked(std::unique_ptr<Waiting> w, bool* parked) {
  grpc::ServerUnaryReactor* reactor = w->ctx->DefaultReactor();
  w->reactor = reactor;
  int& mine = waiting_by_caller[w->caller];
  const auto of_member = waiting_by_member.find(w->token);
  const int member_calls = of_member == waiting_by_member.end() ? 0 : of_member->second;
  const bool member_full = !w->token.empty() && member_calls >= options.max_waiting_per_member;
  *parked = static_cast<int>(waiting.size()) < options.max_waiting &&
            mine < options.max_waiting_per_caller && !member_full;
  if (*parked) {
    ++mine;
    if (!w->token.empty()) ++waiting_by_member[w->token];
    waiting.push_back(std::move(w));
    cv.SignalAll();
    return reactor;
  }
  const bool own = mine >= options.max_waiting_per_caller;
  if (mine == 0) waiting_by_caller.erase(w->caller);
  std::string message;
  if (member_full) {
    message = absl::StrCat("this member has ", options.max_waiting_per_member,
                           " calls waiting already (max_waiting_per_member)");
    CountRefusal(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, ""), "member_waiting_calls");
  } else if (own) {
    message = absl::StrCat("this caller has ", options.max_waiting_per_caller,
                           " calls waiting already (max_waiting_per_caller)");
    CountRefusal(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, ""), "waiting_calls");
  } else {
    message = absl::StrCat("the weight group has ", options.max_waiting,
                           " calls waiting already (max_waiting)");
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               absl::StrCat(message, "; let one end first")));
  return reactor;
}

bool WeightGroup::State::SettledLocked(const Waiting& w, absl::Time now) {
  if (shut_down || now >= w.deadline || w.ctx->IsCancelled()) return true;
  switch (w.kind) {
    case Waiting::Kind::kJoin:
      return w.joiner->formed || w.joiner->replaced;
    case Waiting::Kind::kNext: {
      const Member* m = MemberOf(w.token);
      return m == nullptr || m->told;
    }
    case Waiting::Kind::kStore: {
      std::vector<std::string> keys(w.request.keys().begin(), w.request.keys().end());
      try {
        return w.group_store->check(keys);
      } catch (const std::exception&) {
        return true;  // RunStoreOp says why
      }
    }
  }
  return true;
}

grpc::Status WeightGroup::State::AnswerJoinLocked(Waiting& w, v1::JoinGroupResponse* response) {
  const Joiner& j = *w.joiner;
  if (j.replaced) {
    // Only the id's own principal can do this (WorkerIds): a restarted
    // worker, or its retry of a Join it gave up on. Marked for clients,
    // which may retry it, unlike other ABORTED answers.
    w.ctx->AddTrailingMetadata(kAbortReasonMetadataKey, kJoinReplaced);
    return grpc::Status(
        grpc::StatusCode::ABORTED,
        absl::StrCat("a newer Join for worker ", j.worker_id, " took this one's place"));
  }
  if (shut_down) return GroupShuttingDown();
  if (!j.formed) {
    // Not formed in time: the worker calls again, unless a formation that
    // counts it is gathering right now.
    if (phase != Phase::kForming) {
      auto it = joiners.find(j.worker_id);
      if (it != joiners.end() && it->second == w.joiner) joiners.erase(it);
    }
    response->set_formed(false);
    return grpc::Status::OK;
  }
  response->set_formed(true);
  response->set_generation(j.generation);
  response->set_rank(static_cast<uint32_t>(j.rank));
  response->set_world_size(static_cast<uint32_t>(j.world_size));
  response->set_backend(options.backend);
  response->set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options.timeout)));
  response->set_member_token(j.token);
  return grpc::Status::OK;
}

grpc::Status WeightGroup::State::AnswerNextLocked(Waiting& w, v1::GroupNextResponse* response) {
  Member* m = MemberOf(w.token);
  if (m == nullptr) {
    // The generation ended while this call waited.
    response->set_action(v1::GroupNextResponse::ACTION_REJOIN);
    return grpc::Status::OK;
  }
  --m->calls;
  m->asking = false;
  m->last_seen = absl::Now();
  if (shut_down) return GroupShuttingDown();
  if (!m->told) {
    response->set_action(v1::GroupNextResponse::ACTION_WAIT);
    return grpc::Status::OK;
  }
  m->told = false;
  if (m->action == v1::GroupNextResponse::ACTION_RECEIVE && m->receive != nullptr) {
    *response = *m->receive;
  }
  response->set_action(m->action);
  m->receive.reset();
  return grpc::Status::OK;
}

grpc::Status WeightGroup::State::AnswerLocked(Waiting& w) {
  grpc::Status status;
  switch (w.kind) {
    case Waiting::Kind::kJoin: {
      v1::JoinGroupResponse response;
      status = AnswerJoinLocked(w, &response);
      if (status.ok()) SerializeReply(response, w.reply);
      break;
    }
    case Waiting::Kind::kNext: {
      v1::GroupNextResponse response;
      status = AnswerNextLocked(w, &response);
      if (status.ok()) SerializeReply(response, w.reply);
      break;
    }
    case Waiting::Kind::kStore: {
      if (shut_down) return GroupShuttingDown();
      v1::GroupStoreResponse response;
      status = RunStoreOp(*w.group_store, w.request, &response);
      if (status.ok()) SerializeReply(response, w.reply);
      break;
    }
  }
  return status;
}

void WeightGroup::State::Answer() {
  std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::Status>> done;
  while (true) {
    done.clear();
    bool stop = false;
    {
      absl::MutexLock lock(&mu);
      const absl::Time now = absl::Now();
      absl::Time wake = now + kCancelPoll;
      auto keep = waiting.begin();
      for (auto it = waiting.begin(); it != waiting.end(); ++it) {
        Waiting& w = **it;
        if (SettledLocked(w, now)) {
          done.emplace_back(w.reactor, AnswerLocked(w));
          auto c = waiting_by_caller.find(w.caller);
          if (c != waiting_by_caller.end() && --c->second <= 0) waiting_by_caller.erase(c);
          auto m = waiting_by_member.find(w.token);
          if (m != waiting_by_member.end() && --m->second <= 0) waiting_by_member.erase(m);
          continue;
        }
        wake = std::min(wake, w.kind == Waiting::Kind::kStore ? now + kStorePoll : w.deadline);
        if (keep != it) *keep = std::move(*it);
        ++keep;
      }
      waiting.erase(keep, waiting.end());
      if (done.empty()) {
        if (shut_down && waiting.empty()) {
          stop = true;
        } else {
          cv.WaitWithDeadline(&mu, wake);
        }
      }
    }
    // Outside the lock: gRPC may run the call's completion inline.
    for (auto& [reactor, status] : done) reactor->Finish(status);
    if (stop) return;
  }
}

}  // namespace asympo::broadcast
