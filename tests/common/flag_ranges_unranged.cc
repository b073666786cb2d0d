// A numeric flag without a range, for FlagRangesTest: the check that every
// numeric flag of a main file has one must name it.
#include "absl/flags/flag.h"

ABSL_FLAG(int32_t, test_unranged, 7, "A numeric flag without a range.");
