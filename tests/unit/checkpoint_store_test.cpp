// Tests of runtime/checkpoint/checkpoint_store: round trips, pruning, corruption detection and fallback,
// CRC-32C.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/checkpoint/run_lock.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/files/atomic_file.hpp"

namespace fs = std::filesystem;
using longwave::errc;
using longwave::lw_error;
using longwave::runtime::checkpoint;
using longwave::runtime::checkpoint_blob;
using longwave::runtime::checkpoint_store;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at the end of the test.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = fs::temp_directory_path() / ("lw_checkpoint_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++) + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(gen() & 0xff);
  return v;
}

checkpoint_blob make_blob(std::string name, std::vector<char> bytes) {
  auto owner = std::make_shared<std::vector<char>>(std::move(bytes));
  checkpoint_blob b;
  b.name = std::move(name);
  b.data = owner->data();
  b.size = owner->size();
  b.owner = owner;
  return b;
}

checkpoint small_checkpoint(uint64_t round) {
  checkpoint c;
  c.round = round;
  c.step = round * 10;
  c.meta = "round=" + std::to_string(round) + "\n";
  c.blobs.push_back(make_blob("theta_global", random_bytes(256, static_cast<uint32_t>(round))));
  return c;
}

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The error load_file throws for `path`, or an lw_error with errc::none if it loads.
lw_error load_error(const std::string& path) {
  try {
    checkpoint_store::load_file(path);
  } catch (const lw_error& e) {
    return e;
  }
  return lw_error(errc::none, "");
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

void put_le(std::vector<char>& v, uint64_t x, int bytes) {
  for (int i = 0; i < bytes; ++i) v.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
}

// A hand-built file: the 48-byte header (with the payload's true CRC) followed by `payload`.
std::vector<char> build_file(uint64_t round, uint64_t step, const std::vector<char>& payload,
                             uint64_t claimed_length) {
  std::vector<char> f = {'L', 'W', 'C', 'K', 'P', 'T', '0', '1'};
  put_le(f, 1, 4);
  put_le(f, 0, 4);
  put_le(f, round, 8);
  put_le(f, step, 8);
  put_le(f, claimed_length, 8);
  put_le(f, checkpoint_store::crc32c(payload.data(), payload.size()), 4);
  put_le(f, 0, 4);
  f.insert(f.end(), payload.begin(), payload.end());
  return f;
}

uint32_t crc32c_bitwise(const unsigned char* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

}  // namespace

CATCH_TEST_CASE("A checkpoint with several blobs, an empty one and a 5 MB one, survives a round trip",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store((tmp.path / "a" / "b").string(), 3);  // creates parents
  CATCH_CHECK(fs::is_directory(tmp.path / "a" / "b"));

  checkpoint c;
  c.round = 3;
  c.step = 150;
  c.meta = std::string("model=tiny\nlr=0.1\n") + '\0' + "binary-safe";
  c.blobs.push_back(make_blob("theta_global", random_bytes(4096, 1)));
  c.blobs.push_back(make_blob("worker0/exp_avg", random_bytes(5 * 1024 * 1024 + 3, 2)));
  c.blobs.push_back(make_blob("empty", {}));
  c.blobs.push_back(make_blob("worker1/step", random_bytes(8, 3)));

  const std::string path = store.write(c);
  CATCH_CHECK(fs::path(path).filename() == "ckpt-00000003-0000000150.lwc");
  CATCH_CHECK(fs::path(path).parent_path() == tmp.path / "a" / "b");

  const checkpoint back = checkpoint_store::load_file(path);
  CATCH_CHECK(back.round == 3);
  CATCH_CHECK(back.step == 150);
  CATCH_CHECK(back.meta == c.meta);
  CATCH_REQUIRE(back.blobs.size() == c.blobs.size());
  for (size_t i = 0; i < c.blobs.size(); ++i) {
    const auto& want = c.blobs[i];
    const auto& got = back.blobs[i];
    CATCH_CHECK(got.name == want.name);
    CATCH_REQUIRE(got.size == want.size);
    CATCH_CHECK(got.storage.size() == got.size);
    CATCH_CHECK(got.data == static_cast<const void*>(got.storage.data()));
    CATCH_CHECK((got.size == 0 || std::memcmp(got.data, want.data, got.size) == 0));
  }
  CATCH_REQUIRE(back.find("worker0/exp_avg") != nullptr);
  CATCH_CHECK(back.find("worker0/exp_avg")->size == 5 * 1024 * 1024 + 3);
  CATCH_REQUIRE(back.find("empty") != nullptr);
  CATCH_CHECK(back.find("empty")->size == 0);
  CATCH_CHECK(back.find("missing") == nullptr);

  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 3);
  CATCH_CHECK(latest->blobs.size() == 4);
  CATCH_CHECK(warnings.empty());
}

