// Skips the current test, with the reason, where no CUDA device is visible
// (the tests labelled "gpu").
#pragma once

#include <gtest/gtest.h>

#include "common/model/device.h"

#define ASYMPO_SKIP_WITHOUT_GPU() \
  if (::asympo::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device is visible"
