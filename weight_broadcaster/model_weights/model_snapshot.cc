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

std::vector<TensorView> ModelTensorViewsUnguarded(const PolicyModel& model,
                                                  std::vector<at::Tensor>* staging);
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

absl::StatusOr<std::unique_ptr<SnapshotStaging>> SnapshotStaging::Create(const PolicyModel& model,
                                                                          at::ScalarType dtype) {
  if (absl::StatusOr<v1::DType> wire = ToDType(dtype); !wire.ok()) return wire.status();
  return GuardTorch("allocating the snapshot staging buffers",
                    [&]() -> absl::StatusOr<std::unique_ptr<SnapshotStaging>> {
    std::unique_ptr<SnapshotStaging> s(new SnapshotStaging());
    s->specs_ = ModelTensorSpecs(model, dtype);
    // Every tensor starts 64-byte aligned.
    const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(c10::elementSize(dtype)));
    int64_t elements = 0;
    for (const auto& [name, t] : model.named_parameters()) {
      s->offsets_.push_back(elements);
      elements += (t.numel() + align - 1) / align * align;
    }
    const at::Device device = model.options().device;
    s->device_ = at::empty({std::max<int64_t>(elements, 1)},
                           at::TensorOptions().dtype(dtype).device(device));
    s->host_ = device.is_cpu() ? at::empty_like(s->device_)
                               : at::empty({s->device_.numel()},
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
    const auto& params = model.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i].second;
      device_.narrow(0, offsets_[i], p.numel()).view(p.sizes()).copy_(p.detach());
    }
    if (staged_ != nullptr) {
      staged_->record(c10::impl::VirtualGuardImpl(device_.device().type()).getStream(device_.device()));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<TensorView>> SnapshotStaging::CopyToHost() {
  return GuardTorch("copying the weights to the host",
                    [&]() -> absl::StatusOr<std::vector<TensorView>> {
    if (copy_stream_.has_value()) {
      // On the copy stream, after Stage's kernels; wait for it to finish.
      staged_->block(*copy_stream_);
      {
        const c10::StreamGuard on_copy_stream(*copy_stream_);
        host_.copy_(device_, /*non_blocking=*/true);
      }
      copy_stream_->synchronize();
    } else {
      host_.copy_(device_);  // one transfer; blocks until it is done
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

absl::StatusOr<std::vector<TensorView>> ModelTensorViews(const PolicyModel& model,
                                                         std::vector<at::Tensor>* staging) {
  return GuardTorch("packing the weights", [&]() -> absl::StatusOr<std::vector<TensorView>> {
    return ModelTensorViewsUnguarded(model, staging);
  });
}

absl::Status LoadSnapshotIntoModel(const ReceivedSnapshot& snapshot, PolicyModel* model) {
  return GuardTorch(absl::StrCat("loading snapshot ", snapshot.version()),
                    [&] { return LoadSnapshotUnguarded(snapshot, model); });
}

namespace {

std::vector<TensorView> ModelTensorViewsUnguarded(const PolicyModel& model,
                                                  std::vector<at::Tensor>* staging) {
  std::vector<TensorSpec> specs = ModelTensorSpecs(model);
  std::vector<TensorView> views;
  views.reserve(specs.size());
  staging->clear();
  staging->reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor t = model.named_parameters()[i].second.detach();
    if (!t.device().is_cpu() || !t.is_contiguous()) t = t.to(at::kCPU).contiguous();
    staging->push_back(t);
    TensorView v;
    v.spec = std::move(specs[i]);
    v.data = t.data_ptr();
    v.size_bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    views.push_back(std::move(v));
  }
  return views;
}

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