CATCH_TEST_CASE("With keep=2 only the two newest checkpoints remain, listed oldest first", "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 2);
  for (uint64_t r = 1; r <= 5; ++r) store.write(small_checkpoint(r));
  const auto files = store.list();
  CATCH_REQUIRE(files.size() == 2);
  CATCH_CHECK(fs::path(files[0]).filename() == "ckpt-00000004-0000000040.lwc");
  CATCH_CHECK(fs::path(files[1]).filename() == "ckpt-00000005-0000000050.lwc");
  CATCH_CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 2);
  auto latest = store.load_latest();
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 5);
}

CATCH_TEST_CASE("The rounds a node offers name each one's history and leave out a corrupt older checkpoint",
                "[checkpoint]") {
  using longwave::runtime::held_round;
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 6);
  const auto with_theta = [](uint64_t round, uint32_t seed, uint64_t step) {
    auto c = small_checkpoint(round);
    c.step = step;
    c.blobs.push_back(make_blob("theta", random_bytes(64, seed)));
    return c;
  };
  const auto crc_of = [](uint32_t seed, uint32_t crc = 0) {
    const auto b = random_bytes(64, seed);
    return longwave::runtime::crc32c(b.data(), b.size(), crc);
  };
  for (uint64_t r = 1; r <= 4; ++r) store.write(with_theta(r, 100 + static_cast<uint32_t>(r), r * 10));
  CATCH_CHECK(
      store.held_rounds() ==
      std::vector<held_round>{{1, crc_of(101)}, {2, crc_of(102)}, {3, crc_of(103)}, {4, crc_of(104)}});
  // A later file of round 4 (mid-round, where streaming's theta has moved on): the round's history is its
  // first file's, the boundary's.
  store.write(with_theta(4, 7, 44));
  CATCH_CHECK(store.held_rounds().back() == held_round{4, crc_of(104)});
  // A delayed run's pending average is part of its history: two sides of a split in the last round hold the
  // same theta and another pending average.
  auto delayed = with_theta(5, 105, 50);
  delayed.blobs.push_back(make_blob("pending", random_bytes(64, 9)));
  store.write(delayed);
  CATCH_CHECK(store.held_rounds().back() == held_round{5, crc_of(9, crc_of(105))});
  const auto second = store.list()[1];
  fs::resize_file(second, fs::file_size(second) / 2);
  std::vector<std::string> warnings;
  const auto held = store.held_rounds([&](const std::string& w) { warnings.push_back(w); });
  CATCH_CHECK(held.size() == 4);
  CATCH_CHECK(held[1] == held_round{3, crc_of(103)});
  CATCH_REQUIRE(warnings.size() == 1);
  CATCH_CHECK(warnings[0].find(fs::path(second).filename().string()) != std::string::npos);

  // Setting rounds 3 and later aside: they leave the store (and its keep) for superseded/<time>/, which is
  // not a stray.
  const auto moved = store.set_aside(3);
  CATCH_CHECK(moved.size() == 4);
  CATCH_CHECK(store.list().size() == 2);
  for (const auto& m : moved) CATCH_CHECK(fs::path(m).parent_path().parent_path() == tmp.path / "superseded");
  CATCH_CHECK(store.stray_files().empty());
  CATCH_CHECK(store.set_aside(3).empty());
}

