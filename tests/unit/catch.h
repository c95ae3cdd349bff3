// Catch2 v2 (Debian) and v3 (GPU machine) behind one include. Include it
// after LibTorch's headers: LibTorch built with glog defines a CHECK macro of
// its own (one that aborts), and Catch's must be the one in force.
#pragma once
#ifdef CHECK
#undef CHECK
#endif
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define SPMD_CATCH3 1
#else
#include <catch2/catch.hpp>
#endif
