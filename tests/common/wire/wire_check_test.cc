#include "common/wire/wire_check.h"

#include <string>

#include <gmock/gmock.h>
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "asympo/v1/rollout.pb.h"
#include "asympo/v1/weight_broadcast.pb.h"
#include "tests/testing/rollout_batch_builder.h"
#include "tests/testing/status_matchers.h"

namespace asympo {
namespace {

using ::asympo::testing::RolloutBatchBuilder;
using ::asympo::testing::StatusIs;

BatchLimits CheckLimits() {
  BatchLimits l;
  l.vocab_size = 100;
  l.max_groups_per_batch = 8;
  l.max_group_size = 4;
  l.max_prompt_tokens = 16;
  l.max_response_tokens = 16;
  return l;
}

// Groups "p0", "p1" of prompt {1, 2}; response j holds {3}, reward j.
v1::RolloutBatch WireBatch() {
  return RolloutBatchBuilder(2, 2)
      .Source("gen")
      .BatchId("gen/1")
      .ResponseTokens([](int, int) { return std::vector<int32_t>{3}; })
      .Build();
}

absl::Status Check(const std::string& bytes, const BatchLimits& limits = CheckLimits()) {
  return CheckRolloutBatchWire({bytes}, limits);
}

// Appends a varint-encoded tag for `field` with `wire_type`.
void Tag(std::string* out, int field, int wire_type) {
  uint32_t v = static_cast<uint32_t>(field << 3 | wire_type);
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

TEST(WireCheckTest, AcceptsAValidBatchAndItParsesToTheSameMessage) {
  const v1::RolloutBatch b = WireBatch();
  const std::string bytes = b.SerializeAsString();
  ASSERT_OK(Check(bytes));
  v1::RolloutBatch parsed;
  ASSERT_OK(ParseCheckedWire({bytes}, &parsed));
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
}

TEST(WireCheckTest, AnswersTheSameWhateverTheSlicing) {
  v1::RolloutBatch b = WireBatch();
  b.mutable_groups(1)->set_prompt_id("\xff");
  const std::string bytes = b.SerializeAsString();
  WireSlices one_byte;
  for (size_t i = 0; i < bytes.size(); ++i) one_byte.emplace_back(bytes.data() + i, 1);
  const absl::Status whole = Check(bytes);
  const absl::Status sliced = CheckRolloutBatchWire(one_byte, CheckLimits());
  EXPECT_THAT(whole, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(whole, sliced);
  const std::string valid = WireBatch().SerializeAsString();
  WireSlices halves = {absl::string_view(valid).substr(0, 7), absl::string_view(valid).substr(7)};
  EXPECT_OK(CheckRolloutBatchWire(halves, CheckLimits()));
  v1::RolloutBatch parsed;
  ASSERT_OK(ParseCheckedWire(halves, &parsed));
  EXPECT_EQ(parsed.SerializeAsString(), valid);
}

// A million empty groups are 2 MB on the wire and would be about 100 MB of
// PromptGroup objects: the count is refused on the bytes.
TEST(WireCheckTest, RefusesTooManyEmptyGroupsBeforeParsing) {
  std::string bytes;
  for (int i = 0; i < 1000000; ++i) {
    Tag(&bytes, 1, 2);
    bytes.push_back('\0');
  }
  EXPECT_EQ(Check(bytes), absl::InvalidArgumentError(
                              "batch has 1000000 groups, more than max_groups_per_batch 8"));
}

TEST(WireCheckTest, RefusesTooManyEmptyResponsesInAGroup) {
  std::string group;
  Tag(&group, 1, 2);
  group += "\x01p";
  for (int i = 0; i < 100000; ++i) {
    Tag(&group, 3, 2);
    group.push_back('\0');
  }
  v1::RolloutBatch b;
  b.add_groups()->ParseFromString(group);
  const std::string bytes = b.SerializeAsString();
  EXPECT_EQ(Check(bytes),
            absl::InvalidArgumentError(
                "group 0 (prompt_id \"p\"): group has 100000 responses; group size must be in "
                "[2, 4]"));
}

// Every count the wire check bounds is reported with ValidateRolloutBatch's
// own message.
TEST(WireCheckTest, CountMessagesMatchTheValidators) {
  std::vector<v1::RolloutBatch> bad;
  {
    v1::RolloutBatch b = WireBatch();
    for (int i = 0; i < 9; ++i) *b.add_groups() = b.groups(0);
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    for (int i = 0; i < 17; ++i) b.mutable_groups(1)->add_prompt_tokens(1);
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    for (int i = 0; i < 3; ++i) *b.mutable_groups(1)->add_responses() = b.groups(1).responses(0);
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    for (int i = 0; i < 17; ++i) b.mutable_groups(0)->mutable_responses(1)->add_tokens(1);
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    for (int i = 0; i < 17; ++i) {
      b.mutable_groups(0)->mutable_responses(1)->add_behavior_logprobs(-1.0f);
    }
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    b.set_source(std::string(129, 's'));
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    b.set_batch_id(std::string(129, 'b'));
    bad.push_back(b);
  }
  {
    v1::RolloutBatch b = WireBatch();
    b.mutable_groups(1)->set_prompt_id(std::string(300, 'q'));
    bad.push_back(b);
  }
  for (const v1::RolloutBatch& b : bad) {
    const absl::Status expected = ValidateRolloutBatch(b, CheckLimits());
    ASSERT_THAT(expected, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(Check(b.SerializeAsString()), expected);
  }
}

TEST(WireCheckTest, CountsUnpackedTokens) {
  std::string response;
  for (int i = 0; i < 20; ++i) {
    Tag(&response, 1, 0);  // tokens, one varint each (not packed)
    response.push_back('\x03');
  }
  v1::RolloutBatch b = WireBatch();
  ASSERT_TRUE(b.mutable_groups(0)->mutable_responses(0)->ParseFromString(response));
  EXPECT_EQ(Check(b.SerializeAsString()),
            absl::InvalidArgumentError("group 0 (prompt_id \"p0\") response 0: response has 20 "
                                       "tokens, more than max_response_tokens 16"));
}

TEST(WireCheckTest, RefusesStringsThatAreNotUtf8) {
  v1::RolloutBatch b = WireBatch();
  b.mutable_groups(1)->set_prompt_id("ok\xc3");
  EXPECT_EQ(
      Check(b.SerializeAsString()),
      absl::InvalidArgumentError("group 1 (prompt_id \"ok\\xc3\"): prompt_id is not valid UTF-8"));
  b = WireBatch();
  b.set_source("\xed\xa0\x80");
  EXPECT_EQ(Check(b.SerializeAsString()),
            absl::InvalidArgumentError("batch source is not valid UTF-8"));
  b = WireBatch();
  b.set_batch_id("\xc0\xaf");
  EXPECT_EQ(Check(b.SerializeAsString()),
            absl::InvalidArgumentError("batch_id is not valid UTF-8"));
}

TEST(WireCheckTest, MalformedBytesAreNamedAsSuch) {
  const std::string valid = WireBatch().SerializeAsString();
  for (size_t cut : {size_t{1}, valid.size() / 2, valid.size() - 1}) {
    const absl::Status s = Check(valid.substr(0, cut));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << cut;
    EXPECT_TRUE(
        absl::StartsWith(s.message(), "the request is not a valid asympo.v1.RolloutBatch: "))
        << s;
  }
  std::string group_wire_type;
  Tag(&group_wire_type, 5, 3);
  EXPECT_THAT(Check(group_wire_type),
              StatusIs(absl::StatusCode::kInvalidArgument, "group wire type"));
  EXPECT_THAT(Check("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Faults found by fuzzing (tests/fuzz/corpus/wire_check/crash-*): each was
// passed by the check (then refused by the parser), or answered differently
// for other slicings.
TEST(WireCheckTest, FaultsInsideAGroupOrATagAreNotMissed) {
  std::string bad_tag_in_group = "\x0a\x0c" + std::string(10, '\xff') + "\x0a\x00";
  std::string valid = WireBatch().SerializeAsString();
  // A length of 7 bytes whose low 32 bits are 0: protobuf refuses it.
  const std::string long_length = std::string("\x0a\x80\x80\x80\x80\x80\xff\x08", 8) + valid;
  for (const std::string& bytes :
       {bad_tag_in_group + valid, std::string("\xf8\xe1\xf5\xfe\xdf\xdf\xdf\xdf\x20"),
        valid + "\xe0", long_length}) {
    const absl::Status s = Check(bytes);
    v1::RolloutBatch parsed;
    EXPECT_FALSE(parsed.ParseFromString(bytes));  // the parser refuses it too
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            "the request is not a valid asympo.v1.RolloutBatch"));
    for (size_t cut = 0; cut <= bytes.size(); ++cut) {
      const WireSlices two = {absl::string_view(bytes).substr(0, cut),
                              absl::string_view(bytes).substr(cut)};
      EXPECT_EQ(CheckRolloutBatchWire(two, CheckLimits()), s) << cut;
    }
  }
  // A string field repeated: the parser keeps the last, but refuses any
  // that is not UTF-8.
  v1::RolloutBatch b = WireBatch();
  std::string group = b.groups(0).SerializeAsString();
  group += "\x0a\x01\xff\x0a\x01p";
  v1::RolloutBatch one;
  std::string bytes = "\x0a" + std::string(1, static_cast<char>(group.size())) + group;
  EXPECT_FALSE(one.ParseFromString(bytes));
  EXPECT_EQ(Check(bytes).message(), "group 0 (prompt_id \"p\"): prompt_id is not valid UTF-8");
}

TEST(WireCheckTest, BoundsUnknownFieldsButKeepsAFew) {
  v1::RolloutBatch b = WireBatch();
  std::string extra;
  for (int i = 0; i < 3; ++i) {
    Tag(&extra, 100 + i, 0);
    extra.push_back('\x01');
  }
  std::string bytes = b.SerializeAsString() + extra;
  EXPECT_OK(Check(bytes));
  std::string many;
  for (int i = 0; i < 65; ++i) {
    Tag(&many, 100, 0);
    many.push_back('\x01');
  }
  EXPECT_THAT(Check(b.SerializeAsString() + many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "more than 64 unknown fields in one RolloutBatch"));
}

// Response.first_policy_version and last_policy_version are known fields:
// they do not count toward a Response's 64 unknown ones.
TEST(WireCheckTest, PolicyVersionsAreKnownFieldsOfAResponse) {
  v1::RolloutBatch b = WireBatch();
  v1::Response* r = b.mutable_groups(0)->mutable_responses(1);
  r->set_first_policy_version(3);
  r->set_last_policy_version(4);
  google::protobuf::UnknownFieldSet* unknown = r->GetReflection()->MutableUnknownFields(r);
  for (int i = 0; i < 64; ++i) unknown->AddVarint(100 + i, 1);
  EXPECT_OK(Check(b.SerializeAsString()));
  unknown->AddVarint(200, 1);
  EXPECT_THAT(
      Check(b.SerializeAsString()),
      StatusIs(absl::StatusCode::kInvalidArgument, "more than 64 unknown fields in one Response"));
}

TEST(WireCheckTest, RefusesABatchOverTheByteLimit) {
  const std::string bytes = WireBatch().SerializeAsString();
  EXPECT_EQ(CheckRolloutBatchWire({bytes}, CheckLimits(), 10),
            absl::InvalidArgumentError(
                absl::StrCat("the batch is ", bytes.size(), " bytes, more than the learner's 10")));
}

TEST(WireCheckTest, GenericCheckNamesTheTypeAndTheField) {
  v1::RegisterRequest r;
  r.set_receiver_id("rollout-0");
  r.add_transports(v1::TRANSPORT_GRPC);
  const auto& type = *v1::RegisterRequest::descriptor();
  EXPECT_OK(CheckMessageWire(type, {r.SerializeAsString()}));
  r.set_receiver_id("bad\xff");
  EXPECT_EQ(CheckMessageWire(type, {r.SerializeAsString()}).message(),
            "the request is not a valid asympo.v1.RegisterRequest: field receiver_id is not valid "
            "UTF-8 (the field at byte 0)");
  r.set_receiver_id("x");
  for (int i = 0; i < 2000; ++i) r.add_transports(v1::TRANSPORT_GRPC);
  EXPECT_THAT(
      CheckMessageWire(type, {r.SerializeAsString()}),
      StatusIs(absl::StatusCode::kInvalidArgument, "field transports has more than 1024 elements"));
  WireLimits small;
  small.max_bytes = 4;
  EXPECT_THAT(
      CheckMessageWire(type, {r.SerializeAsString()}, small),
      StatusIs(absl::StatusCode::kInvalidArgument, "a asympo.v1.RegisterRequest is at most 4"));
  EXPECT_THAT(CheckMessageWire(type, {"\x0a\x05"}),
              StatusIs(absl::StatusCode::kInvalidArgument));  // a length past the end
}

TEST(WireCheckTest, Utf8Rules) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                             // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));                         // overlong, 3 bytes
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));                         // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));                     // beyond U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));                             // cut short
  EXPECT_FALSE(IsValidUtf8("\x80"));                                 // a lone continuation byte
  EXPECT_FALSE(IsValidUtf8("\xf8\x88\x80\x80\x80"));
}

}  // namespace
}  // namespace asympo