CATCH_TEST_CASE("superseded/ keeps the newest checkpoint.keep sets of set-aside checkpoints",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 2);
  std::vector<std::string> sets;
  for (uint64_t r = 1; r <= 5; ++r) {  // a node that rejoins and sets its newest round aside, five times
    store.write(small_checkpoint(r));
    std::vector<std::string> pruned;
    const auto moved = store.set_aside(r, &pruned);
    CATCH_REQUIRE(moved.size() == 1);
    sets.push_back(fs::path(moved[0]).parent_path().string());  // each its own set, in one second too
    CATCH_CHECK(pruned == (r <= 2 ? std::vector<std::string>{} : std::vector<std::string>{sets[r - 3]}));
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path / "superseded")) left.push_back(e.path().string());
  std::vector<std::string> newest{sets[3], sets[4]};
  std::sort(left.begin(), left.end());
  std::sort(newest.begin(), newest.end());
  CATCH_CHECK(left == newest);
  CATCH_CHECK_FALSE(fs::is_empty(sets[4]));
  // A directory there that is not a set (a person's notes) is never removed.
  fs::create_directories(tmp.path / "superseded" / "notes");
  store.write(small_checkpoint(6));
  (void)store.set_aside(6);
  CATCH_CHECK(fs::exists(tmp.path / "superseded" / "notes"));
}

CATCH_TEST_CASE("Checkpoints are ordered by round and step numerically, not by file name", "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 10);
  checkpoint big = small_checkpoint(1);
  big.round = 100000000;  // 9 digits: "ckpt-1..." sorts before "ckpt-9..." as text
  big.step = 5;
  store.write(big);
  store.write(small_checkpoint(99999999));
  const auto files = store.list();
  CATCH_REQUIRE(files.size() == 2);
  CATCH_CHECK(fs::path(files[0]).filename() == "ckpt-99999999-0999999990.lwc");
  CATCH_CHECK(fs::path(files[1]).filename() == "ckpt-100000000-0000000005.lwc");
  CATCH_CHECK(store.load_latest()->round == 100000000);
}

CATCH_TEST_CASE("A truncated newest checkpoint is skipped with a warning and the previous one is loaded",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  store.write(small_checkpoint(1));
  const std::string newest = store.write(small_checkpoint(2));
  fs::resize_file(newest, fs::file_size(newest) - 10);

  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 1);
  CATCH_REQUIRE(warnings.size() == 1);
  CATCH_CHECK(contains(warnings[0], "checkpoint ckpt-00000002-0000000020.lwc is corrupt (truncated"));
  CATCH_CHECK(contains(warnings[0], "falling back to ckpt-00000001-0000000010.lwc"));

  const lw_error e = load_error(newest);
  CATCH_CHECK(e.code() == errc::corrupt_checkpoint);
  CATCH_CHECK(contains(e.what(), newest + ": truncated"));

  // Truncated inside the header too.
  fs::resize_file(newest, 20);
  CATCH_CHECK(contains(load_error(newest).what(), "shorter than the 48-byte header"));
}

CATCH_TEST_CASE(
    "load_latest names the files that fail their checks, and set_aside_corrupt moves them to corrupt/",
    "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  const std::string first = store.write(small_checkpoint(1));
  store.write(small_checkpoint(2));
  const std::string refused = store.write(small_checkpoint(3));
  const std::string bad = store.write(small_checkpoint(4));
  fs::resize_file(bad, fs::file_size(bad) - 10);

  // A file `accept` refuses (it holds what no run writes) is named too; the one loaded is not.
  std::vector<std::string> corrupt;
  auto latest = store.load_latest(
      {},
      [&](checkpoint& c) {
        if (c.round == 3) throw lw_error(errc::corrupt_checkpoint, "a negative count");
      },
      &corrupt);
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 2);
  CATCH_CHECK(latest->source == store.path_of(2, 20));
  CATCH_CHECK(corrupt == std::vector<std::string>{bad, refused});

  const auto moved = store.set_aside_corrupt(bad);
  CATCH_CHECK(moved == (tmp.path / "corrupt" / fs::path(bad).filename()).string());
  CATCH_CHECK(fs::exists(moved));
  CATCH_CHECK_FALSE(fs::exists(bad));
  CATCH_CHECK(store.list().size() == 3);
  CATCH_CHECK(store.stray_files().empty());  // the folder is the store's own
  // A later file of the same name keeps the first one's copy.
  write_all(bad, std::vector<char>(64, 'x'));
  const auto second = store.set_aside_corrupt(bad);
  CATCH_CHECK(second == moved + ".2");
  CATCH_CHECK(fs::file_size(second) == 64);
  CATCH_CHECK(fs::file_size(moved) != 64);
  // A file of another format version is another build's, no damage: it goes to other-build/, out of the way
  // of this run's write of its name (a probe: "left where it is", then overwritten), intact.
  auto other = read_all(refused);
  other[8] = static_cast<char>(other[8] + 1);  // the format version, a little-endian u32 at offset 8
  write_all(refused, other);
  const auto kept = store.set_aside_corrupt(refused);
  CATCH_CHECK(kept == (tmp.path / "other-build" / fs::path(refused).filename()).string());
  CATCH_CHECK_FALSE(fs::exists(refused));
  CATCH_CHECK(read_all(kept) == other);
  CATCH_CHECK(store.stray_files().empty());
  // A move that fails says so.
  const lw_error e = [&] {
    try {
      store.set_aside_corrupt(first + ".gone");
    } catch (const lw_error& err) {
      return err;
    }
    return lw_error(errc::none, "no error");
  }();
  CATCH_CHECK(e.code() == errc::io_error);
  CATCH_CHECK(contains(e.what(), first + ".gone"));
}

