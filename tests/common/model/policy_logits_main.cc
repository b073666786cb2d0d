// policy_logits: the C++ policy's logits for given token ids, for the GPU
// comparison with Hugging Face transformers (hf_gpu_logits_check.py).
//
//   policy_logits MODEL_DIR IDS_FILE OUT_FILE DEVICE DTYPE
// IDS_FILE: one sequence per line, whitespace-separated ids, all the same
// length. Writes the (B, T, V) logits as float32 little-endian bytes.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/types.h>

#include "common/model/device.h"
#include "common/model/model_io.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: policy_logits MODEL_DIR IDS_FILE OUT_FILE DEVICE DTYPE\n");
    return 2;
  }
  asympo::ModelOptions o;
  auto device = asympo::ParseDevice(argv[4]);
  auto dtype = asympo::ParseModelDType(argv[5]);
  if (!device.ok() || !dtype.ok()) {
    std::fprintf(stderr, "policy_logits: bad device or dtype\n");
    return 2;
  }
  o.device = *device;
  o.dtype = *dtype;
  auto model = asympo::LoadPolicyModel(argv[1], o);
  if (!model.ok()) {
    std::fprintf(stderr, "policy_logits: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::vector<std::vector<int64_t>> rows;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::vector<int64_t> row;
    for (int64_t id; ss >> id;) row.push_back(id);
    if (!row.empty()) rows.push_back(row);
  }
  const int64_t b = static_cast<int64_t>(rows.size()), t = static_cast<int64_t>(rows[0].size());
  torch::Tensor ids = torch::empty({b, t}, torch::kLong);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < t; ++j) ids[i][j] = rows[static_cast<size_t>(i)][static_cast<size_t>(j)];
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor pos = torch::arange(t, torch::kLong).unsqueeze(0).expand({b, t});
  const torch::Tensor h = (*model)->Forward(ids.to(o.device), pos.contiguous().to(o.device),
                                            torch::ones({b, t}, torch::kBool).to(o.device));
  const torch::Tensor logits = (*model)->Logits(h).to(torch::kCPU, torch::kFloat).contiguous();
  std::ofstream out(argv[3], std::ios::binary);
  out.write(static_cast<const char*>(logits.data_ptr()),
            static_cast<std::streamsize>(logits.numel() * sizeof(float)));
  return out.good() ? 0 : 1;
}
