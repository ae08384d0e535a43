// .npy reader and writer. The header is a Python dict literal; we parse the
// tiny subset NumPy writes (string, bool and tuple-of-int values) strictly, with
// a cursor that checks every index, so that a hostile file can only produce an
// attend::Error.
#include "attend/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attend/error.h"
#include "runtime/checked.h"

namespace attend {
namespace {

static_assert(std::endian::native == std::endian::little,
              "npy.cpp copies little-endian data verbatim");

constexpr std::array<char, 6> kMagic = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kAlign = 64;            // NumPy pads the header to this
constexpr std::size_t kGrowthDigits = 21;     // NumPy's spare room for growing shape[0]

[[noreturn]] void fail(std::string_view name, std::string_view field, std::string value,
                       std::string detail) {
  throw Error(ErrorCode::io, std::string(name) + ": " + std::string(field), std::move(value),
              std::move(detail));
}

std::string quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "'";
}

// --- header dict parser ---------------------------------------------------------

struct Header {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::int64_t>> shape;
};

class Parser {
 public:
  Parser(std::string_view text, std::string_view name) : s_(text), name_(name) {}

  Header parse() {
    Header h;
    skip_ws();
    expect('{', "the header must be a Python dict literal starting with '{'");
    skip_ws();
    while (!at('}')) {
      const std::string key = parse_string("key");
      skip_ws();
      expect(':', "expected ':' after key " + quote(key));
      skip_ws();
      if (key == "descr") {
        if (h.descr) duplicate(key);
        if (!at('\'') && !at('"')) {
          error("descr", rest(), "descr must be a string such as '<f4' (structured dtypes are not supported)");
        }
        h.descr = parse_string("descr");
      } else if (key == "fortran_order") {
        if (h.fortran_order) duplicate(key);
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (h.shape) duplicate(key);
        h.shape = parse_shape();
      } else {
        error("header", quote(key),
              "unexpected key; the header dict must hold exactly descr, fortran_order and shape");
      }
      skip_ws();
      if (at(',')) {
        ++pos_;
        skip_ws();
      } else if (!at('}')) {
        error("header", rest(), "expected ',' or '}' after the value of " + quote(key));
      }
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) error("header", rest(), "unexpected text after the header dict");
    if (!h.descr) missing("descr");
    if (!h.fortran_order) missing("fortran_order");
    if (!h.shape) missing("shape");
    return h;
  }

 private:
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool at_digit() const { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; }

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // The unparsed text, shortened, for error values.
  std::string rest() const {
    if (pos_ >= s_.size()) return "<end of header>";
    return quote(s_.substr(pos_, 24));
  }

  [[noreturn]] void error(std::string_view field, std::string value, std::string detail) const {
    fail(name_, field, std::move(value), std::move(detail) + " (at header offset " + std::to_string(pos_) + ")");
  }
  [[noreturn]] void duplicate(const std::string& key) const {
    error("header", quote(key), "duplicate key");
  }
  [[noreturn]] void missing(std::string_view key) const {
    fail(name_, "header", "<missing>", "the header dict has no " + quote(key) + " key");
  }

  void expect(char c, const std::string& detail) {
    if (!at(c)) error("header", rest(), detail);
    ++pos_;
  }

  // A quoted string without escapes (NumPy never writes any in these fields).
  std::string parse_string(std::string_view what) {
    if (!at('\'') && !at('"')) error("header", rest(), "expected a quoted " + std::string(what));
    const char q = s_[pos_++];
    const std::size_t begin = pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') error("header", rest(), "escapes are not supported inside strings");
      if (s_[pos_] == '\n') break;  // a Python string literal cannot span lines
      ++pos_;
    }
    if (pos_ >= s_.size() || s_[pos_] != q) {
      pos_ = begin;
      error("header", rest(), "unterminated string");
    }
    return std::string(s_.substr(begin, pos_++ - begin));
  }

