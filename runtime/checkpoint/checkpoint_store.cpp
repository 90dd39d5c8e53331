// Checkpoint files: atomic write, validation on load, pruning, and the CRC-32C that guards them.
//
// File format, version 1. All integers little-endian.
//
//   offset  size  field
//        0     8  magic "LWCKPT01"
//        8     4  u32 format version = 1
//       12     4  u32 flags = 0
//       16     8  u64 round  (completed outer rounds)
//       24     8  u64 step   (global inner step counter)
//       32     8  u64 payload length in bytes
//       40     4  u32 CRC-32C (Castagnoli) of the payload
//       44     4  u32 reserved = 0
//       48        payload:
//                   u64 meta length, meta bytes
//                   u64 blob count
//                   per blob: u32 name length, name bytes, u64 size, size bytes
//
// The file size must equal 48 + payload length. The reader checks every length against the bytes left in the
// payload before it allocates or reads, so a corrupt length can neither allocate more than the file holds nor
// read past it. The CRC covers the payload only; the header is guarded by the magic, the version, the zero
// fields, the length check and, when the file has its canonical name ckpt-<round>-<step>.lwc, by comparing
// round and step with the name. Blob bytes are stored as given (host byte order for tensor data).
#include "runtime/checkpoint/checkpoint_store.hpp"

#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/checksum/crc32c.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "runtime/errors/errors.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint_store.cpp assumes a little-endian host (slicing-by-8 CRC and tensor byte order)"
#endif

namespace longwave::runtime {

namespace {

namespace fs = std::filesystem;

constexpr char magic[8] = {'L', 'W', 'C', 'K', 'P', 'T', '0', '1'};
constexpr uint32_t format_version = 1;
constexpr size_t header_size = 48;
constexpr size_t max_chunk = size_t{1} << 20;  // read/write buffer size

// ---- little-endian encoding
// -----------------------------------------------------------------------------------

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

std::string base_name(const std::string& path) {
  return fs::path(path).filename().string();
}

std::string file_name_for(uint64_t round, uint64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt-%08" PRIu64 "-%010" PRIu64 ".lwc", round, step);
  return buf;
}

bool parse_digits(std::string_view s, size_t min_width, uint64_t* out) {
  if (s.size() < min_width || s.size() > 20) return false;
  if (!std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

// Parses "ckpt-<round, >= 8 digits>-<step, >= 10 digits>.lwc".
bool parse_file_name(std::string_view name, uint64_t* round, uint64_t* step) {
  constexpr std::string_view prefix = "ckpt-", suffix = ".lwc";
  if (name.size() <= prefix.size() + suffix.size()) return false;
  if (name.substr(0, prefix.size()) != prefix || name.substr(name.size() - suffix.size()) != suffix)
    return false;
  std::string_view mid = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  size_t dash = mid.find('-');
  if (dash == std::string_view::npos) return false;
  return parse_digits(mid.substr(0, dash), 8, round) && parse_digits(mid.substr(dash + 1), 10, step);
}

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
  throw lw_error(errc::io_error, "checkpoint: cannot " + what + " " + path + ": " + std::strerror(err));
}

// ---- writing
// --------------------------------------------------------------------------------------------------

// Buffered writer of one file that checksums everything passed to `append`.
class file_writer {
 public:
  explicit file_writer(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_io("create", path_, errno);
    buf_.reserve(max_chunk);
  }
  ~file_writer() {
    if (fd_ >= 0) ::close(fd_);
  }
  file_writer(const file_writer&) = delete;
  file_writer& operator=(const file_writer&) = delete;

  // Payload bytes: counted in the CRC.
  void append(const void* p, size_t n) {
    crc_ = checkpoint_store::crc32c(p, n, crc_);
    append_raw(p, n);
  }
  void append_raw(const void* p, size_t n) {
    if (n == 0) return;
    if (buf_.size() + n > max_chunk) flush();
    if (n >= max_chunk) {
      write_all(p, n);
    } else {
      buf_.insert(buf_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
    }
  }
  void flush() {
    if (!buf_.empty()) write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_at(const void* p, size_t n, off_t offset) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, c, n, offset);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw_io("write", path_, errno);
      c += w, n -= static_cast<size_t>(w), offset += w;
    }
  }
  void sync_and_close() {
    flush();
    if (::fsync(fd_) != 0) throw_io("fsync", path_, errno);
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_io("close", path_, errno);
  }
  uint32_t crc() const { return crc_; }

 private:
  void write_all(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw_io("write", path_, errno);
      c += w, n -= static_cast<size_t>(w);
    }
  }

