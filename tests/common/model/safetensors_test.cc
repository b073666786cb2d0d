#include "common/model/safetensors.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace asympo {
namespace {

namespace fs = std::filesystem;
using ::asympo::testing::DirEntries;
using ::asympo::testing::ReadFile;
using ::asympo::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file built by hand: length prefix, `header` as given, then `data`.
std::string RawFile(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { gen_ = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/1234); }

  std::string Path(const std::string& name) const { return tmp_.Path(name); }
  at::Tensor Randn(at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
    return at::randn(shape, gen_, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  }

  // Writes `bytes` to `name` and returns what SafetensorsFile::Open says.
  absl::Status OpenRaw(const std::string& bytes, const std::string& name = "raw.safetensors") {
    WriteBytes(Path(name), bytes);
    return SafetensorsFile::Open(Path(name)).status();
  }

  asympo::testing::ScopedTempDir tmp_{"safetensors_test"};
  const std::string dir_ = tmp_.path();
  at::Generator gen_;
};

TEST_F(SafetensorsTest, RoundTripsFloatDtypesScalarAndEmptyTensor) {
  const Tensors tensors = {
      {"w.f32", Randn({3, 4})},
      {"w.bf16", Randn({5}, at::kBFloat16)},
      {"w.f16", Randn({2, 3, 2}, at::kHalf)},
      {"scalar", at::full({}, 3.5, at::kFloat)},
      {"empty", at::empty({0, 4}, at::kBFloat16)},
      {"ids", at::arange(7, at::kLong)},
  };
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), tensors));
  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_OK(file);
  EXPECT_THAT((*file)->Names(), ElementsAre("empty", "ids", "scalar", "w.bf16", "w.f16", "w.f32"));
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    auto got = (*file)->Get(name);
    ASSERT_OK(got);
    EXPECT_EQ(got->scalar_type(), expected.scalar_type());
    EXPECT_EQ(got->sizes(), expected.sizes());
    EXPECT_TRUE(at::equal(*got, expected));
  }
  EXPECT_EQ((*file)->Find("w.bf16")->dtype, "BF16");
  EXPECT_EQ((*file)->Find("w.f16")->dtype, "F16");
  EXPECT_TRUE((*file)->Find("scalar")->shape.empty());
  EXPECT_THAT((*file)->Find("empty")->shape, ElementsAre(0, 4));
  EXPECT_EQ((*file)->data_start() % 8, 0u);
}

TEST_F(SafetensorsTest, WritesNonContiguousTensorsAsRowMajor) {
  const at::Tensor base = Randn({4, 3});
  ASSERT_OK(WriteSafetensors(Path("t.safetensors"), {{"t", base.t()}}));
  auto file = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_OK(file);
  auto got = (*file)->Get("t");
  ASSERT_OK(got);
  EXPECT_TRUE(at::equal(*got, base.t().contiguous()));
}

TEST_F(SafetensorsTest, GetWithoutConversionAliasesTheMappingAndOutlivesTheFile) {
  const at::Tensor w = Randn({64, 16});
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), {{"w", w}}));
  at::Tensor first;
  {
    auto file = SafetensorsFile::Open(Path("m.safetensors"));
    ASSERT_OK(file);
    first = *(*file)->Get("w");
    auto second = (*file)->Get("w", at::kFloat);
    ASSERT_OK(second);
    EXPECT_EQ(first.data_ptr(), second->data_ptr());  // the same mapped bytes
  }
  // The file object is gone; the tensor keeps the mapping alive.
  EXPECT_TRUE(at::equal(first, w));
  // Writes land on private copy-on-write pages, never in the file.
  first.fill_(7.0f);
  auto reopened = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_OK(reopened);
  EXPECT_TRUE(at::equal(*(*reopened)->Get("w"), w));
}

TEST_F(SafetensorsTest, GetConvertsToTheRequestedDtype) {
  const at::Tensor bf16 = Randn({8, 8}, at::kBFloat16);
  const at::Tensor f32 = Randn({3, 5});
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), {{"bf16", bf16}, {"f32", f32}}));
  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_OK(file);
  auto up = (*file)->Get("bf16", at::kFloat);
  ASSERT_OK(up);
  EXPECT_EQ(up->scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(*up, bf16.to(at::kFloat)));  // widening is exact
  auto down = (*file)->Get("f32", at::kHalf);
  ASSERT_OK(down);
  EXPECT_TRUE(at::equal(*down, f32.to(at::kHalf)));
  // A conversion owns its memory: a second one is a different buffer.
  EXPECT_NE(down->data_ptr(), (*file)->Get("f32", at::kHalf)->data_ptr());
}

