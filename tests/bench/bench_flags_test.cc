// The benchmark programs' flag reader: a repeated flag takes its last value,
// and a bad number, a missing value or an unknown flag ends the program
// with exit 2 and a message that names it (a silently ignored flag would
// measure the default).
#include "bench/bench_flags.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace asympo::bench {
namespace {

// argv for the reader, from strings that outlive it.
class Argv {
 public:
  explicit Argv(std::vector<std::string> args) : args_(std::move(args)) {
    ptrs_.push_back(const_cast<char*>("bench"));
    for (auto& a : args_) ptrs_.push_back(a.data());
  }
  int argc() const { return static_cast<int>(ptrs_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<char*> ptrs_;
};

TEST(BenchFlagsTest, DefaultsWhenAbsentAndTheLastValueWins) {
  Argv a({"--steps", "10", "--lr", "3e-4", "--steps", "20", "--name", "copy"});
  EXPECT_EQ(Flag(a.argc(), a.argv(), "--steps", 5), 20);
  EXPECT_DOUBLE_EQ(FlagD(a.argc(), a.argv(), "--lr", 1.0), 3e-4);
  EXPECT_EQ(FlagS(a.argc(), a.argv(), "--name", "x"), "copy");
  EXPECT_EQ(Flag(a.argc(), a.argv(), "--absent", 7), 7);
  EXPECT_EQ(ListFlag(a.argc(), a.argv(), "--sizes", "1,2,-3"), (std::vector<int64_t>{1, 2, -3}));
}

TEST(BenchFlagsTest, AValueIsNotMistakenForAFlag) {
  // "--steps" is the value of --name here, not a flag of its own.
  Argv a({"--name", "--steps", "--other", "4"});
  EXPECT_EQ(FlagS(a.argc(), a.argv(), "--name", ""), "--steps");
  EXPECT_EQ(Flag(a.argc(), a.argv(), "--other", 0), 4);
}

TEST(BenchFlagsDeathTest, BadInputExitsTwoNamingTheFlag) {
  Argv notint({"--steps", "12x"});
  EXPECT_EXIT(Flag(notint.argc(), notint.argv(), "--steps", 1), testing::ExitedWithCode(2),
              "--steps is '12x'; it must be an integer");
  Argv notnum({"--lr", "fast"});
  EXPECT_EXIT(FlagD(notnum.argc(), notnum.argv(), "--lr", 1), testing::ExitedWithCode(2),
              "--lr is 'fast'; it must be a finite number");
  Argv inf({"--lr", "inf"});
  EXPECT_EXIT(FlagD(inf.argc(), inf.argv(), "--lr", 1), testing::ExitedWithCode(2), "finite");
  Argv list({"--sizes", "1,,2"});
  EXPECT_EXIT(ListFlag(list.argc(), list.argv(), "--sizes", "1"), testing::ExitedWithCode(2),
              "--sizes is '1,,2'; it must be integers separated by commas");
  Argv novalue({"--steps"});
  EXPECT_EXIT(Flag(novalue.argc(), novalue.argv(), "--steps", 1), testing::ExitedWithCode(2),
              "--steps needs a value");
}

TEST(BenchFlagsDeathTest, AnUnknownFlagIsRefusedWithTheKnownOnes) {
  Argv a({"--steps", "3", "--setps", "4"});
  Flag(a.argc(), a.argv(), "--steps", 1);
  FlagD(a.argc(), a.argv(), "--lr", 1);
  EXPECT_EXIT(RejectUnknownFlags(a.argc(), a.argv()), testing::ExitedWithCode(2),
              "unknown argument '--setps'; the flags are .*--steps.*--lr");
  Argv ok({"--steps", "3"});
  RejectUnknownFlags(ok.argc(), ok.argv());  // returns
}

}  // namespace
}  // namespace asympo::bench
