// A checkpoint as one byte string (see checkpoint_bytes.hpp).
#include "runtime/checkpoint/checkpoint_bytes.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "runtime/errors/errors.hpp"

namespace longwave::runtime {

namespace {

constexpr char magic[8] = {'L', 'W', 'S', 'T', 'A', 'T', 'E', '1'};
// A name longer than this is not one of ours ("replica12/exp_avg_sq" and the like).
constexpr uint64_t max_name = 4096;

void put(std::vector<std::byte>& out, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}

void put_u64(std::vector<std::byte>& out, uint64_t v) {
  std::byte b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  put(out, b, 8);
}

class reader {
 public:
  explicit reader(const std::vector<std::byte>& b) : b_(b) {}
  const std::byte* take(uint64_t n, const char* what) {
    if (n > b_.size() - pos_)
      throw lw_error(errc::corrupt_checkpoint,
                     fmt::format("state: {} needs {} bytes at offset {}, only {} left", what, n, pos_,
                                 b_.size() - pos_));
    const auto* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t u64(const char* what) {
    const auto* p = take(8, what);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(std::to_integer<uint8_t>(p[i])) << (8 * i);
    return v;
  }
  std::string text(uint64_t limit, const char* what) {
    const auto n = u64(what);
    if (n > limit) throw lw_error(errc::corrupt_checkpoint, fmt::format("state: {} of {} bytes", what, n));
    const auto* p = take(n, what);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }

 private:
  const std::vector<std::byte>& b_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> checkpoint_to_bytes(const checkpoint& c) {
  size_t total = sizeof magic + 8 * 4 + c.meta.size();
  for (const auto& b : c.blobs) total += 16 + b.name.size() + b.size;
  std::vector<std::byte> out;
  out.reserve(total);
  put(out, magic, sizeof magic);
  put_u64(out, c.round);
  put_u64(out, c.step);
  put_u64(out, c.meta.size());
  put(out, c.meta.data(), c.meta.size());
  put_u64(out, c.blobs.size());
  for (const auto& b : c.blobs) {
    put_u64(out, b.name.size());
    put(out, b.name.data(), b.name.size());
    put_u64(out, b.size);
    if (b.size > 0) put(out, b.data, b.size);
  }
  return out;
}

checkpoint checkpoint_from_bytes(const std::vector<std::byte>& bytes) {
  reader in(bytes);
  if (std::memcmp(in.take(sizeof magic, "the magic"), magic, sizeof magic) != 0)
    throw lw_error(errc::corrupt_checkpoint, "state: not a Longwave state (bad magic)");
  checkpoint c;
  c.round = in.u64("the round");
  c.step = in.u64("the step");
  c.meta = in.text(bytes.size(), "the meta");
  const auto n = in.u64("the blob count");
  if (n > in.left() / 16) throw lw_error(errc::corrupt_checkpoint, fmt::format("state: {} blobs", n));
  for (uint64_t i = 0; i < n; ++i) {
    checkpoint_blob b;
    b.name = in.text(max_name, "a blob name");
    b.size = in.u64("a blob size");
    const auto* p = in.take(b.size, "a blob");
    b.storage.assign(reinterpret_cast<const char*>(p), reinterpret_cast<const char*>(p) + b.size);
    b.data = b.storage.data();
    c.blobs.push_back(std::move(b));
  }
  if (!in.done())
    throw lw_error(errc::corrupt_checkpoint, fmt::format("state: {} bytes after the last blob", in.left()));
  return c;
}

}  // namespace longwave::runtime