CATCH_TEST_CASE("A single flipped bit in the newest checkpoint is caught by the checksum", "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  store.write(small_checkpoint(3));
  checkpoint c = small_checkpoint(4);
  c.blobs.push_back(make_blob("worker0/exp_avg", random_bytes(1 << 20, 9)));
  const std::string newest = store.write(c);

  auto bytes = read_all(newest);
  bytes[bytes.size() / 2] ^= 0x10;
  write_all(newest, bytes);

  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 3);
  CATCH_REQUIRE(warnings.size() == 1);
  CATCH_CHECK(contains(warnings[0],
                       "checkpoint ckpt-00000004-0000000040.lwc is corrupt (checksum mismatch: stored 0x"));
  CATCH_CHECK(contains(warnings[0], " computed 0x"));
  CATCH_CHECK(contains(warnings[0], "falling back to ckpt-00000003-0000000030.lwc"));
}

CATCH_TEST_CASE("Every single-bit flip anywhere in a small checkpoint file is detected", "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 1);
  checkpoint c = small_checkpoint(7);
  c.blobs.push_back(make_blob("b", random_bytes(16, 4)));
  const std::string path = store.write(c);
  const auto good = read_all(path);
  CATCH_REQUIRE(good.size() > 48);

  size_t undetected = 0, crashed = 0;
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = good;
      bad[byte] ^= static_cast<char>(1 << bit);
      write_all(path, bad);
      const lw_error e = load_error(path);
      if (e.code() == errc::none) ++undetected;
      if (e.code() != errc::none && e.code() != errc::corrupt_checkpoint) ++crashed;
    }
  }
  CATCH_CHECK(undetected == 0);
  CATCH_CHECK(crashed == 0);
}

CATCH_TEST_CASE("A file with a bad magic is rejected and an older checkpoint is used instead",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  store.write(small_checkpoint(1));
  const fs::path bogus = tmp.path / "ckpt-00000009-0000000090.lwc";
  std::vector<char> junk(200, 'x');
  std::memcpy(junk.data(), "NOTACKPT", 8);
  write_all(bogus, junk);

  const lw_error e = load_error(bogus.string());
  CATCH_CHECK(e.code() == errc::corrupt_checkpoint);
  CATCH_CHECK(contains(e.what(), "bad magic"));

  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 1);
  CATCH_REQUIRE(warnings.size() == 1);
  CATCH_CHECK(contains(warnings[0], "ckpt-00000009-0000000090.lwc is corrupt (bad magic"));
}

CATCH_TEST_CASE("An empty checkpoint directory has no latest checkpoint", "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 2);
  std::vector<std::string> warnings;
  CATCH_CHECK_FALSE(store.load_latest([&](const std::string& w) { warnings.push_back(w); }).has_value());
  CATCH_CHECK(warnings.empty());
  CATCH_CHECK(store.list().empty());
}

CATCH_TEST_CASE("A checkpoint directory that cannot be read is not taken for an empty one", "[checkpoint]") {
  // An unreadable directory listed nothing: the run started from scratch beside its old checkpoints.
  temp_dir tmp;
  const std::string dir = (tmp.path / "ckpt").string();
  checkpoint_store store(dir, 2);
  const std::string p1 = store.write(small_checkpoint(1));
  fs::rename(dir, (tmp.path / "elsewhere").string());
  { std::ofstream(dir) << "a file where the directory was\n"; }
  lw_error err(errc::none, "");
  try {
    (void)store.load_latest();
  } catch (const lw_error& e) {
    err = e;
  }
  CATCH_CHECK(err.code() == errc::io_error);
  CATCH_CHECK(contains(err.what(), "cannot read directory " + dir));
  fs::remove(dir);
  CATCH_CHECK(store.list().empty());  // gone: nothing to list
  fs::rename((tmp.path / "elsewhere").string(), dir);
  CATCH_CHECK(store.list() == std::vector<std::string>{p1});
}

