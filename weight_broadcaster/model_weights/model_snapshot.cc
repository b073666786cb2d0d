#include "weight_broadcaster/model_weights/model_snapshot.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo::broadcast {
namespace {

absl::StatusOr<v1::DType> ToDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return v1::DTYPE_F32;
    case at::kBFloat16:
      return v1::DTYPE_BF16;
    case at::kHalf:
      return v1::DTYPE_F16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(t), " cannot be broadcast"));
  }
}

at::ScalarType ToScalarType(v1::DType t) {
  switch (t) {
    case v1::DTYPE_BF16:
      return at::kBFloat16;
    case v1::DTYPE_F16:
      return at::kHalf;
    default:
      return at::kFloat;
  }
}

absl::Status LoadSnapshotUnguarded(const ReceivedSnapshot& snapshot, PolicyModel* model);

}  // namespace

std::vector<TensorSpec> ModelTensorSpecs(const PolicyModel& model, at::ScalarType dtype) {
  std::vector<TensorSpec> specs;
  specs.reserve(model.named_parameters().size());
  for (const auto& [name, t] : model.named_parameters()) {
    TensorSpec s;
    s.name = name;
    // Model dtypes are float32/bfloat16/float16 (ModelOptions), all mapped.
    // Without `dtype`, the model's own (ModelOptions::dtype): a bfloat16
    // rollout's float32 adapters are exchanged in bfloat16 like its weights.
    const at::ScalarType st = dtype == at::ScalarType::Undefined ? model.options().dtype : dtype;
    s.dtype = ToDType(st).value_or(v1::DTYPE_UNSPECIFIED);
    s.shape.assign(t.sizes().begin(), t.sizes().end());
    specs.push_back(std::move(s));
  }
  return specs;
}

std::string ModelSignatureOf(const PolicyModel& model, at::ScalarType dtype) {
  return ModelSignature(ModelTensorSpecs(model, dtype));
}

absl::StatusOr<std::unique_ptr<SnapshotStaging>> SnapshotStaging::Create(const PolicyModel& model,
                                                                         at::ScalarType dtype,
                                                                         SnapshotStore& store,
                                                                         bool device_buckets,
                                                                         bool host_only) {
  ASYMPO_RETURN_IF_ERROR(ToDType(dtype).status());
  if (host_only && device_buckets) {
    return absl::InvalidArgumentError(
        "staging snapshots in host memory only cannot feed NCCL from the device: the NCCL "
        "transport broadcasts from the device copy");
  }
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<const SnapshotPlan> plan,
                          store.Plan(ModelTensorSpecs(model, dtype)));
  return Allocate(model, dtype, std::move(plan), device_buckets, host_only);
}

absl::StatusOr<std::unique_ptr<SnapshotStaging>> SnapshotStaging::Create(
    const PolicyModel& model, at::ScalarType dtype, const PackingOptions* buckets) {
  ASYMPO_RETURN_IF_ERROR(ToDType(dtype).status());
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<const SnapshotPlan> plan,
                          SnapshotPlan::Make(ModelTensorSpecs(model, dtype),
                                             buckets == nullptr ? PackingOptions() : *buckets));
  return Allocate(model, dtype, std::move(plan), buckets != nullptr, /*host_only=*/false);
}

// The element offsets of the plan's tensors, then both buffers.
absl::StatusOr<std::unique_ptr<SnapshotStaging>> SnapshotStaging::Allocate(
    const PolicyModel& model, at::ScalarType dtype, std::shared_ptr<const SnapshotPlan> plan,
    bool device_buckets, bool host_only) {
  std::unique_ptr<SnapshotStaging> s(new SnapshotStaging());
  s->host_only_ = host_only;
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
  for (int t = 0; t < plan->manifest().tensors_size(); ++t) {
    const int64_t start = static_cast<int64_t>(plan->tensor_start(t));
    if (start % esize != 0) {
      return absl::InvalidArgumentError(absl::StrCat("the plan puts tensor ",
                                                     plan->manifest().tensors(t).name(),
                                                     " at byte ", start, ", not on an element"));
    }
    s->offsets_.push_back(start / esize);
  }
  s->specs_ = ModelTensorSpecs(model, dtype);
  s->plan_ = std::move(plan);
  s->device_buckets_ = device_buckets;
  s->bytes_ = static_cast<int64_t>(s->plan_->flat_bytes());
  return GuardTorch("allocating the snapshot staging buffers",
                    [&]() -> absl::StatusOr<std::unique_ptr<SnapshotStaging>> {
                      const at::Device device = model.options().device;
                      s->elements_ = std::max<int64_t>(s->bytes_ / esize, 1);
                      s->dtype_ = dtype;
                      s->pinned_ = !device.is_cpu();
                      if (!host_only) {
                        s->device_ = std::make_shared<at::Tensor>(at::zeros(
                            {s->elements_}, at::TensorOptions().dtype(dtype).device(device)));
                        s->device_pool_.push_back(s->device_);
                      }
                      s->host_ = std::make_shared<at::Tensor>(s->NewHostBuffer());
                      s->host_pool_.push_back(s->host_);
                      if (!device.is_cpu() && !host_only) {
                        const c10::impl::VirtualGuardImpl impl(device.type());
                        s->copy_stream_ = impl.getStreamFromGlobalPool(device);
                        s->staged_ = std::make_unique<c10::Event>(device.type());
                      }
                      return std::move(s);
                    });
}

