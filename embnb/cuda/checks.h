// embnb's argument and data checks. They throw standard exceptions, which
// torch.ops turns into Python's: std::invalid_argument -> ValueError (a wrong
// dtype too: no standard exception maps to TypeError), std::runtime_error ->
// RuntimeError. Not c10's error types: on the lent GPU machines (Ubuntu 24.04,
// GCC 13.3, torch 2.11+cu130) every c10 error an extension made segfaulted the
// process, made with a C++ backtrace (H100, 2026-11-26) or without one (H200,
// 2026-11-27), while a std::runtime_error thrown the same way passed.
#pragma once

#include <c10/util/StringUtil.h>

#include <stdexcept>

#define EMBNB_CHECK_AS(error, cond, ...)          \
  do {                                            \
    if (!(cond)) {                                \
      throw error(c10::str(__VA_ARGS__));         \
    }                                             \
  } while (0)
#define EMBNB_CHECK(cond, ...) EMBNB_CHECK_AS(std::runtime_error, cond, __VA_ARGS__)
#define EMBNB_CHECK_VALUE(cond, ...) EMBNB_CHECK_AS(std::invalid_argument, cond, __VA_ARGS__)
