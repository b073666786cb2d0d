// Export and load round trips, and logits against an independent PyTorch
// implementation of the Hugging Face forward pass
// (tests/reference/hf_reference_model.py, run with Debian's python3-torch),
// from config.json as transformers 4 and 5 write it.
#include "common/model/model_io.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "common/model/safetensors.h"
#include "tests/testing/counting_allocator.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo {
namespace {

using ::asympo::testing::StatusIs;
using ::testing::HasSubstr;

// Model directories of one test, removed at its end.
class Dirs {
 public:
  std::string New(const std::string& name) { return tmp_.Path(name); }

 private:
  asympo::testing::ScopedTempDir tmp_{"model_io_test"};
};

std::unique_ptr<PolicyModel> Random(const ModelConfig& c, uint64_t seed) {
  ModelOptions o;
  o.seed = seed;
  o.init_std = 0.2;
  return PolicyModel::CreateRandom(c, o).value();
}

ModelConfig LlamaStyle() {
  ModelConfig c = ModelConfig::Tiny(96);
  c.model_type = "llama";
  c.qk_norm = false;
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.num_key_value_heads = 1;
  c.rope_theta = 500000;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 32;
  return c;
}

TEST(ModelIoTest, ExportThenLoadRoundTripsEveryParameter) {
  Dirs dirs;
  for (const ModelConfig& c : {ModelConfig::Tiny(64), LlamaStyle()}) {
    const auto m = Random(c, 5);
    const std::string dir = dirs.New(c.model_type);
    ASSERT_OK(ExportPolicyModel(*m, dir));
    const auto loaded = LoadPolicyModel(dir, {});
    ASSERT_OK(loaded);
    ASSERT_EQ((*loaded)->named_parameters().size(), m->named_parameters().size());
    for (size_t i = 0; i < m->named_parameters().size(); ++i) {
      EXPECT_TRUE(
          torch::equal((*loaded)->named_parameters()[i].second, m->named_parameters()[i].second))
          << m->named_parameters()[i].first;
    }
    EXPECT_EQ((*loaded)->config().rope_scaling.type, c.rope_scaling.type);
  }
}

TEST(ModelIoTest, LoadsShardedCheckpointsAndBfloat16) {
  Dirs dirs;
  const auto m = Random(ModelConfig::Tiny(64), 6);
  const std::string dir = dirs.New("sharded");
  ASSERT_OK(ExportPolicyModel(*m, dir, /*max_shard_bytes=*/40000));
  std::ifstream index(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index.good());
  ModelOptions bf16;
  bf16.dtype = torch::kBFloat16;
  const auto loaded = LoadPolicyModel(dir, bf16);
  ASSERT_OK(loaded);
  EXPECT_EQ((*loaded)->named_parameters()[0].second.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose((*loaded)->named_parameters()[0].second.to(torch::kFloat),
                              m->named_parameters()[0].second, 1e-2, 1e-2));
}

// float32 weights exported in bfloat16: each shard is converted when it is
// written, so the export's tensor memory is one shard, not the model's.
TEST(ModelIoTest, ExportConvertsAShardAtATime) {
  Dirs dirs;
  ModelConfig c = ModelConfig::Tiny(128);
  c.num_hidden_layers = 6;
  const auto m = Random(c, 8);
  const std::string dir = dirs.New("streamed");
  const int64_t shard_bytes = 2 * 128 * 128 * 4;  // bfloat16 bytes a shard
  int64_t whole = 0, largest = 0;
  for (const auto& [name, t] : m->named_parameters()) {
    whole += 2 * t.numel();
    largest = std::max<int64_t>(largest, 2 * t.numel());
  }
  ASSERT_GT(whole, 4 * std::max(shard_bytes, largest));
  int64_t peak = 0;
  {
    ::asympo::testing::CountingAllocator::Installed counting;
    counting->Reset();
    ASSERT_OK(ExportPolicyModel(*m, dir, shard_bytes, torch::kBFloat16));
    peak = counting->PeakAbove();
  }
  EXPECT_LE(peak, std::max(shard_bytes, largest) + (int64_t{64} << 10)) << "whole " << whole;
  ModelOptions bf16;
  bf16.dtype = torch::kBFloat16;
  const auto loaded = LoadPolicyModel(dir, bf16);
  ASSERT_OK(loaded);
  for (size_t i = 0; i < m->named_parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal((*loaded)->named_parameters()[i].second,
                             m->named_parameters()[i].second.to(torch::kBFloat16)))
        << m->named_parameters()[i].first;
  }
}