  std::string path_;
  int fd_ = -1;
  std::vector<char> buf_;
  uint32_t crc_ = 0;
};

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw_io("fsync directory", dir, err);
}

// ---- reading
// --------------------------------------------------------------------------------------------------

// Why a file is invalid; thrown inside this file and turned into lw_error or a warning by the callers.
struct bad_file {
  std::string reason;
};

// Reads the payload of an open file, never more than `left` bytes, checksumming as it goes.
class payload_reader {
 public:
  payload_reader(std::FILE* f, const std::string& path, uint64_t length)
      : f_(f), path_(path), left_(length) {}

  uint64_t left() const { return left_; }
  uint32_t crc() const { return crc_; }

  // Reads n bytes; the caller has checked n <= left().
  void read(void* dst, uint64_t n) {
    if (n == 0) return;
    size_t got = std::fread(dst, 1, n, f_);
    if (got != n) {
      if (std::ferror(f_)) throw_io("read", path_, errno);
      throw bad_file{"truncated while reading (the file shrank?)"};
    }
    crc_ = checkpoint_store::crc32c(dst, n, crc_);
    left_ -= n;
  }
  uint32_t read_u32() {
    char b[4];
    read(b, 4);
    return get_u32(b);
  }
  uint64_t read_u64() {
    char b[8];
    read(b, 8);
    return get_u64(b);
  }
  // Reads and checksums the rest of the payload.
  void drain() {
    std::vector<char> scratch(static_cast<size_t>(std::min<uint64_t>(left_, max_chunk)));
    while (left_ > 0) read(scratch.data(), std::min<uint64_t>(left_, scratch.size()));
  }

 private:
  std::FILE* f_;
  const std::string& path_;
  uint64_t left_;
  uint32_t crc_ = 0;
};

struct file_closer {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Parses the payload; throws bad_file{"malformed record: ..."} on the first inconsistency.
void parse_payload(payload_reader& in, checkpoint& c) {
  auto malformed = [](const std::string& what) { throw bad_file{"malformed record: " + what}; };
  auto need = [&](uint64_t n, const std::string& what) {
    if (n > in.left())
      malformed(what + " needs " + std::to_string(n) + " bytes but " + std::to_string(in.left()) +
                " are left");
  };

  need(8, "meta length");
  uint64_t meta_len = in.read_u64();
  need(meta_len, "meta");
  c.meta.resize(static_cast<size_t>(meta_len));
  in.read(c.meta.data(), meta_len);

  need(8, "blob count");
  uint64_t count = in.read_u64();
  if (count > in.left() / 12)  // every blob takes at least 4 + 8 bytes
    malformed("blob count " + std::to_string(count) + " cannot fit in the " + std::to_string(in.left()) +
              " bytes left");
  c.blobs.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    std::string id = "blob " + std::to_string(i);
    checkpoint_blob b;
    need(4, id + " name length");
    uint32_t name_len = in.read_u32();
    need(name_len, id + " name");
    b.name.resize(name_len);
    in.read(b.name.data(), name_len);
    id += " (" + b.name + ")";
    need(8, id + " size");
    uint64_t size = in.read_u64();
    need(size, id + " data");
    b.storage.resize(static_cast<size_t>(size));
    in.read(b.storage.data(), size);
    b.data = b.storage.data();
    b.size = b.storage.size();
    c.blobs.push_back(std::move(b));
  }
  if (in.left() != 0) malformed(std::to_string(in.left()) + " unexpected bytes after the last blob");
}