  bool parse_bool() {
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true},
                                      std::pair{std::string_view("False"), false}}) {
      if (s_.substr(pos_, word.size()) == word) {
        const std::size_t end = pos_ + word.size();
        const bool ident = end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) ||
                                               s_[end] == '_');
        if (!ident) {
          pos_ = end;
          return value;
        }
      }
    }
    error("fortran_order", rest(), "fortran_order must be True or False");
  }

  std::int64_t parse_int() {
    if (at('-')) error("shape", rest(), "shape entries must be non-negative");
    if (!at_digit()) error("shape", rest(), "expected a non-negative integer in shape");
    const std::size_t begin = pos_;
    std::int64_t v = 0;
    while (at_digit()) {
      const std::int64_t digit = s_[pos_] - '0';
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, digit, &v)) {
        pos_ = begin;
        error("shape", rest(), "shape entry overflows int64");
      }
      ++pos_;
    }
    if (pos_ - begin > 1 && s_[begin] == '0') {
      pos_ = begin;
      error("shape", rest(), "leading zeros are not valid in a Python integer");
    }
    return v;
  }

  // "()", "(n,)", "(n, m)", "(n, m,)" — a 1-tuple needs its comma, as in Python.
  std::vector<std::int64_t> parse_shape() {
    expect('(', "shape must be a tuple");
    std::vector<std::int64_t> dims;
    skip_ws();
    bool trailing_comma = false;
    while (!at(')')) {
      if (pos_ >= s_.size()) error("shape", rest(), "unterminated shape tuple");
      if (dims.size() == static_cast<std::size_t>(TensorView::kMaxDims)) {
        error("shape", rest(),
              "more than " + std::to_string(TensorView::kMaxDims) + " dimensions are not supported");
      }
      dims.push_back(parse_int());
      skip_ws();
      trailing_comma = at(',');
      if (trailing_comma) {
        ++pos_;
        skip_ws();
      } else if (!at(')')) {
        error("shape", rest(), pos_ >= s_.size() ? "unterminated shape tuple"
                                                 : "expected ',' or ')' in shape tuple");
      }
    }
    if (dims.size() == 1 && !trailing_comma) {
      error("shape", rest(), "(n) is an integer, not a tuple; a 1-d shape is written (n,)");
    }
    ++pos_;  // ')'
    return dims;
  }

  std::string_view s_;
  std::string_view name_;
  std::size_t pos_ = 0;
};

DType parse_descr(const std::string& descr, std::string_view name) {
  const auto bad = [&](const std::string& why) -> DType {
    fail(name, "descr", quote(descr), why + "; supported: '<f4', '<f8', '<f2', '<i4', '|i1'");
  };
  if (descr.size() != 3) return bad("unsupported dtype");
  const char order = descr[0];
  if (order == '>') return bad("big-endian data is not supported");
  if (order != '<' && order != '=' && order != '|') return bad("unknown byte order");
  const std::string_view type = std::string_view(descr).substr(1);
  if (type == "f4") return DType::f32;
  if (type == "f8") return DType::f64;
  if (type == "f2") return DType::f16;
  if (type == "i4") return DType::i32;
  if (type == "i1") return DType::i8;
  return bad("unsupported dtype");
}

std::string shape_text(const std::vector<std::int64_t>& dims) {
  std::string out = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return out + (dims.size() == 1 ? ",)" : ")");
}

std::uint32_t read_le(std::span<const std::byte> b, std::size_t offset, std::size_t n) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    v |= static_cast<std::uint32_t>(std::to_integer<std::uint8_t>(b[offset + i])) << (8 * i);
  }
  return v;
}

const char* descr_of(DType dtype, std::string_view what) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::f16: return "<f2";
    case DType::i32: return "<i4";
    case DType::i8: return "|i1";
    case DType::bf16:
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: break;
  }
  throw Error(ErrorCode::io, std::string(what), std::string(to_string(dtype)),
              "NumPy has no " + std::string(to_string(dtype)) + " dtype; convert to f32 before saving");
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

[[noreturn]] void io_error(const std::string& path, std::string_view action) {
  throw Error(ErrorCode::io, "path", path, "cannot " + std::string(action) + ": " + std::strerror(errno));
}

}  // namespace

