// Catch2 v3 for the unit tests. Include it after LibTorch's headers: LibTorch
// built with glog defines a CHECK macro of its own (one that aborts), and
// Catch's must be the one in force.
#pragma once
#ifdef CHECK
#undef CHECK
#endif
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