// Loads one file. Throws bad_file if it is invalid and lw_error(io_error) if it cannot be read.
checkpoint read_checkpoint(const std::string& path) {
  std::unique_ptr<std::FILE, file_closer> f(std::fopen(path.c_str(), "rbe"));
  if (!f) throw_io("open", path, errno);
  struct stat st {};
  if (::fstat(::fileno(f.get()), &st) != 0) throw_io("stat", path, errno);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < header_size)
    throw bad_file{"truncated: " + std::to_string(file_size) + " bytes, shorter than the " +
                   std::to_string(header_size) + "-byte header"};

  char h[header_size];
  if (std::fread(h, 1, header_size, f.get()) != header_size) {
    if (std::ferror(f.get())) throw_io("read", path, errno);
    throw bad_file{"truncated while reading the header (the file shrank?)"};
  }
  if (std::memcmp(h, magic, sizeof magic) != 0) throw bad_file{"bad magic: not a Longwave checkpoint file"};
  const uint32_t version = get_u32(h + 8), flags = get_u32(h + 12), reserved = get_u32(h + 44);
  if (version != format_version)
    throw bad_file{"unsupported format version " + std::to_string(version) + ", this build reads version " +
                   std::to_string(format_version)};
  if (flags != 0 || reserved != 0)
    throw bad_file{"malformed header: flags " + hex32(flags) + " and reserved " + hex32(reserved) +
                   " must be zero"};

  checkpoint c;
  c.source = path;
  c.round = get_u64(h + 16);
  c.step = get_u64(h + 24);
  const uint64_t payload_len = get_u64(h + 32);
  const uint32_t stored_crc = get_u32(h + 40);
  const uint64_t file_payload = file_size - header_size;
  if (payload_len > file_payload)
    throw bad_file{"truncated: the header promises " + std::to_string(payload_len) +
                   " payload bytes, the file has " + std::to_string(file_payload)};
  if (payload_len < file_payload)
    throw bad_file{"length mismatch: the header promises " + std::to_string(payload_len) +
                   " payload bytes, the file has " + std::to_string(file_payload)};

  uint64_t name_round = 0, name_step = 0;
  if (parse_file_name(base_name(path), &name_round, &name_step) &&
      (name_round != c.round || name_step != c.step))
    throw bad_file{"header says round " + std::to_string(c.round) + " step " + std::to_string(c.step) +
                   " but the file name says round " + std::to_string(name_round) + " step " +
                   std::to_string(name_step)};

  payload_reader in(f.get(), path, payload_len);
  std::string malformed;
  try {
    parse_payload(in, c);
  } catch (const bad_file& e) {
    // A damaged length usually means damaged bytes: report the checksum if it disagrees too.
    malformed = e.reason;
    in.drain();
  }
  if (in.crc() != stored_crc)
    throw bad_file{"checksum mismatch: stored " + hex32(stored_crc) + " computed " + hex32(in.crc())};
  if (!malformed.empty()) throw bad_file{malformed};
  return c;
}

// Why a file named like a checkpoint cannot be one, from its header and size alone ("" if it may be). Cheap
// enough to run on every prune; the CRC is checked only when a file is loaded.
struct header_check {
  std::string problem;
  bool other_build = false;  // a format version this build does not read: another build's, no damage
};

header_check check_header(const std::string& path) {
  std::unique_ptr<std::FILE, file_closer> f(std::fopen(path.c_str(), "rbe"));
  if (!f) return {"cannot be opened: " + std::string(std::strerror(errno))};
  struct stat st {};
  if (::fstat(::fileno(f.get()), &st) != 0) return {"cannot be read: " + std::string(std::strerror(errno))};
  char h[header_size];
  if (static_cast<uint64_t>(st.st_size) < header_size ||
      std::fread(h, 1, header_size, f.get()) != header_size)
    return {"shorter than a checkpoint header"};
  if (std::memcmp(h, magic, sizeof magic) != 0) return {"not a Longwave checkpoint (bad magic)"};
  if (get_u32(h + 8) != format_version)
    return {"unsupported format version " + std::to_string(get_u32(h + 8)), true};
  if (get_u64(h + 32) != static_cast<uint64_t>(st.st_size) - header_size) return {"truncated or padded"};
  return {};
}

}  // namespace

// ---- checkpoint
// -----------------------------------------------------------------------------------------------

const checkpoint_blob* checkpoint::find(std::string_view name) const {
  for (const auto& b : blobs)
    if (b.name == name) return &b;
  return nullptr;
}

uint32_t checkpoint::theta_crc() const {
  const auto* theta = find("theta");
  return theta ? runtime::crc32c(theta->data, theta->size) : 0;
}