// The size of the staged snapshot, pinned when the model is on a GPU.
at::Tensor SnapshotStaging::NewHostBuffer() const {
  return at::empty({elements_}, at::TensorOptions().dtype(dtype_).pinned_memory(pinned_));
}

absl::Status SnapshotStaging::Stage(const PolicyModel& model) {
  ASYMPO_RETURN_IF_ERROR(BeginStage());
  std::vector<size_t> all(model.named_parameters().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  ASYMPO_RETURN_IF_ERROR(StageParameters(model, all));
  return FinishStage();
}

absl::Status SnapshotStaging::BeginStage() {
  return GuardTorch("staging the weights", [&]() -> absl::Status {
    if (host_only_) {  // straight into a host buffer no published snapshot holds
      host_.reset();
      host_ =
          ReuseOrMake(host_pool_, [this] { return std::make_shared<at::Tensor>(NewHostBuffer()); });
      return absl::OkStatus();
    }
    if (device_.use_count() > 2) {  // this object's two references, plus a snapshot's
      device_.reset();
      device_ = ReuseOrMake(device_pool_, [this] {
        return std::make_shared<at::Tensor>(at::zeros_like(*device_pool_.front()));
      });
    }
    return absl::OkStatus();
  });
}

absl::Status SnapshotStaging::StageParameters(const PolicyModel& model,
                                              const std::vector<size_t>& indices) {
  return GuardTorch("staging the weights", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    at::Tensor& target = host_only_ ? *host_ : *device_;
    const auto& params = model.named_parameters();
    for (const size_t i : indices) {
      const at::Tensor& p = params[i].second;
      target.narrow(0, offsets_[i], p.numel()).view(p.sizes()).copy_(p.detach());
    }
    return absl::OkStatus();
  });
}

absl::Status SnapshotStaging::FinishStage() {
  return GuardTorch("staging the weights", [&]() -> absl::Status {
    if (staged_ != nullptr && !host_only_) {
      staged_->record(
          c10::impl::VirtualGuardImpl(device_->device().type()).getStream(device_->device()));
    }
    return absl::OkStatus();
  });
}

HostBuckets SnapshotStaging::HostBucketsOfCopy() const {
  HostBuckets out;
  out.plan = plan_;
  out.data = static_cast<char*>(host_->data_ptr());
  out.keep_alive = host_;
  return out;
}

DeviceBuckets SnapshotStaging::DeviceBucketsOfStage() const {
  DeviceBuckets out;
  if (!device_buckets_ || host_only_) return out;
  out.data = device_->data_ptr();
  out.keep_alive = device_;
  return out;
}

absl::StatusOr<std::vector<TensorView>> SnapshotStaging::CopyToHost() {
  return GuardTorch(
      "copying the weights to the host", [&]() -> absl::StatusOr<std::vector<TensorView>> {
        // Into a buffer no published snapshot holds (staged there already
        // when the stage is the host's).
        if (!host_only_) {
          host_.reset();
          host_ = ReuseOrMake(host_pool_,
                              [this] { return std::make_shared<at::Tensor>(NewHostBuffer()); });
        }
        if (host_only_) {
          // Nothing to copy.
        } else if (copy_stream_.has_value()) {
          // On the copy stream, after Stage's kernels; wait for it to finish.
          staged_->block(*copy_stream_);
          {
            const c10::StreamGuard on_copy_stream(*copy_stream_);
            host_->copy_(*device_, /*non_blocking=*/true);
          }
          copy_stream_->synchronize();
        } else {
          host_->copy_(*device_);  // one transfer; blocks until it is done
        }
        std::vector<TensorView> views;
        views.reserve(specs_.size());
        const char* base = static_cast<const char*>(host_->data_ptr());
        for (size_t i = 0; i < specs_.size(); ++i) {
          TensorView v;
          v.spec = specs_[i];
          v.data = base + plan_->tensor_start(static_cast<int>(i));
          v.size_bytes = plan_->manifest().tensors(static_cast<int>(i)).size_bytes();
          views.push_back(std::move(v));
        }
        return views;
      });
}

absl::Status LoadSnapshotIntoModel(const ReceivedSnapshot& snapshot, PolicyModel* model) {
  return GuardTorch(absl::StrCat("loading snapshot ", snapshot.version()),
                    [&] { return LoadSnapshotUnguarded(snapshot, model); });
}

namespace {

absl::Status LoadSnapshotUnguarded(const ReceivedSnapshot& snapshot, PolicyModel* model) {
  const std::string expected = ModelSignatureOf(*model);
  if (snapshot.manifest.model_signature() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot ", snapshot.version(), " has model signature ",
                     snapshot.manifest.model_signature(), " but the model's is ", expected));
  }
  std::vector<std::pair<std::string, at::Tensor>> source;
  source.reserve(snapshot.manifest.tensors_size());
  for (const v1::TensorEntry& e : snapshot.manifest.tensors()) {
    std::string_view bytes = snapshot.TensorBytes(e);
    std::vector<int64_t> shape(e.shape().begin(), e.shape().end());
    const at::ScalarType st = ToScalarType(e.dtype());
    if (bytes.size() != e.size_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot ", snapshot.version(), ": tensor ", e.name(), " is truncated"));
    }
    // The bytes are only read: LoadParameters copies them into the model.
    at::Tensor view =
        at::from_blob(const_cast<char*>(bytes.data()), shape, at::TensorOptions().dtype(st));
    source.emplace_back(e.name(), view);
  }
  at::NoGradGuard no_grad;
  return model->LoadParameters(source);
}

}  // namespace

}  // namespace asympo::broadcast