TEST(ModelIoTest, NamesMissingOrMisShapedTensors) {
  Dirs dirs;
  const auto m = Random(ModelConfig::Tiny(64), 7);
  const std::string dir = dirs.New("broken");
  ASSERT_OK(ExportPolicyModel(*m, dir));
  auto params = m->named_parameters();
  params.erase(params.begin() + 4);  // drop one tensor
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [n, t] : params) tensors.emplace_back(n, t.detach());
  ASSERT_OK(WriteSafetensors(dir + "/model.safetensors", tensors));
  const auto loaded = LoadPolicyModel(dir, {});
  EXPECT_THAT(loaded, StatusIs(absl::StatusCode::kInvalidArgument, m->named_parameters()[4].first));
  EXPECT_THAT(LoadPolicyModel(dirs.New("absent"), {}), StatusIs(absl::StatusCode::kNotFound));
}

// Writes ids, runs the Python reference, returns its logits (1, T, V).
torch::Tensor ReferenceLogits(const std::string& dir, const std::vector<int64_t>& ids,
                              int64_t vocab) {
  const std::string ids_path = dir + "/ids.txt", out_path = dir + "/logits.bin";
  {
    std::ofstream f(ids_path);
    for (int64_t id : ids) f << id << " ";
    f << "\n";
  }
  const std::string cmd = "/usr/bin/python3 " ASYMPO_SOURCE_DIR
                          "/tests/reference/hf_reference_model.py '" +
                          dir + "' '" + ids_path + "' '" + out_path + "'";
  if (std::system(cmd.c_str()) != 0) return {};
  std::ifstream f(out_path, std::ios::binary);
  const int64_t t = static_cast<int64_t>(ids.size());
  torch::Tensor logits = torch::empty({1, t, vocab});
  f.read(reinterpret_cast<char*>(logits.data_ptr<float>()), t * vocab * 4);
  return f ? logits : torch::Tensor();
}

// Rewrites DIR/config.json as transformers 5 saves it: rope_theta and
// rope_scaling move into rope_parameters, torch_dtype becomes dtype.
void RewriteAsTransformersFive(const std::string& dir) {
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  nlohmann::json rope =
      j["rope_scaling"].is_object() ? j["rope_scaling"] : nlohmann::json::object();
  rope["rope_theta"] = j["rope_theta"];
  if (!rope.contains("rope_type")) rope["rope_type"] = "default";
  j["rope_parameters"] = rope;
  j["dtype"] = j["torch_dtype"];
  for (const char* key : {"rope_theta", "rope_scaling", "torch_dtype"}) j.erase(key);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

// Each model is exported, then loaded back from its config.json as
// transformers 4 writes it (the export's own) and as transformers 5 writes
// it; both must match the reference (which reads either layout) and the
// exported model's own logits.
TEST(ModelIoTest, LogitsMatchAnIndependentPyTorchImplementation) {
  Dirs dirs;
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-torch is not installed (deploy/install_deps.sh installs it)";
  }
  for (const ModelConfig& c : {ModelConfig::Tiny(64), LlamaStyle()}) {
    const auto m = Random(c, 8);
    // Long enough to cross the llama3 scaling bands (original context 32).
    std::vector<int64_t> ids;
    for (int i = 0; i < 70; ++i) ids.push_back((i * 37 + 11) % c.vocab_size);
    torch::NoGradGuard no_grad;
    const int64_t t = static_cast<int64_t>(ids.size());
    const auto logits = [&](const PolicyModel& p) {
      return p.Logits(p.Forward(torch::tensor(ids).unsqueeze(0), torch::arange(t).unsqueeze(0),
                                torch::ones({1, t}, torch::kBool)));
    };
    const torch::Tensor ours = logits(*m);
    for (const std::string layout : {"4", "5"}) {
      const std::string dir = dirs.New("ref_" + c.model_type + "_" + layout);
      ASSERT_OK(ExportPolicyModel(*m, dir));
      if (layout == "5") RewriteAsTransformersFive(dir);
      const auto loaded = LoadPolicyModel(dir, {});
      ASSERT_OK(loaded);
      EXPECT_TRUE(torch::equal(logits(**loaded), ours)) << c.model_type << " layout " << layout;
      const torch::Tensor ref = ReferenceLogits(dir, ids, c.vocab_size);
      ASSERT_TRUE(ref.defined()) << "the reference program failed";
      const double max_diff = (ours - ref).abs().max().item<double>();
      EXPECT_LT(max_diff, 1e-4) << c.model_type << " layout " << layout;
      RecordProperty("max_abs_diff_" + c.model_type + "_" + layout, std::to_string(max_diff));
    }
  }
}

}  // namespace
}  // namespace asympo
