// The fuzz targets as plain functions: the libFuzzer entry points (fuzz_*.cpp)
// call them, and so does the GoogleTest replay of every checked-in corpus and
// crash input (tests/fuzz/test_fuzz_regressions.cpp), in any build.
//
// Each returns normally for every input. Expected rejections (attend::Error,
// CLI::ParseError) are caught inside; anything else — another exception, a
// sanitizer report, a wrong result — escapes or aborts, and is a bug.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attend_fuzz {

// parse_npy on the raw bytes; a parsed tensor must describe exactly the bytes given.
void npy(const std::uint8_t* data, std::size_t size);

// An AttentionSpec and Inputs (fields, shapes, strides, pointers, cu_seqlens
// contents) decoded from the bytes, then validate_inputs; when valid and tiny,
// the reference (and flash, when it supports the spec) run on buffers sized to
// exactly what validation allows, so ASan proves the validated views in-bounds,
// and flash's forward must agree with the reference's.
void spec(const std::uint8_t* data, std::size_t size);

// The bytes split at newlines into argv, parsed by the CLI's problem flags
// (attend_cli::parse_problem_args), then selected; tiny problems get their data built.
// A list starting with "bench" runs `attend bench` on it instead (tiny problems,
// shortest timing; in builds with the bench harness).
void cli_flags(const std::uint8_t* data, std::size_t size);

}  // namespace attend_fuzz