TEST_F(SafetensorsTest, CopiesMisalignedTensorInsteadOfAliasingIt) {
  // A 2-byte F16 first puts the F32 at an address that is 2 mod 4.
  const std::string header = R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
                             R"("f":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const std::string data = std::string("\x00\x3c", 2) +          // F16 1.0
                           std::string("\x00\x00\x80\x3f", 4) +  // F32 1.0
                           std::string("\x00\x00\x00\xc0", 4);   // F32 -2.0
  WriteBytes(Path("m.safetensors"), RawFile(padded, data));
  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_OK(file);
  auto f = (*file)->Get("f");
  ASSERT_OK(f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data_ptr()) % 4, 0u);
  EXPECT_TRUE(at::equal(*f, at::tensor({1.0f, -2.0f})));
  EXPECT_EQ((*file)->Get("h", at::kFloat)->item<float>(), 1.0f);
}

TEST_F(SafetensorsTest, WritesMetadataWithDefaultFormat) {
  ASSERT_OK(WriteSafetensors(Path("a.safetensors"), {{"x", Randn({2})}},
                             {{"step", "7"}, {"policy", "asympo"}}));
  auto a = SafetensorsFile::Open(Path("a.safetensors"));
  ASSERT_OK(a);
  EXPECT_EQ((*a)->metadata(), (std::map<std::string, std::string>{
                                  {"format", "pt"}, {"policy", "asympo"}, {"step", "7"}}));
  // A caller's format wins.
  ASSERT_OK(WriteSafetensors(Path("b.safetensors"), {}, {{"format", "mlx"}}));
  auto b = SafetensorsFile::Open(Path("b.safetensors"));
  ASSERT_OK(b);
  EXPECT_EQ((*b)->metadata().at("format"), "mlx");
  EXPECT_TRUE((*b)->Names().empty());
}

// The bytes the format specification prescribes, built by hand: readers other
// than ours (Python's safetensors, transformers) read exactly this.
TEST_F(SafetensorsTest, WritesTheExactBytesOfTheFormat) {
  const Tensors tensors = {
      {"b", at::tensor({1.0f, -2.0f}).reshape({1, 2}).to(at::kBFloat16)},
      {"s", at::full({}, 1.0, at::kHalf)},
      {"a", at::tensor({0.5f})},
  };
  ASSERT_OK(WriteSafetensors(Path("x.safetensors"), tensors));
  const std::string expected =
      std::string("\xc8\x00\x00\x00\x00\x00\x00\x00", 8) +  // header length 200
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[4,8]},)"
      R"("s":{"dtype":"F16","shape":[],"data_offsets":[8,10]}})"
      "      " +                            // padding to 200 bytes
      std::string("\x00\x00\x00\x3f", 4) +  // a: F32 0.5
      std::string("\x80\x3f\x00\xc0", 4) +  // b: BF16 1.0, -2.0
      std::string("\x00\x3c", 2);           // s: F16 1.0
  EXPECT_EQ(ReadFile(Path("x.safetensors")), expected);
}

TEST_F(SafetensorsTest, ReadsHandBuiltFileWithOtherKeyOrderAndPadding) {
  const std::string header = R"({ "y": {"shape": [2], "data_offsets": [0, 4], "dtype": "BF16"},)"
                             R"( "__metadata__": {"k": "v"} }        )";
  WriteBytes(Path("h.safetensors"), RawFile(header, std::string("\x80\x3f\x00\x40", 4)));
  auto file = SafetensorsFile::Open(Path("h.safetensors"));
  ASSERT_OK(file);
  EXPECT_EQ((*file)->metadata().at("k"), "v");
  EXPECT_TRUE(at::equal(*(*file)->Get("y", at::kFloat), at::tensor({1.0f, 2.0f})));
}

TEST_F(SafetensorsTest, WriterLeavesNoTemporaryFiles) {
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), {{"x", Randn({4})}}));
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), {{"x", Randn({5})}}));  // replaces
  EXPECT_THAT(DirEntries(dir_), ElementsAre("m.safetensors"));
  EXPECT_THAT((*SafetensorsFile::Open(Path("m.safetensors")))->Find("x")->shape, ElementsAre(5));
}

TEST_F(SafetensorsTest, WriterRejectsBadInputsNamingThem) {
  const std::string path = Path("bad.safetensors");
  auto message = [](const absl::Status& s) { return std::string(s.message()); };
  absl::Status s = WriteSafetensors(path, {{"x", Randn({1})}, {"x", Randn({1})}});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(message(s), HasSubstr("'x' appears twice"));
  s = WriteSafetensors(path, {{"__metadata__", Randn({1})}});
  EXPECT_THAT(message(s), HasSubstr("reserved"));
  s = WriteSafetensors(path, {{"u", at::Tensor()}});
  EXPECT_THAT(message(s), HasSubstr("'u' must be a defined"));
  s = WriteSafetensors(path, {{"c", at::zeros({2}, at::kComplexFloat)}});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(message(s), HasSubstr("tensor 'c'"));
  s = WriteSafetensors(Path("no/such/dir/m.safetensors"), {{"x", Randn({1})}});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(message(s), HasSubstr("no/such/dir/m.safetensors"));
  EXPECT_TRUE(DirEntries(dir_).empty());
}

