// .npy reader/writer: round trips, NumPy's exact header bytes, and one test per
// kind of malformed file (each must be an attend::Error, never a crash).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "attend/error.h"
#include "attend/npy.h"
#include "attend/tensor.h"

namespace {

using attend::DType;
using attend::Tensor;

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());  // b.data() is null when empty (UBSan)
  return b;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("attend_test_npy_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" + name);
}

// A version-1.0 file with `dict` as its header (padded like NumPy) and `data_bytes` zero bytes.
std::string npy_v1(const std::string& dict, std::size_t data_bytes) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + std::string(data_bytes, '\0');
}

attend::Error parse_error(const std::string& file) {
  const auto b = bytes_of(file);
  try {
    attend::parse_npy(b, "bad.npy");
  } catch (const attend::Error& e) {
    return e;
  }
  ADD_FAILURE() << "parse_npy accepted a malformed file";
  return attend::Error(attend::ErrorCode::io, "", "", "");
}

void expect_io_error(const std::string& file, const std::string& needle) {
  const attend::Error e = parse_error(file);
  EXPECT_TRUE(e.code() == attend::ErrorCode::io || e.code() == attend::ErrorCode::overflow) << e.what();
  EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  EXPECT_NE(std::string(e.what()).find("bad.npy"), std::string::npos) << "message: " << e.what();
}

void fill_pattern(const Tensor& t) {
  auto* p = static_cast<unsigned char*>(t.data());
  const std::size_t n = static_cast<std::size_t>(t.numel()) * attend::size_of(t.view().dtype);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(i * 37 + 11);
}

// --- round trips ------------------------------------------------------------------

TEST(Npy, RoundTripPreservesDtypeShapeAndBytesForEveryDtypeAndRank) {
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {5}, {2, 3}, {2, 0, 3}, {2, 3, 1, 4}};
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::i32}) {
    for (const auto& shape : shapes) {
      const Tensor t = Tensor::zeros(dt, std::span<const std::int64_t>(shape));
      fill_pattern(t);
      const auto path = temp_path("rt.npy");
      attend::write_npy(path.string(), t);
      const Tensor back = attend::read_npy(path.string());
      std::filesystem::remove(path);
      SCOPED_TRACE(std::string(attend::to_string(dt)) + " " + t.view().shape_string());
      ASSERT_EQ(back.view().dtype, dt);
      ASSERT_EQ(back.view().ndim, static_cast<int>(shape.size()));
      for (std::size_t d = 0; d < shape.size(); ++d) EXPECT_EQ(back.view().shape[d], shape[d]);
      const std::size_t n = static_cast<std::size_t>(t.numel()) * attend::size_of(dt);
      EXPECT_EQ(std::memcmp(back.data(), t.data(), n), 0);
    }
  }
}

TEST(Npy, WriteOfStridedViewStoresTheViewInCOrder) {
  // A (2, 3) f32 view that picks every other column of a (2, 6) buffer, and a
  // (3, 2) transposed-rows view with a non-unit last stride.
  std::vector<float> buf(12);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  attend::TensorView v;
  v.data = buf.data();
  v.dtype = DType::f32;
  v.ndim = 2;
  v.shape = {2, 3};
  v.strides = {6, 2};
  const auto path = temp_path("strided.npy");
  attend::write_npy(path.string(), v);
  const Tensor back = attend::read_npy(path.string());
  std::filesystem::remove(path);
  const std::vector<float> expected = {0, 2, 4, 6, 8, 10};
  ASSERT_EQ(back.numel(), 6);
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(back.as<float>()[i], expected[i]);
}

TEST(Npy, HeaderMatchesNumpyByteForByte) {
  // np.save(f, np.zeros((2, 3), '<f4')) writes this 128-byte header: the dict,
  // spaces up to a multiple of 64 bytes, and a final newline (header_len 118 = 0x76).
  std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expected += std::string(128 - 1 - expected.size(), ' ') + "\n";
  ASSERT_EQ(expected.size(), 128u);
  const Tensor t = Tensor::zeros(DType::f32, {2, 3});
  EXPECT_EQ(attend::npy_header(t), expected);

  const auto path = temp_path("header.npy");
  attend::write_npy(path.string(), t);
  const std::string file = read_file(path);
  std::filesystem::remove(path);
  ASSERT_EQ(file.size(), 128u + 24u);
  EXPECT_EQ(file.substr(0, 128), expected);
}

TEST(Npy, OneDimensionalShapeUsesPythonTupleSyntax) {
  const Tensor t = Tensor::zeros(DType::f64, {7});
  const std::string h = attend::npy_header(t);
  EXPECT_NE(h.find("'descr': '<f8', 'fortran_order': False, 'shape': (7,), }"), std::string::npos);
  EXPECT_EQ(h.size() % 64, 0u);
}

TEST(Npy, ParsesVersions2And3AndLenientButValidDictSpellings) {
  // Double quotes, keys in another order, no trailing comma, spaces inside the tuple.
  const std::string dict = "{\"shape\": ( 2 , 2 ), \"fortran_order\": False, \"descr\": \"<i4\"}";
  for (char version : {'\x02', '\x03'}) {
    std::string file = "\x93NUMPY";
    file += version;
    file += '\0';
    const std::string h = dict + "\n";
    const auto len = static_cast<std::uint32_t>(h.size());
    for (int i = 0; i < 4; ++i) file += static_cast<char>((len >> (8 * i)) & 0xff);
    file += h + std::string(16, '\x01');
    const auto b = bytes_of(file);
    const Tensor t = attend::parse_npy(b, "v.npy");
    EXPECT_EQ(t.view().dtype, DType::i32);
    EXPECT_EQ(t.numel(), 4);
    EXPECT_EQ(t.as<std::int32_t>()[3], 0x01010101);
  }
}