namespace {

constexpr std::size_t kPrefix = kMagic.size() + 2;  // magic + major + minor

// Where the header ends (= the data begins), from the magic, the version and
// the header length field; `bytes` need hold no more than those.
std::size_t header_end(std::span<const std::byte> bytes, std::string_view name) {
  if (bytes.size() < kPrefix ||
      !std::equal(kMagic.begin(), kMagic.end(), bytes.begin(),
                  [](char c, std::byte b) { return static_cast<std::byte>(c) == b; })) {
    fail(name, "magic", std::to_string(bytes.size()) + " bytes",
         "not a .npy file: it does not start with \"\\x93NUMPY\"");
  }
  const auto major = std::to_integer<unsigned>(bytes[6]);
  const auto minor = std::to_integer<unsigned>(bytes[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail(name, "version", std::to_string(major) + "." + std::to_string(minor),
         "unsupported .npy format version; supported: 1.0, 2.0, 3.0");
  }
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < kPrefix + len_bytes) {
    fail(name, "header_len", std::to_string(bytes.size()) + " bytes", "file ends inside the header length");
  }
  // A 4-byte length is below 2^32: the sum cannot overflow a 64-bit size_t.
  return kPrefix + len_bytes + read_le(bytes, kPrefix, len_bytes);
}

struct NpyLayout {
  DType dtype;
  std::string descr;  // as the header spells it
  std::vector<std::int64_t> dims;
  std::size_t data_begin = 0;
  std::size_t data_bytes = 0;  // what the shape and dtype need
};

// Everything but the data; `bytes` holds at least the whole header.
NpyLayout parse_layout(std::span<const std::byte> bytes, std::string_view name) {
  const std::size_t end = header_end(bytes, name);
  const std::size_t len_bytes = std::to_integer<unsigned>(bytes[6]) == 1 ? 2 : 4;
  const std::size_t header_begin = kPrefix + len_bytes;
  const std::size_t header_len = end - header_begin;
  if (header_len > bytes.size() - header_begin) {
    fail(name, "header_len", std::to_string(header_len),
         "header length exceeds the file: only " + std::to_string(bytes.size() - header_begin) +
             " bytes follow the length field");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + header_begin), header_len);
  const Header h = Parser(text, name).parse();

  NpyLayout l;
  l.dtype = parse_descr(*h.descr, name);
  l.descr = *h.descr;
  if (*h.fortran_order) {
    fail(name, "fortran_order", "True", "Fortran-order arrays are not supported; save a C-order copy");
  }
  l.dims = *h.shape;
  std::int64_t numel = 1;
  for (std::int64_t d : l.dims) numel = detail::checked_mul(numel, d, std::string(name) + ": shape");
  l.data_bytes = detail::checked_bytes(numel, size_of(l.dtype), std::string(name) + ": shape");
  l.data_begin = end;
  return l;
}

// Opened without blocking, then refused unless a regular file: a FIFO with no
// writer would hold a blocking open forever, and a device such as /dev/zero
// has no end to read to.
std::unique_ptr<std::FILE, FileCloser> open_regular(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) io_error(path, "open for reading");
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  std::FILE* f = stat_ok && S_ISREG(st.st_mode) ? ::fdopen(fd, "rb") : nullptr;
  if (f) return std::unique_ptr<std::FILE, FileCloser>(f);
  const int err = stat_ok ? errno : stat_errno;
  ::close(fd);
  errno = err;
  if (!stat_ok) io_error(path, "stat");
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::io, "path", path, "is not a regular file (.npy input is read from a file)");
  io_error(path, "open for reading");
}

// Appends up to `want` bytes of `f` to `bytes`.
void read_more(std::FILE* f, std::vector<std::byte>& bytes, std::size_t want, const std::string& path) {
  std::array<std::byte, 1 << 16> buf;
  while (want > 0) {
    const std::size_t n = std::fread(buf.data(), 1, std::min(want, buf.size()), f);
    bytes.insert(bytes.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
    want -= n;
    if (n == 0) break;
  }
  if (std::ferror(f)) io_error(path, "read");
}

}  // namespace

Tensor parse_npy(std::span<const std::byte> bytes, std::string_view name) {
  const NpyLayout l = parse_layout(bytes, name);
  const std::size_t expected = l.data_bytes;
  const std::size_t actual = bytes.size() - l.data_begin;
  if (actual != expected) {
    fail(name, "data", std::to_string(actual) + " bytes",
         std::string(actual < expected ? "truncated" : "trailing bytes") + ": shape " + shape_text(l.dims) + " " +
             l.descr + " needs exactly " + std::to_string(expected) + " bytes of data, found " +
             std::to_string(actual));
  }
  Tensor t = Tensor::zeros(l.dtype, std::span<const std::int64_t>(l.dims));
  if (expected > 0) std::memcpy(t.data(), bytes.data() + l.data_begin, expected);
  return t;
}