// ---- checkpoint_store
// -----------------------------------------------------------------------------------------

checkpoint_store::checkpoint_store(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  if (keep_ < 1)
    throw lw_error(errc::invalid_config,
                   "checkpoint: keep must be at least 1 (got " + std::to_string(keep_) + ")");
  if (dir_.empty()) throw lw_error(errc::invalid_config, "checkpoint: the checkpoint directory is empty");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw lw_error(errc::io_error, "checkpoint: cannot create directory " + dir_ + ": " + ec.message());
}

const std::string& checkpoint_store::dir() const {
  return dir_;
}

uint32_t checkpoint_store::crc32c(const void* data, size_t n, uint32_t crc) {
  return runtime::crc32c(data, n, crc);
}

std::string checkpoint_store::write(const checkpoint& c) {
  for (size_t i = 0; i < c.blobs.size(); ++i) {
    const auto& b = c.blobs[i];
    LW_ASSERT(b.data != nullptr || b.size == 0, "checkpoint blob '" + b.name + "' has size but no data");
    LW_ASSERT(b.name.size() <= UINT32_MAX, "checkpoint blob name too long");
    for (size_t j = 0; j < i; ++j)
      LW_ASSERT(c.blobs[j].name != b.name, "duplicate checkpoint blob name '" + b.name + "'");
  }

  const std::string final_path = path_of(c.round, c.step);
  const std::string tmp_path = final_path + ".tmp";
  std::error_code exists_ec;
  prune(!standing_.empty() && fs::exists(standing_, exists_ec) ? standing_ : std::string());
  try {
    file_writer out(tmp_path);
    char h[header_size] = {};
    out.append_raw(h, header_size);  // placeholder: the length and CRC are known at the end

    uint64_t payload_len = 0;
    auto append = [&](const void* p, size_t n) {
      out.append(p, n);
      payload_len += n;
    };
    char num[8];
    put_u64(num, c.meta.size());
    append(num, 8);
    append(c.meta.data(), c.meta.size());
    put_u64(num, c.blobs.size());
    append(num, 8);
    for (const auto& b : c.blobs) {
      put_u32(num, static_cast<uint32_t>(b.name.size()));
      append(num, 4);
      append(b.name.data(), b.name.size());
      put_u64(num, b.size);
      append(num, 8);
      append(b.data, b.size);
    }
    out.flush();

    std::memcpy(h, magic, sizeof magic);
    put_u32(h + 8, format_version);
    put_u32(h + 12, 0);
    put_u64(h + 16, c.round);
    put_u64(h + 24, c.step);
    put_u64(h + 32, payload_len);
    put_u32(h + 40, out.crc());
    put_u32(h + 44, 0);
    out.write_at(h, header_size, 0);
    out.sync_and_close();

    if (::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      throw_io("rename " + tmp_path + " to", final_path, errno);
  } catch (...) {
    ::unlink(tmp_path.c_str());
    throw;
  }
  // The file is in place under its name: a directory that refuses fsync (some FUSE and network filesystems)
  // leaves only its durability across a power cut unsure, as for write_atomically; the write is not failed.
  try {
    fsync_dir(dir_);
  } catch (const lw_error&) {
  }

  standing_ = final_path;
  prune(final_path);
  return final_path;
}

std::string checkpoint_store::path_of(uint64_t round, uint64_t step) const {
  return (fs::path(dir_) / file_name_for(round, step)).string();
}

void checkpoint_store::prune(const std::string& spare) const {
  // Only files that look like checkpoints count towards keep: a stray file named like one is neither counted
  // nor deleted (stray_files() names it). A failed delete leaves an extra old file, which the next write
  // retries; it does not fail this one.
  const auto keep = static_cast<size_t>(keep_);
  std::vector<std::string> named;
  try {
    named = list();
  } catch (const lw_error&) {
    return;  // the directory cannot be read now: the next write prunes
  }
  if (named.size() <= keep) return;  // the usual case: no header read on a write's path
  std::vector<std::string> files;
  for (auto& f : named)
    if (base_name(f) == base_name(spare) || check_header(f).problem.empty()) files.push_back(std::move(f));
  size_t excess = files.size() > keep ? files.size() - keep : 0;
  // Before a write, without a file the run stands on, the newest checkpoint that loads stays whatever its
  // age: a newer one whose body is corrupt must not outlive the last good one if the write then fails.
  std::string good = spare;
  for (size_t i = files.size(); excess > 0 && good.empty() && i-- > 0;) {
    try {
      (void)load_file(files[i]);
      good = files[i];
    } catch (const lw_error&) {
      // corrupt: an older one
    }
  }
  for (size_t i = 0; i < files.size() && excess > 0; ++i) {
    if (!good.empty() && base_name(files[i]) == base_name(good)) continue;
    std::error_code ec;
    fs::remove(files[i], ec);
    --excess;
  }
}

std::vector<held_round> checkpoint_store::held_rounds(
    const std::function<void(const std::string&)>& warn) const {
  std::vector<held_round> out;
  for (const auto& f : list()) {
    try {
      const auto c = load_file(f);
      if (c.round == 0 || (!out.empty() && out.back().round == c.round)) continue;  // the round's first only
      held_round h{c.round, c.theta_crc()};
      if (const auto* pending = c.find("pending"); pending && c.find("theta"))
        h.history = runtime::crc32c(pending->data, pending->size, h.history);
      out.push_back(h);
    } catch (const lw_error& e) {
      if (warn)
        warn(std::string("checkpoint ") + f + " is left out of the rounds this node offers: " + e.what());
    }
  }
  return out;
}

namespace {

/// A set's name under superseded/: "<unix seconds>" or "<unix seconds>-<k>" for the k-th set of that second.
bool parse_set_name(const std::string& name, std::pair<uint64_t, uint64_t>* key) {
  const auto dash = name.find('-');
  const auto number = [](std::string_view t, uint64_t* v) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *v);
    return !t.empty() && ec == std::errc() && end == t.data() + t.size();
  };
  key->second = 1;
  return number(std::string_view(name).substr(0, dash), &key->first) &&
         (dash == std::string::npos || number(std::string_view(name).substr(dash + 1), &key->second));
}

}  // namespace