// ---- Corrupt files: each error names the file and the offending part. ----

TEST_F(SafetensorsTest, RejectsFileShorterThanTheLengthPrefix) {
  const absl::Status s = OpenRaw("\x01\x02\x03\x04\x05");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "raw.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("file is 5 bytes, shorter than"));
}

TEST_F(SafetensorsTest, RejectsTruncatedFileSayingTheOffsetAndSize) {
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), {{"w", Randn({10})}}));
  const std::string bytes = ReadFile(Path("m.safetensors"));
  const size_t full = bytes.size();
  const absl::Status s = OpenRaw(bytes.substr(0, full - 3));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          absl::StrCat("tensor 'w' (data_offsets [0, 40]) ends at byte offset ",
                                       full, ", past the end of the file (size ", full - 3, ")")));
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastTheEndOfTheFile) {
  const absl::Status s = OpenRaw(Le64(1000) + "{}");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("header length 1000 (bytes 0-7) runs past the end of the file"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("file size is 10"));
  EXPECT_THAT(std::string(OpenRaw(Le64(~uint64_t{0}) + "{}").message()), HasSubstr("runs past"));
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotJsonOrNotAnObject) {
  absl::Status s = OpenRaw(RawFile(R"({"w": {"dtype": )", ""));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "is not valid JSON"));
  s = OpenRaw(RawFile("[1, 2]  ", ""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("header must be a JSON object, got a array"));
  s = OpenRaw(RawFile("{\"\xff\": 1}", ""));  // not UTF-8
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not valid JSON"));
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  const absl::Status s =
      OpenRaw(RawFile(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'w': unknown dtype \"F33\""));
}

TEST_F(SafetensorsTest, RejectsNegativeOrNonIntegerDims) {
  absl::Status s =
      OpenRaw(RawFile(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'w': shape [-1] has a negative"));
  s = OpenRaw(RawFile(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("holds a non-integer"));
}

TEST_F(SafetensorsTest, RejectsDataOffsetsThatAreNotTwoIncreasingIntegers) {
  for (const std::string offsets : {"[4,0]", "[0]", "[0,4,8]", "[0.0,4]", "[\"0\",4]", "[-4,0]"}) {
    SCOPED_TRACE(offsets);
    const absl::Status s = OpenRaw(
        RawFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":)" + offsets + "}}", "abcd"));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "raw.safetensors': tensor 'w': "));
    EXPECT_THAT(std::string(s.message()), HasSubstr("data_offsets"));
  }
}

TEST_F(SafetensorsTest, RejectsByteLengthThatDoesNotMatchTheShape) {
  const absl::Status s =
      OpenRaw(RawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "abcdefgh"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor 'w': data_offsets [0, 8] span 8 bytes, but shape [3] of F32 "
                        "needs 3 * 4 bytes"));
}

TEST_F(SafetensorsTest, RejectsOverlappingTensorsAndGaps) {
  absl::Status s = OpenRaw(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   std::string(12, 'x')));
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr("tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) overlap"));
  s = OpenRaw(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                      std::string(12, 'x')));
  EXPECT_THAT(std::string(s.message()), HasSubstr("belong to no tensor (a gap before tensor 'b')"));
  s = OpenRaw(
      RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(6, 'x')));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 trailing bytes belong to no tensor"));
}

TEST_F(SafetensorsTest, RejectsDuplicateNamesAndNonStringMetadata) {
  absl::Status s = OpenRaw(RawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                   R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                                   "x"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("header names 'a' more than once"));
  s = OpenRaw(RawFile(R"({"__metadata__":{"step":7}})", ""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("value for 'step' must be a string"));
}

TEST_F(SafetensorsTest, ReportsMissingFilesAndTensorsAsNotFound) {
  EXPECT_THAT(SafetensorsFile::Open(Path("absent.safetensors")),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(WriteSafetensors(Path("m.safetensors"), {{"x", Randn({1})}}));
  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_OK(file);
  const absl::Status s = (*file)->Get("y").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "has no tensor 'y'"));
}

TEST_F(SafetensorsTest, ValidatesButCannotConvertDtypesLibTorchLacks) {
  WriteBytes(Path("u.safetensors"),
             RawFile(R"({"u":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", "abcd"));
  auto file = SafetensorsFile::Open(Path("u.safetensors"));
  ASSERT_OK(file);
  const absl::Status s = (*file)->Get("u").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnimplemented, "tensor 'u'"));
}

}  // namespace
}  // namespace asympo
