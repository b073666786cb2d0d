// The "add_tool" task's calculator: what it answers to a turn of the model.
//
// A turn that ends with CALL asks for the sum it wrote before CALL, read
// from the turn's own tokens: "23 + 45 CALL", or "+ 17 CALL" to go on from
// the calculator's previous answer. The answer is "= s", the digits of the
// sum, which the model reads and goes on from (the verifier takes the
// digits after the transcript's last "=" as the final answer); an
// expression it cannot read (no number, a number of five digits or more, a
// leading "+" before any answer) is answered with "," alone. For
// 23 + 45 + 17 a transcript may read (inserted tokens in brackets):
//
//   23 + 45 CALL [= 68] + 17 CALL [= 85] EOS
//
// docs/tasks.md, "add_tool". The built-in environment
// (rollout_server/episodes/) and the Python example serve it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace asympo::rollout {

// The tokens that answer `turn` (which must end with CALL; otherwise
// empty): "= s" or ",". `previous` holds the last answer and is updated.
std::vector<int32_t> CalculatorAnswer(const std::vector<int32_t>& turn,
                                      std::optional<int32_t>* previous);

}  // namespace asympo::rollout