CATCH_TEST_CASE("A stale .tmp file from an interrupted write is ignored", "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 1);
  store.write(small_checkpoint(1));
  write_all(tmp.path / "ckpt-00000002-0000000020.lwc.tmp", std::vector<char>(100, 'z'));
  write_all(tmp.path / "notes.txt", std::vector<char>(3, 'n'));

  CATCH_CHECK(store.list().size() == 1);
  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 1);
  CATCH_CHECK(warnings.empty());

  // Pruning with keep=1 touches only checkpoint files.
  store.write(small_checkpoint(3));
  CATCH_CHECK(store.list().size() == 1);
  CATCH_CHECK(fs::exists(tmp.path / "notes.txt"));
}

CATCH_TEST_CASE("stray_files names unfinished writes and other files, and says which is which",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 3);
  store.write(small_checkpoint(1));
  write_all(tmp.path / "ckpt-00000002-0000000020.lwc.tmp", std::vector<char>(100, 'z'));
  write_all(tmp.path / "notes.tmp", std::vector<char>(3, 'n'));
  const auto strays = store.stray_files();
  CATCH_REQUIRE(strays.size() == 2);
  CATCH_CHECK(fs::path(strays[0].path).filename() == "ckpt-00000002-0000000020.lwc.tmp");
  CATCH_CHECK(strays[0].unfinished_write);
  CATCH_CHECK(contains(strays[0].reason, "unfinished checkpoint write"));
  CATCH_CHECK(fs::path(strays[1].path).filename() == "notes.tmp");
  CATCH_CHECK_FALSE(strays[1].unfinished_write);
  CATCH_CHECK(strays[1].reason == "not a checkpoint file");
}

CATCH_TEST_CASE("A garbage file named like a newer checkpoint is neither counted towards keep nor pruned",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 3);
  const auto garbage = tmp.path / "ckpt-00009999-0000099990.lwc";
  write_all(garbage, random_bytes(4096, 3));
  for (uint64_t r = 1; r <= 5; ++r) store.write(small_checkpoint(r));
  const auto files = store.list();
  CATCH_REQUIRE(files.size() == 4);  // rounds 3, 4, 5 and the garbage file
  CATCH_CHECK(fs::path(files[0]).filename() == "ckpt-00000003-0000000030.lwc");
  CATCH_CHECK(fs::exists(garbage));
  // Loading says what it skipped and falls back to the newest real checkpoint.
  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 5);
  CATCH_REQUIRE(warnings.size() == 1);
  CATCH_CHECK(contains(warnings[0], "ckpt-00009999-0000099990.lwc is corrupt (bad magic"));
}

