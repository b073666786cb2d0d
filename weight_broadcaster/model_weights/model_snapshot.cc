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
    const at::ScalarType st = dtype == at::ScalarType::Undefined ? t.scalar_type() : dtype;
    s.dtype = ToDType(st).value_or(v1::DTYPE_UNSPECIFIED);
    s.shape.assign(t.sizes().begin(), t.sizes().end());
    specs.push_back(std::move(s));
  }
  return specs;
}

std::string ModelSignatureOf(const PolicyModel& model, at::ScalarType dtype) {
  return ModelSignature(ModelTensorSpecs(model, dtype));
}

// Element offsets of every tensor in the flat buffers and their total:
// packed one after the other (64-byte aligned), or, with `buckets`, at the
// manifest's places, the buckets one after the other (64-byte aligned).
absl::Status SnapshotStaging::Layout(const PolicyModel& model, at::ScalarType dtype,
                                     const PackingOptions* buckets, int64_t* elements) {
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
  const auto round64 = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  *elements = 0;
  if (buckets == nullptr) {
    for (const auto& [name, t] : model.named_parameters()) {
      offsets_.push_back(*elements);
      *elements += round64(t.numel() * esize) / esize;
    }
    return absl::OkStatus();
  }
  ASYMPO_ASSIGN_OR_RETURN(const v1::SnapshotManifest plan, PlanSnapshot(specs_, 0, *buckets));
  int64_t end = 0;
  for (const v1::BucketInfo& b : plan.buckets()) {
    bucket_starts_.push_back(end);
    end = round64(end + static_cast<int64_t>(b.size_bytes()));
  }
  for (const v1::TensorEntry& e : plan.tensors()) {
    offsets_.push_back((bucket_starts_[e.bucket()] + static_cast<int64_t>(e.offset())) / esize);
  }
  *elements = end / esize;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SnapshotStaging>> SnapshotStaging::Create(
    const PolicyModel& model, at::ScalarType dtype, const PackingOptions* buckets) {
  if (absl::StatusOr<v1::DType> wire = ToDType(dtype); !wire.ok()) return wire.status();
  return GuardTorch(
      "allocating the snapshot staging buffers",
      [&]() -> absl::StatusOr<std::unique_ptr<SnapshotStaging>> {
        std::unique_ptr<SnapshotStaging> s(new SnapshotStaging());
        s->specs_ = ModelTensorSpecs(model, dtype);
        int64_t elements = 0;
        ASYMPO_RETURN_IF_ERROR(s->Layout(model, dtype, buckets, &elements));
        const at::Device device = model.options().device;
        s->device_ = std::make_shared<at::Tensor>(at::zeros(
            {std::max<int64_t>(elements, 1)}, at::TensorOptions().dtype(dtype).device(device)));
        s->device_pool_.push_back(s->device_);
        s->host_ = device.is_cpu()
                       ? at::empty_like(*s->device_)
                       : at::empty({s->device_->numel()},
                                   at::TensorOptions().dtype(dtype).pinned_memory(true));
        s->bytes_ = elements * static_cast<int64_t>(c10::elementSize(dtype));
        if (!device.is_cpu()) {
          const c10::impl::VirtualGuardImpl impl(device.type());
          s->copy_stream_ = impl.getStreamFromGlobalPool(device);
          s->staged_ = std::make_unique<c10::Event>(device.type());
        }
        return s;
      });
}

absl::Status SnapshotStaging::Stage(const PolicyModel& model) {
  return GuardTorch("staging the weights", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    if (device_.use_count() > 2) {  // this object's two references, plus a snapshot's
      std::shared_ptr<at::Tensor> free;
      for (const auto& b : device_pool_) {
        if (b.use_count() == 1) free = b;  // only the pool holds it
      }
      if (free == nullptr) {
        free = std::make_shared<at::Tensor>(at::zeros_like(*device_));
        device_pool_.push_back(free);
      }
      device_ = free;
    }
    const auto& params = model.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i].second;
      device_->narrow(0, offsets_[i], p.numel()).view(p.sizes()).copy_(p.detach());
    }
    if (staged_ != nullptr) {
      staged_->record(
          c10::impl::VirtualGuardImpl(device_->device().type()).getStream(device_->device()));
    }
    return absl::OkStatus();
  });
}

DeviceBuckets SnapshotStaging::DeviceBucketsOfStage() const {
  DeviceBuckets out;
  if (bucket_starts_.empty()) return out;
  const char* base = static_cast<const char*>(device_->data_ptr());
  for (int64_t start : bucket_starts_) out.buckets.push_back(base + start);
  out.keep_alive = device_;
  return out;
}

absl::StatusOr<std::vector<TensorView>> SnapshotStaging::CopyToHost() {
  return GuardTorch("copying the weights to the host",
                    [&]() -> absl::StatusOr<std::vector<TensorView>> {
                      if (copy_stream_.has_value()) {
                        // On the copy stream, after Stage's kernels; wait for it to finish.
                        staged_->block(*copy_stream_);
                        {
                          const c10::StreamGuard on_copy_stream(*copy_stream_);
                          host_.copy_(*device_, /*non_blocking=*/true);
                        }
                        copy_stream_->synchronize();
                      } else {
                        host_.copy_(*device_);  // one transfer; blocks until it is done
                      }
                      std::vector<TensorView> views;
                      views.reserve(specs_.size());
                      const int64_t element = static_cast<int64_t>(host_.element_size());
                      for (size_t i = 0; i < specs_.size(); ++i) {
                        TensorView v;
                        v.spec = specs_[i];
                        int64_t numel = 1;
                        for (int64_t d : v.spec.shape) numel *= d;
                        v.data = static_cast<const char*>(host_.data_ptr()) + offsets_[i] * element;
                        v.size_bytes = static_cast<uint64_t>(numel * element);
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
