#include "weight_broadcaster/model_weights/model_snapshot.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"

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

std::vector<TensorSpec> ModelTensorSpecs(const PolicyModel& model) {
  std::vector<TensorSpec> specs;
  specs.reserve(model.named_parameters().size());
  for (const auto& [name, t] : model.named_parameters()) {
    TensorSpec s;
    s.name = name;
    // Model dtypes are float32/bfloat16/float16 (ModelOptions), all mapped.
    s.dtype = ToDType(t.scalar_type()).value_or(v1::DTYPE_UNSPECIFIED);
    s.shape.assign(t.sizes().begin(), t.sizes().end());
    specs.push_back(std::move(s));
  }
  return specs;
}

std::string ModelSignatureOf(const PolicyModel& model) {
  return ModelSignature(ModelTensorSpecs(model));
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