CATCH_TEST_CASE("Lengths that claim more bytes than the file holds are rejected without huge allocations",
                "[checkpoint]") {
  temp_dir tmp;
  const fs::path path = tmp.path / "crafted.lwc";
  auto check_rejected = [&](const std::vector<char>& file, const std::string& reason) {
    write_all(path, file);
    const lw_error e = load_error(path.string());
    CATCH_CHECK(e.code() == errc::corrupt_checkpoint);
    CATCH_CHECK(contains(e.what(), reason));
  };

  std::vector<char> ok;  // meta "m", one blob "x" of 2 bytes
  put_le(ok, 1, 8);
  ok.push_back('m');
  put_le(ok, 1, 8);
  put_le(ok, 1, 4);
  ok.push_back('x');
  put_le(ok, 2, 8);
  ok.push_back('1');
  ok.push_back('2');
  write_all(path, build_file(1, 2, ok, ok.size()));
  CATCH_CHECK(checkpoint_store::load_file(path.string()).find("x")->size == 2);

  // Header payload length far beyond the file, and slightly short of it.
  check_rejected(build_file(1, 2, ok, uint64_t{1} << 62), "truncated");
  check_rejected(build_file(1, 2, ok, ~uint64_t{0}), "truncated");
  check_rejected(build_file(1, 2, ok, ok.size() - 1), "length mismatch");

  // Inner lengths with a valid checksum: only the bounds checks can catch them.
  auto patched = [&](size_t offset, uint64_t value, int bytes) {
    std::vector<char> p = ok;
    for (int i = 0; i < bytes; ++i) p[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
    return build_file(1, 2, p, p.size());
  };
  check_rejected(patched(0, ~uint64_t{0}, 8), "malformed record: meta");
  check_rejected(patched(9, uint64_t{1} << 60, 8), "malformed record: blob count");
  check_rejected(patched(17, 0xffffffffu, 4), "malformed record: blob 0 name");
  check_rejected(patched(22, uint64_t{1} << 63, 8), "malformed record: blob 0 (x) data");
  check_rejected(patched(9, 0, 8), "malformed record: 15 unexpected bytes");

  // The same damage in a real file without fixing the checksum is reported as a checksum mismatch.
  auto bad = build_file(1, 2, ok, ok.size());
  bad[48 + 9 + 7] = '\x7f';  // blob count becomes huge
  write_all(path, bad);
  CATCH_CHECK(contains(load_error(path.string()).what(), "checksum mismatch"));
}

CATCH_TEST_CASE("A header whose round and step disagree with the canonical file name is rejected",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  const std::string path = store.write(small_checkpoint(1));
  const fs::path renamed = tmp.path / "ckpt-00000007-0000000070.lwc";
  fs::rename(path, renamed);
  CATCH_CHECK(contains(load_error(renamed.string()).what(), "file name says round 7 step 70"));
  // Under any other name the header alone decides.
  const fs::path copy = tmp.path / "backup.lwc";
  fs::copy_file(renamed, copy);
  CATCH_CHECK(checkpoint_store::load_file(copy.string()).round == 1);
}

CATCH_TEST_CASE("When every checkpoint is corrupt load_latest refuses instead of starting over",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  const std::string p1 = store.write(small_checkpoint(1));
  const std::string p2 = store.write(small_checkpoint(2));
  fs::resize_file(p1, 30);
  fs::resize_file(p2, 60);
  std::vector<std::string> warnings;
  lw_error err(errc::none, "");
  try {
    store.load_latest([&](const std::string& w) { warnings.push_back(w); });
  } catch (const lw_error& e) {
    err = e;
  }
  CATCH_CHECK(err.code() == errc::corrupt_checkpoint);
  CATCH_CHECK(contains(err.what(), tmp.path.string()));
  CATCH_CHECK(contains(err.what(), "move them aside"));
  CATCH_REQUIRE(warnings.size() == 2);
  CATCH_CHECK(contains(warnings[1], "no older checkpoint is left"));
}

CATCH_TEST_CASE("A newest checkpoint that the caller's check refuses is skipped as a corrupt one is",
                "[checkpoint]") {
  temp_dir tmp;
  checkpoint_store store(tmp.path.string(), 5);
  store.write(small_checkpoint(1));
  store.write(small_checkpoint(2));
  auto refuse_round_2 = [](checkpoint& c) {
    if (c.round == 2) throw lw_error(errc::corrupt_checkpoint, "no replica0/counters");
    c.meta = "taken";  // the check may take the contents
  };
  std::vector<std::string> warnings;
  auto latest = store.load_latest([&](const std::string& w) { warnings.push_back(w); }, refuse_round_2);
  CATCH_REQUIRE(latest.has_value());
  CATCH_CHECK(latest->round == 1);
  CATCH_CHECK(latest->meta == "taken");
  CATCH_REQUIRE(warnings.size() == 1);
  CATCH_CHECK(contains(warnings[0],
                       "checkpoint ckpt-00000002-0000000020.lwc does not fit this run (no "
                       "replica0/counters); falling back to ckpt-00000001-0000000010.lwc"));
  // Refused everywhere: the search ends as for corrupt files; another error of the check ends it at once.
  try {
    store.load_latest({}, [](checkpoint&) { throw lw_error(errc::corrupt_checkpoint, "never fits"); });
    CATCH_FAIL("load_latest accepted a checkpoint its check refused");
  } catch (const lw_error& e) {
    CATCH_CHECK(contains(e.what(), "does not fit this run (never fits)"));
  }
  int seen = 0;
  CATCH_CHECK_THROWS_WITH(store.load_latest({},
                                            [&](checkpoint&) {
                                              ++seen;
                                              throw lw_error(errc::invalid_config, "another shape");
                                            }),
                          "another shape");
  CATCH_CHECK(seen == 1);
}

CATCH_TEST_CASE("A run lock says when its file is gone or another file took its path", "[checkpoint]") {
  temp_dir tmp;
  const longwave::runtime::run_lock lock(tmp.path.string());
  CATCH_CHECK(lock.lost().empty());
  fs::remove(lock.path());
  CATCH_CHECK(contains(lock.lost(), "is gone"));
  std::ofstream(lock.path()) << "a later run's lock\n";
  CATCH_CHECK(contains(lock.lost(), "is another file now"));
}

CATCH_TEST_CASE("A small file is replaced whole or left as it was, never with a .tmp beside it",
                "[checkpoint]") {
  using longwave::runtime::write_atomically;
  temp_dir tmp;
  const fs::path f = tmp.path / "result.json";
  CATCH_CHECK(write_atomically(f.string(), "first\n").empty());
  CATCH_CHECK(write_atomically(f.string(), "second\n").empty());
  std::ifstream in(f);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CATCH_CHECK(text == "second\n");
  CATCH_CHECK_FALSE(fs::exists(tmp.path / "result.json.tmp"));

  // A directory in the way: the rename fails, the error names both paths and the temporary file is gone.
  fs::create_directory(tmp.path / "dir");
  fs::create_directory(tmp.path / "dir" / "inside");
  const std::string e = write_atomically((tmp.path / "dir").string(), "x");
  CATCH_CHECK(contains(
      e, (tmp.path / "dir").string() + ": cannot rename " + (tmp.path / "dir.tmp").string() + " over it"));
  CATCH_CHECK_FALSE(fs::exists(tmp.path / "dir.tmp"));
  // No such directory: the open fails, naming the temporary file.
  CATCH_CHECK(contains(write_atomically((tmp.path / "no" / "f").string(), "x"),
                       (tmp.path / "no" / "f.tmp").string()));
}

CATCH_TEST_CASE("A lowered keep frees the old checkpoints before the next write, which may then fail",
                "[checkpoint]") {
  temp_dir tmp;
  {
    checkpoint_store five(tmp.path.string(), 5);
    for (uint64_t r = 1; r <= 5; ++r) five.write(small_checkpoint(r));
  }
  checkpoint_store two(tmp.path.string(), 2);
  // The write of round 6 fails (its temporary file's name is a directory), as on a full disk: the 3 oldest
  // are gone already, the newest 2 kept.
  fs::create_directory(tmp.path / "ckpt-00000006-0000000060.lwc.tmp");
  CATCH_CHECK_THROWS_AS(two.write(small_checkpoint(6)), lw_error);
  const auto left = two.list();
  CATCH_REQUIRE(left.size() == 2);
  CATCH_CHECK(fs::path(left.front()).filename() == "ckpt-00000004-0000000040.lwc");
  // With keep 1 and the newest corrupt (its header whole), the good round 4 is not the one pruned: a failed
  // write must leave a checkpoint to resume from.
  const auto newest = left.back();
  auto bytes = read_all(newest);
  bytes[bytes.size() - 1] ^= 0x40;
  write_all(newest, bytes);
  checkpoint_store one(tmp.path.string(), 1);
  CATCH_CHECK_THROWS_AS(one.write(small_checkpoint(6)), lw_error);
  CATCH_REQUIRE(one.load_latest().has_value());
  CATCH_CHECK(one.load_latest()->round == 4);
}

CATCH_TEST_CASE("Bad settings and unwritable directories give clear errors", "[checkpoint]") {
  temp_dir tmp;
  try {
    checkpoint_store bad(tmp.path.string(), 0);
    CATCH_CHECK(false);
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::invalid_config);
    CATCH_CHECK(contains(e.what(), "keep"));
  }

  write_all(tmp.path / "file", {'x'});
  try {
    checkpoint_store under_file((tmp.path / "file" / "sub").string(), 1);
    CATCH_CHECK(false);
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::io_error);
    CATCH_CHECK(contains(e.what(), (tmp.path / "file" / "sub").string()));
  }

  // The directory disappears under a live store: write fails with the path, leaving no .tmp behind.
  const fs::path dir = tmp.path / "gone";
  checkpoint_store store(dir.string(), 1);
  fs::remove(dir);
  write_all(dir, {'x'});
  try {
    store.write(small_checkpoint(1));
    CATCH_CHECK(false);
  } catch (const lw_error& e) {
    CATCH_CHECK(e.code() == errc::io_error);
    CATCH_CHECK(contains(e.what(), "ckpt-00000001-0000000010.lwc.tmp"));
  }
}

