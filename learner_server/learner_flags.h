// The flags of asympo-learner that main.cc leaves to two files, by job:
// training_flags.cc (the model, the objective, the trainer and its ranks)
// and weight_flags.cc (the weight broadcast and the weight group). Each
// function reads its flags into LearnerDaemonOptions; errors name the flag.
// Only asympo-learner compiles these files (no library has flags).
#pragma once

#include <cstdint>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "learner_server/learner_options.h"

ABSL_DECLARE_FLAG(uint64_t, seed);

namespace asympo::learner {

// The files that define these flags, for --help and the range checks.
inline constexpr char kTrainingFlagsFile[] = "learner_server/training_flags.cc";
inline constexpr char kWeightFlagsFile[] = "learner_server/weight_flags.cc";

// The model and its device, dtypes and activation checkpointing; first,
// since the others read the device.
absl::Status ModelFlags(LearnerDaemonOptions* o);
// The ranks (--dist_*, torchrun's and Slurm's variables), after ModelFlags.
absl::Status DataParallelFlags(LearnerDaemonOptions* o);
// The objective, micro-batches, the learning rate and AdamW.
absl::Status TrainerFlags(TrainerOptions* t);
// The weight broadcast (gRPC and NCCL) and the weight group, after
// ModelFlags.
absl::Status BroadcastFlags(LearnerDaemonOptions* o);

}  // namespace asympo::learner