// Reads in stages, each bounded by what the previous one declared: the prefix,
// the header, then the data the header's shape needs and one byte more (so
// that trailing data is still named). A file that is no .npy is refused
// after its first bytes instead of being read whole.
Tensor read_npy(const std::string& path) {
  const std::unique_ptr<std::FILE, FileCloser> f = open_regular(path);
  std::vector<std::byte> bytes;
  read_more(f.get(), bytes, kPrefix + 4, path);
  const std::size_t end = header_end(bytes, path);
  if (bytes.size() < end) read_more(f.get(), bytes, end - bytes.size(), path);
  const NpyLayout l = parse_layout(bytes, path);
  const std::size_t total = l.data_begin + l.data_bytes + 1;
  if (bytes.size() < total) read_more(f.get(), bytes, total - bytes.size(), path);
  return parse_npy(bytes, path);
}

std::string npy_header(const TensorView& t) {
  if (t.ndim < 0 || t.ndim > TensorView::kMaxDims) {
    throw Error(ErrorCode::invalid_argument, "ndim", std::to_string(t.ndim), "must be in [0, 4]");
  }
  std::vector<std::int64_t> dims(t.shape.begin(), t.shape.begin() + t.ndim);
  std::string dict = std::string("{'descr': '") + descr_of(t.dtype, "dtype") +
                     "', 'fortran_order': False, 'shape': " + shape_text(dims) + ", }";
  // Same layout as numpy.lib.format: spare spaces so shape[0] can grow in place,
  // then pad so that magic + length + dict + '\n' is a multiple of 64.
  if (!dims.empty()) dict.append(kGrowthDigits - std::to_string(dims[0]).size(), ' ');
  const auto padded = [&](std::size_t len_bytes) {
    const std::size_t total = kMagic.size() + 2 + len_bytes + dict.size() + 1;
    return dict.size() + 1 + (kAlign - total % kAlign) % kAlign;
  };
  const std::size_t len_bytes = padded(2) <= 0xffff ? 2 : 4;  // version 1.0 when it fits
  dict.append(padded(len_bytes) - dict.size() - 1, ' ');
  dict += '\n';
  std::string out(kMagic.begin(), kMagic.end());
  out += static_cast<char>(len_bytes == 2 ? 1 : 2);
  out += '\0';
  for (std::size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  return out + dict;
}

void write_npy(const std::string& path, const TensorView& t) {
  const std::string header = npy_header(t);
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) {
      throw Error(ErrorCode::invalid_argument, "shape[" + std::to_string(d) + "]",
                  std::to_string(t.shape[d]), "must be non-negative");
    }
  }
  const std::int64_t numel = t.numel();
  const std::size_t item = size_of(t.dtype);
  if (numel > 0 && t.data == nullptr) {
    throw Error(ErrorCode::invalid_argument, "data", "null", "tensor " + t.shape_string() + " has no data");
  }
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) io_error(path, "open for writing");
  if (std::fwrite(header.data(), 1, header.size(), f.get()) != header.size()) io_error(path, "write");

  if (numel > 0) {
    // Walk every row (all indices but the last); a row is one fwrite when its
    // elements are adjacent, else it is gathered element by element.
    const int nd = t.ndim;
    const std::int64_t row_len = nd == 0 ? 1 : t.shape[nd - 1];
    const std::int64_t inner = nd == 0 ? 1 : t.strides[nd - 1];
    const std::int64_t rows = numel / row_len;
    std::vector<std::byte> gather(inner == 1 ? 0 : detail::checked_bytes(row_len, item, "row"));
    std::array<std::int64_t, TensorView::kMaxDims> idx{};
    const auto* base = static_cast<const std::byte*>(t.data);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t offset = 0;
      for (int d = 0; d + 1 < nd; ++d) offset += idx[d] * t.strides[d];
      const std::byte* row = base + offset * static_cast<std::int64_t>(item);
      const std::byte* src = row;
      if (inner != 1) {
        for (std::int64_t j = 0; j < row_len; ++j) {
          std::memcpy(gather.data() + j * static_cast<std::int64_t>(item),
                      row + j * inner * static_cast<std::int64_t>(item), item);
        }
        src = gather.data();
      }
      const std::size_t n = static_cast<std::size_t>(row_len) * item;
      if (std::fwrite(src, 1, n, f.get()) != n) io_error(path, "write");
      for (int d = nd - 2; d >= 0; --d) {  // odometer over the leading dims
        if (++idx[d] < t.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  if (std::fclose(f.release()) != 0) io_error(path, "close");
}

}  // namespace attend