CATCH_TEST_CASE("CRC-32C matches the standard check value and a bitwise reference", "[checkpoint]") {
  CATCH_CHECK(checkpoint_store::crc32c("123456789", 9) == 0xE3069283u);
  CATCH_CHECK(checkpoint_store::crc32c(nullptr, 0) == 0u);

  const auto data = random_bytes(300, 5);
  const auto* u = reinterpret_cast<const unsigned char*>(data.data());
  bool all_equal = true;
  for (size_t offset = 0; offset < 8; ++offset)
    for (size_t n = 0; n + offset <= 200; ++n)
      all_equal = all_equal && checkpoint_store::crc32c(u + offset, n) == crc32c_bitwise(u + offset, n);
  CATCH_CHECK(all_equal);

  // Chaining: crc(a + b) == crc(b, crc(a)).
  const uint32_t whole = checkpoint_store::crc32c(u, 300);
  CATCH_CHECK(checkpoint_store::crc32c(u + 123, 177, checkpoint_store::crc32c(u, 123)) == whole);
}

CATCH_TEST_CASE("CRC-32C combined from pieces, and in parallel, equals the one-pass CRC", "[checkpoint]") {
  namespace rt = longwave::runtime;
  const auto data = random_bytes(300, 6);
  const auto* u = reinterpret_cast<const unsigned char*>(data.data());
  const uint32_t whole = rt::crc32c(u, 300);
  bool all_equal = true;
  for (size_t cut = 0; cut <= 300; ++cut)
    all_equal = all_equal &&
                rt::crc32c_combine(rt::crc32c(u, cut), rt::crc32c(u + cut, 300 - cut), 300 - cut) == whole;
  CATCH_CHECK(all_equal);

  // Model-sized: pieces of at least 1 MB, odd lengths, more threads than pieces.
  const auto big = random_bytes((5U << 20) + 37, 7);
  const uint32_t one_pass = rt::crc32c(big.data(), big.size());
  for (const unsigned threads : {1U, 2U, 3U, 4U, 8U, 64U}) {
    CATCH_INFO("threads " << threads);
    CATCH_CHECK(rt::crc32c_parallel(big.data(), big.size(), threads) == one_pass);
  }
  CATCH_CHECK(rt::crc32c_parallel(big.data(), 1000, 8) == rt::crc32c(big.data(), 1000));
  CATCH_CHECK(rt::crc32c_parallel(nullptr, 0, 8) == 0u);
}