std::vector<std::string> checkpoint_store::set_aside(uint64_t from_round,
                                                     std::vector<std::string>* pruned) const {
  std::vector<std::string> moved;
  const fs::path sets = fs::path(dir_) / superseded_dir_name;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, fs::path>> found;  // the sets there, oldest first
  std::error_code ec;
  for (fs::directory_iterator it(sets, ec), end; !ec && it != end; it.increment(ec)) {
    std::pair<uint64_t, uint64_t> key;
    std::error_code type_ec;
    if (parse_set_name(it->path().filename().string(), &key) && it->is_directory(type_ec))
      found.emplace_back(key, it->path());
  }
  std::sort(found.begin(), found.end());
  // The new set sorts after every other, in one second or with the clock set back.
  const auto now = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  std::pair<uint64_t, uint64_t> key{now, 1};
  if (!found.empty() && found.back().first.first >= now)
    key = {found.back().first.first, found.back().first.second + 1};
  const fs::path aside =
      sets / (std::to_string(key.first) + (key.second > 1 ? "-" + std::to_string(key.second) : ""));
  for (const auto& f : list()) {
    uint64_t round = 0, step = 0;
    const std::string name = fs::path(f).filename().string();
    if (!parse_file_name(name, &round, &step) || round < from_round) continue;
    fs::create_directories(aside, ec);
    if (!ec) fs::rename(f, aside / name, ec);
    if (ec) throw_io("move " + f + " into", aside.string(), ec.value());
    moved.push_back((aside / name).string());
  }
  if (moved.empty()) return moved;
  // The newest keep_ sets stay (this one among them); older ones go, as older checkpoints do: a node that
  // rejoins often would fill its disk with them.
  found.emplace_back(key, aside);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep_, 1)) < found.size(); ++i) {
    std::error_code rm_ec;
    fs::remove_all(found[i].second, rm_ec);
    if (!rm_ec && pruned) pruned->push_back(found[i].second.string());
  }
  return moved;
}

