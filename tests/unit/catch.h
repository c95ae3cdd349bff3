// Catch2 v2 (Debian) and v3 (GPU machine) behind one include.
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define SPMD_CATCH3 1
#else
#include <catch2/catch.hpp>
#endif