CATCH_TEST_CASE(
    "Keep 1: the checkpoint a run resumed from outlives a newer one it refused when a write fails",
    "[checkpoint]") {
  temp_dir tmp;
  {
    checkpoint_store five(tmp.path.string(), 5);
    five.write(small_checkpoint(4));
    five.write(small_checkpoint(7));  // loads, but (say) its counters do not fit the run: it resumed from 4
  }
  checkpoint_store one(tmp.path.string(), 1);
  const auto resumed = one.path_of(4, 40);
  CATCH_REQUIRE(fs::exists(resumed));
  one.stand_on(resumed);
  fs::create_directory(tmp.path / "ckpt-00000005-0000000050.lwc.tmp");
  CATCH_CHECK_THROWS_AS(one.write(small_checkpoint(5)), lw_error);
  CATCH_CHECK(fs::exists(resumed));
  CATCH_CHECK(one.list() == std::vector<std::string>{resumed});
  // Once a write lands the run stands on it: the next failed write keeps it, not round 4.
  fs::remove(tmp.path / "ckpt-00000005-0000000050.lwc.tmp");
  const auto five_path = one.write(small_checkpoint(5));
  CATCH_CHECK(one.list() == std::vector<std::string>{five_path});
  checkpoint_store(tmp.path.string(), 5).write(small_checkpoint(9));
  fs::create_directory(tmp.path / "ckpt-00000006-0000000060.lwc.tmp");
  CATCH_CHECK_THROWS_AS(one.write(small_checkpoint(6)), lw_error);
  CATCH_CHECK(one.list() == std::vector<std::string>{five_path});
}