std::string checkpoint_store::set_aside_corrupt(const std::string& path) const {
  const fs::path folder =
      fs::path(dir_) / (check_header(path).other_build ? other_build_dir_name : corrupt_dir_name);
  const std::string name = fs::path(path).filename().string();
  std::error_code ec;
  fs::create_directories(folder, ec);
  fs::path to = folder / name;
  for (int k = 2; !ec && fs::exists(to, ec); ++k) to = folder / (name + "." + std::to_string(k));
  if (!ec) fs::rename(path, to, ec);
  if (ec) throw_io("move " + path + " into", folder.string(), ec.value());
  return to.string();
}

std::vector<std::string> checkpoint_store::list() const {
  struct entry {
    uint64_t round, step;
    std::string path;
  };
  std::vector<entry> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    uint64_t round = 0, step = 0;
    const std::string name = it->path().filename().string();
    if (!parse_file_name(name, &round, &step)) continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    found.push_back({round, step, it->path().string()});
  }
  // An unreadable directory is not an empty one: a resume would start from scratch beside the old files.
  if (ec && ec != std::errc::no_such_file_or_directory) throw_io("read directory", dir_, ec.value());
  std::sort(found.begin(), found.end(), [](const entry& a, const entry& b) {
    return std::tie(a.round, a.step, a.path) < std::tie(b.round, b.step, b.path);
  });
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (auto& e : found) paths.push_back(std::move(e.path));
  return paths;
}

std::vector<stray_file> checkpoint_store::stray_files() const {
  std::vector<stray_file> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    uint64_t round = 0, step = 0;
    std::error_code type_ec;
    if (name == lock_file_name) continue;  // the running process's own (run_lock)
    if ((name == superseded_dir_name || name == corrupt_dir_name || name == other_build_dir_name) &&
        it->is_directory(type_ec))
      continue;  // set_aside's and set_aside_corrupt's
    if (parse_file_name(name, &round, &step)) {
      if (!it->is_regular_file(type_ec))
        out.push_back({it->path().string(), "named like a checkpoint but not a regular file"});
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
               parse_file_name(name.substr(0, name.size() - 4), &round, &step)) {
      out.push_back(
          {it->path().string(), "an unfinished checkpoint write (the process writing it died)", true});
    } else {
      out.push_back({it->path().string(), "not a checkpoint file"});
    }
  }
  std::sort(out.begin(), out.end(), [](const stray_file& a, const stray_file& b) { return a.path < b.path; });
  return out;
}

checkpoint checkpoint_store::load_file(const std::string& path) {
  try {
    return read_checkpoint(path);
  } catch (const bad_file& e) {
    throw lw_error(errc::corrupt_checkpoint, path + ": " + e.reason);
  }
}

std::optional<checkpoint> checkpoint_store::load_latest(const std::function<void(const std::string&)>& warn,
                                                        const std::function<void(checkpoint&)>& accept,
                                                        std::vector<std::string>* corrupt) const {
  const auto files = list();
  if (files.empty()) return std::nullopt;
  std::string newest_problem;
  for (size_t i = files.size(); i-- > 0;) {
    std::string problem;
    std::optional<checkpoint> c;
    try {
      c = read_checkpoint(files[i]);
    } catch (const bad_file& e) {
      problem =
          (check_header(files[i]).other_build ? "is of another build (" : "is corrupt (") + e.reason + ")";
      if (corrupt) corrupt->push_back(files[i]);
    } catch (const lw_error& e) {
      if (e.code() != errc::io_error) throw;
      problem = "cannot be read (" + std::string(e.what()) + ")";
    }
    if (c) {
      try {
        if (accept) accept(*c);
        return c;
      } catch (const lw_error& e) {
        if (e.code() != errc::corrupt_checkpoint) throw;
        problem = "does not fit this run (" + std::string(e.what()) + ")";
        if (corrupt) corrupt->push_back(files[i]);
      }
    }
    if (newest_problem.empty()) newest_problem = base_name(files[i]) + " " + problem;
    if (warn)
      warn("checkpoint " + base_name(files[i]) + " " + problem + "; " +
           (i > 0 ? "falling back to " + base_name(files[i - 1])
                  : std::string("no older checkpoint is left")));
  }
  throw lw_error(errc::corrupt_checkpoint,
                 "checkpoint: none of the " + std::to_string(files.size()) + " checkpoint files in " + dir_ +
                     " is valid (newest: " + newest_problem +
                     "); move them aside to start from scratch, or set another checkpoint directory");
}

}  // namespace longwave::runtime