TEST(Npy, AcceptsNativeByteOrderSpellings) {
  for (const char* d : {"=f4", "|f4"}) {
    const auto b = bytes_of(npy_v1(std::string("{'descr': '") + d + "', 'fortran_order': False, 'shape': (1,), }", 4));
    EXPECT_EQ(attend::parse_npy(b, "n.npy").view().dtype, DType::f32) << d;
  }
}

// --- malformed files -------------------------------------------------------------

const std::string kGood = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

TEST(NpyMalformed, BadMagicIsRejected) {
  std::string f = npy_v1(kGood, 24);
  f[1] = 'X';
  expect_io_error(f, "magic");
  expect_io_error("", "magic");
}

TEST(NpyMalformed, UnknownVersionIsRejected) {
  std::string f = npy_v1(kGood, 24);
  f[6] = '\x04';
  expect_io_error(f, "version=4.0");
}

TEST(NpyMalformed, HeaderLengthBeyondFileIsRejected) {
  std::string f = npy_v1(kGood, 0);
  f[8] = '\xff';
  f[9] = '\x7f';
  expect_io_error(f, "header length exceeds the file");
  expect_io_error(f.substr(0, 9), "header_len");  // file ends inside the length field
}

TEST(NpyMalformed, MissingKeyIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4', 'shape': (2, 3), }", 24), "no 'fortran_order' key");
}

TEST(NpyMalformed, ExtraKeyIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1, }", 24),
                  "unexpected key");
}

TEST(NpyMalformed, DuplicateKeyIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8),
                  "duplicate key");
}

TEST(NpyMalformed, UnsupportedDescrIsRejectedWithTheSupportedList) {
  for (const char* d : {">f4", "<f16", "|b1", "|O", "<u2", "<V2"}) {
    SCOPED_TRACE(d);
    expect_io_error(npy_v1(std::string("{'descr': '") + d + "', 'fortran_order': False, 'shape': (2,), }", 8),
                    "supported: '<f4'");
  }
  expect_io_error(npy_v1("{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", 8), "big-endian");
  expect_io_error(npy_v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4),
                  "descr must be a string");
}

TEST(NpyMalformed, FortranOrderIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24), "Fortran");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': Truex, 'shape': (2, 3), }", 24), "True or False");
}

TEST(NpyMalformed, NegativeOrOverflowingShapeIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 24), "non-negative");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0),
                  "overflows int64");
  // Each entry fits, the element count does not.
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0),
                  "overflow");
  // The element count fits, the byte count does not.
  expect_io_error(npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", 0),
                  "overflow");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1), }", 4),
                  "more than 4 dimensions");
}

TEST(NpyMalformed, TruncatedDataNamesExpectedAndActualBytes) {
  expect_io_error(npy_v1(kGood, 23), "needs exactly 24 bytes of data, found 23");
}

TEST(NpyMalformed, TrailingDataNamesExpectedAndActualBytes) {
  expect_io_error(npy_v1(kGood, 25), "needs exactly 24 bytes of data, found 25");
}

TEST(NpyMalformed, NonDictHeaderIsRejected) {
  expect_io_error(npy_v1("['descr', '<f4']", 0), "dict literal");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x", 24), "after the header dict");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", 24), "expected ',' or '}'");
  expect_io_error(npy_v1("{'descr: '<f4'}", 0), "expected ':'");
}

TEST(NpyMalformed, UnterminatedTupleIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 24), "unterminated shape tuple");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2", 8), "unterminated shape tuple");
  expect_io_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", 8), "(n,)");
}

TEST(NpyMalformed, UnterminatedStringIsRejected) {
  expect_io_error(npy_v1("{'descr': '<f4", 0), "unterminated string");
}

TEST(NpyMalformed, EveryPrefixOfAValidFileFailsCleanly) {
  // No prefix may be accepted or read out of bounds (run under ASan to see the latter).
  const std::string f = npy_v1(kGood, 24);
  for (std::size_t n = 0; n < f.size(); ++n) {
    const auto b = bytes_of(f.substr(0, n));
    EXPECT_THROW(attend::parse_npy(b, "prefix.npy"), attend::Error) << n;
  }
}

TEST(Npy, MissingFileIsAnIoErrorNamingThePath) {
  try {
    attend::read_npy("/nonexistent/dir/x.npy");
    FAIL();
  } catch (const attend::Error& e) {
    EXPECT_EQ(e.code(), attend::ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.npy"), std::string::npos);
  }
}

// /dev/zero was read until its first bytes proved it no .npy; a FIFO with no
// writer blocked the open forever (the test would hang, CTest's timeout
// failing it).
TEST(Npy, OnlyRegularFilesAreRead) {
  const std::string fifo = temp_path("fifo.npy").string();
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo, std::filesystem::temp_directory_path().string()}) {
    try {
      attend::read_npy(path);
      ADD_FAILURE() << path;
    } catch (const attend::Error& e) {
      EXPECT_EQ(e.code(), attend::ErrorCode::io);
      EXPECT_EQ(e.field(), "path");
      EXPECT_EQ(e.value(), path);
      EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
    }
  }
  ::unlink(fifo.c_str());
}

TEST(Npy, Bf16CannotBeWritten) {
  const Tensor t = Tensor::zeros(DType::bf16, {2});
  EXPECT_THROW(attend::write_npy(temp_path("bf16.npy").string(), t), attend::Error);
}

}  // namespace
