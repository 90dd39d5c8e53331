// Dataset preparation: corpus -> tokenizer -> train.bin / val.bin shards in an output directory, cached by a
// prepared.txt stamp; or pre-tokenized llm.c / nanoGPT shards used as they are.
#include "models/data/dataset_prep.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "config/cluster_config.hpp"
#include "models/data/bpe_tokenizer.hpp"
#include "models/data/corpus.hpp"
#include "models/data/data_fingerprint.hpp"
#include "models/data/file_io.hpp"
#include "models/data/partition.hpp"
#include "models/data/shard.hpp"
#include "models/data/tokenizer.hpp"
#include "runtime/checksum/crc32c.hpp"
#include "runtime/clock/clock.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

namespace fs = std::filesystem;

namespace {

using runtime::seconds_since;

constexpr const char* stamp_header = "longwave-prepared 1";

using log_fn = std::function<void(const std::string&)>;

// Parses "key=value" lines after the header; returns an empty map if the header is wrong.
std::map<std::string, std::string> parse_stamp(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::string_view rest = text;
  bool first = true;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (first) {
      if (line != stamp_header) return {};
      first = false;
      continue;
    }
    size_t eq = line.find('=');
    if (eq != std::string_view::npos) kv[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return kv;
}

bool parse_i64(const std::map<std::string, std::string>& kv, const char* key, int64_t& out) {
  auto it = kv.find(key);
  if (it == kv.end() || it->second.empty()) return false;
  try {
    size_t used = 0;
    out = std::stoll(it->second, &used);
    return used == it->second.size();
  } catch (const std::exception&) {
    return false;
  }
}

/// Why a stamp's input `key` no longer matches, in the words of what the user changed.
std::string input_change(const std::string& key, const std::string& then, const std::string& now) {
  const auto was = [&](const char* what) {
    return then.empty() ? fmt::format("{} is {} (the cache does not say what it was)", what, now)
                        : fmt::format("{} changed from {} to {}", what, then, now);
  };
  if (key == "input") return was("the corpus path");
  if (key == "input_size" || key == "input_mtime")
    return "the corpus file changed (its size or modification time)";
  if (key == "input_fingerprint")
    return then.empty() ? "the cache predates the corpus's fingerprint"
                        : "the corpus file's contents changed (its size and modification time did not)";
  if (key == "tokenizer") return was("data.tokenizer");
  if (key == "vocab") return was("the tokenizer's vocabulary");
  if (key == "val_fraction") return was("data.val_fraction");
  if (key == "documents") return "the cache predates the documents' starts (train.docs)";
  if (key == "documents_file")
    return then.empty()     ? "the cache does not record the corpus's file of document starts (.docs)"
           : then == "none" ? "the corpus now has a file of document starts beside it (.docs)"
           : now == "none"  ? "the corpus's file of document starts (.docs) is gone"
                            : "the corpus's file of document starts (.docs) changed";
  return key + " changed";
}

/// The files of a preparation whose CRC-32C prepared.txt records (key, file name): a cached file changed or
/// damaged after it was written is prepared again, not trained on.
constexpr std::array<std::pair<const char*, const char*>, 4> checked_files = {
    {{"train_crc32c", "train.bin"},
     {"val_crc32c", "val.bin"},
     {"tokenizer_crc32c", "tokenizer.txt"},
     {"docs_crc32c", "train.docs"}}};

/// The CRC-32C of the file at `path` in hex. Throws lw_error(io_error) naming it if it cannot be read.
std::string file_crc32c(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = runtime::crc32c(buf.data(), static_cast<size_t>(in.gcount()), crc);
  }
  if (!in.eof()) throw lw_error(errc::io_error, fmt::format("cannot read '{}' to check it", path.string()));
  return fmt::format("{:08x}", crc);
}

// Fills `out` with the cached result if prepared.txt in dir records exactly `inputs` and the files are
// intact; otherwise returns false and `why` says what differed (empty if there was no stamp at all).
bool load_cached(const fs::path& dir, const std::map<std::string, std::string>& inputs, prepared_dataset& out,
                 std::string& why) {
  std::error_code ec;
  const fs::path stamp = dir / "prepared.txt";
  if (!fs::exists(stamp, ec)) return false;
  std::map<std::string, std::string> kv;
  try {
    kv = parse_stamp(read_file(stamp.string(), "prepared.txt"));
  } catch (const lw_error& e) {
    why = e.what();
    return false;
  }
  // Another corpus path first: every other difference follows from it; the contents' fingerprint last (a
  // size or time that changed says it in the user's words).
  std::vector<std::pair<std::string, std::string>> ordered(inputs.begin(), inputs.end());
  std::stable_partition(ordered.begin(), ordered.end(), [](const auto& kv) { return kv.first == "input"; });
  std::stable_partition(ordered.begin(), ordered.end(),
                        [](const auto& kv) { return kv.first != "input_fingerprint"; });
  for (const auto& [key, value] : ordered) {
    auto it = kv.find(key);
    if (it == kv.end() || it->second != value) {
      why = input_change(key, it == kv.end() ? std::string() : it->second, value);
      return false;
    }
  }
  prepared_dataset d;
  d.train_path = (dir / "train.bin").string();
  d.val_path = (dir / "val.bin").string();
  d.tokenizer_path = (dir / "tokenizer.txt").string();
  d.docs_path = (dir / "train.docs").string();
  if (!parse_i64(kv, "vocab_size", d.vocab_size) || !parse_i64(kv, "n_train_tokens", d.n_train_tokens) ||
      !parse_i64(kv, "n_val_tokens", d.n_val_tokens)) {
    why = "prepared.txt lacks its results";
    return false;
  }
  try {
    if (read_shard_token_count(d.train_path) != d.n_train_tokens ||
        read_shard_token_count(d.val_path) != d.n_val_tokens) {
      why = "shard sizes differ from prepared.txt";
      return false;
    }
    if (load_tokenizer(d.tokenizer_path)->vocab_size() != d.vocab_size) {
      why = "tokenizer.txt differs from prepared.txt";
      return false;
    }
    (void)read_document_starts(d.docs_path);
    for (const auto& [key, file] : checked_files) {
      const auto it = kv.find(key);
      if (it == kv.end()) {
        why = "the cache predates its files' checksums";
        return false;
      }
      if (const auto now = file_crc32c(dir / file); now != it->second) {
        why = fmt::format("{} changed after it was written (CRC-32C {}, prepared.txt says {})", file, now,
                          it->second);
        return false;
      }
    }
  } catch (const lw_error& e) {
    why = e.what();
    return false;
  }
  out = d;
  return true;
}

prepared_dataset use_user_shards(const fs::path& dir, const log_fn& log) {
  prepared_dataset d;
  d.train_path = (dir / "train.bin").string();
  d.val_path = (dir / "val.bin").string();
  std::error_code ec;
  if (!fs::is_regular_file(d.train_path, ec) || !fs::is_regular_file(d.val_path, ec)) {
    throw lw_error(errc::invalid_config,
                   fmt::format("input directory '{}' has no train.bin and val.bin; pass a corpus "
                               "file (.txt or .jsonl) or a directory of llm.c token shards",
                               dir.string()));
  }
  if (fs::exists(dir / "train.docs", ec)) d.docs_path = (dir / "train.docs").string();
  const fs::path tok = dir / "tokenizer.txt";
  if (fs::exists(tok, ec)) {
    d.tokenizer_path = tok.string();
    d.vocab_size = load_tokenizer(d.tokenizer_path)->vocab_size();
    d.n_train_tokens = read_shard_token_count(d.train_path);
    d.n_val_tokens = read_shard_token_count(d.val_path);
  } else {
    // No tokenizer: the vocab must cover every id present, so read the tokens.
    const std::vector<uint16_t> train = read_shard(d.train_path);
    const std::vector<uint16_t> val = read_shard(d.val_path);
    uint16_t max_id = 0;
    for (uint16_t t : train) max_id = std::max(max_id, t);
    for (uint16_t t : val) max_id = std::max(max_id, t);
    d.vocab_size = int64_t{max_id} + 1;
    d.n_train_tokens = static_cast<int64_t>(train.size());
    d.n_val_tokens = static_cast<int64_t>(val.size());
  }
  if (d.n_train_tokens == 0 || d.n_val_tokens == 0) {
    throw lw_error(errc::corrupt_data, fmt::format("token shards in '{}' are empty ({} train, {} val tokens)",
                                                   dir.string(), d.n_train_tokens, d.n_val_tokens));
  }
  if (log) {
    log(fmt::format("data: using pre-tokenized shards in {} ({} train, {} val tokens, vocab {}{})",
                    dir.string(), d.n_train_tokens, d.n_val_tokens, d.vocab_size,
                    d.tokenizer_path.empty() ? " from the largest token id" : ""));
  }
  return d;
}

/// The file whose flock marks a directory being prepared.
constexpr const char* prepare_lock_name = ".prepare.lock";

/// One preparation of a data directory at a time (flock on DIR/.prepare.lock, released with the process):
/// two processes that share it (two starts of one node, a shared data.cache_dir) would otherwise write the
/// same temporary files; the second waits, then finds the first's shards cached. A directory where the lock
/// cannot be made (read-only, holding shards prepared elsewhere) is used without it.
class prepare_lock {
 public:
  prepare_lock(const fs::path& dir, const log_fn& log) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fd_ = ec ? -1 : ::open((dir / prepare_lock_name).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0 || ::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    if (log) log(fmt::format("data: another process is preparing {}; waiting for it", dir.string()));
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  prepare_lock(const prepare_lock&) = delete;
  prepare_lock& operator=(const prepare_lock&) = delete;
  ~prepare_lock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

/// The files a preparation writes in its directory, each replaced when it prepares there.
constexpr std::array<const char*, 5> prepared_files = {"train.bin", "val.bin", "tokenizer.txt", "train.docs",
                                                       "prepared.txt"};

/// True if `dir`'s prepared.txt is one a preparation of ours wrote (its first line is our stamp's).
bool our_stamp(const fs::path& dir) {
  std::ifstream in(dir / "prepared.txt");
  std::string first;
  return in && std::getline(in, first) && first == stamp_header;
}

/// Files in `dir` that no preparation of ours wrote (no stamp of ours, no lock file of one that stopped half
/// way): a user's own shards, or an export's tokenizer, which preparing there would replace.
void refuse_foreign_files(const fs::path& dir) {
  std::error_code ec;
  if (our_stamp(dir) || fs::exists(dir / prepare_lock_name, ec)) return;
  for (const char* name : prepared_files)
    if (fs::exists(dir / name, ec))
      throw lw_error(
          errc::invalid_config,
          fmt::format("{} holds a {} that Longwave did not prepare (no prepared.txt of its own "
                      "beside it): preparing there would replace it; prepare into another "
                      "directory{}",
                      dir.string(), name,
                      std::string_view(name).find(".bin") != std::string_view::npos
                          ? ", or read those shards as they are by naming the directory as the data"
                          : ""));
}

/// The corpus (or its .docs file) is a file the preparation would write over: refused before anything is
/// removed, so the input is never lost.
void refuse_writing_over(const fs::path& dir, const fs::path& file, const char* what) {
  std::error_code ec;
  for (const char* name : prepared_files)
    if (fs::equivalent(dir / name, file, ec))
      throw lw_error(errc::invalid_config,
                     fmt::format("the {} '{}' is the {} a preparation into {} writes: preparing there would "
                                 "replace it; prepare into another directory",
                                 what, file.string(), name, dir.string()));
}

}  // namespace

namespace {

/// What prepared.txt records of a preparation's inputs, after the arguments are checked (the throws of
/// prepare_dataset).
std::map<std::string, std::string> stamp_inputs(const std::string& input_path, config::tokenizer_kind kind,
                                                int64_t bpe_vocab_size, double val_fraction) {
  const bool bpe = kind == config::tokenizer_kind::bpe;
  if (!bpe && kind != config::tokenizer_kind::byte) {
    throw lw_error(errc::invalid_config,
                   fmt::format("unknown tokenizer {} (expected byte or bpe)", static_cast<int>(kind)));
  }
  if (bpe && (bpe_vocab_size < 256 || bpe_vocab_size > 65536)) {
    throw lw_error(errc::invalid_config,
                   fmt::format("bpe vocab size {} is out of range: tokens are uint16, so use "
                               "256..65536",
                               bpe_vocab_size));
  }
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw lw_error(errc::invalid_config, fmt::format("val_fraction {} must be in (0, 1)", val_fraction));
  }
  std::error_code ec;
  const fs::path input = fs::weakly_canonical(fs::absolute(input_path), ec);
  if (ec || !fs::is_regular_file(input, ec)) {
    throw lw_error(errc::io_error,
                   fmt::format("corpus '{}' does not exist or is not a regular file", input_path));
  }
  const auto input_size = static_cast<int64_t>(fs::file_size(input, ec));
  const auto input_mtime = fs::last_write_time(input, ec).time_since_epoch().count();
  if (ec)
    throw lw_error(errc::io_error, fmt::format("cannot stat corpus '{}': {}", input_path, ec.message()));

  // Document starts given beside the corpus (CORPUS.docs, byte offsets) win over blank lines.
  const std::string sidecar = input.string() + ".docs";
  std::string sidecar_stamp = "none";
  if (fs::is_regular_file(sidecar, ec)) {
    sidecar_stamp = fmt::format("{}:{}", fs::file_size(sidecar, ec),
                                fs::last_write_time(sidecar, ec).time_since_epoch().count());
  }
  return {
      {"input", input.string()},
      {"input_size", std::to_string(input_size)},
      {"input_mtime", std::to_string(input_mtime)},
      // An edit that kept the size and the time (a probe: upper-cased in place, touched back) is seen too.
      {"input_fingerprint", std::to_string(data_fingerprint(input.string()))},
      {"tokenizer", config::to_string(kind)},
      {"vocab", std::to_string(bpe ? bpe_vocab_size : 256)},
      {"val_fraction", fmt::format("{}", val_fraction)},
      {"documents", "1"},  // train.docs is written (older caches lack it)
      {"documents_file", sidecar_stamp},
  };
}

}  // namespace

int64_t config_vocab(const config::train_config& cfg) {
  if (cfg.model.vocab_size > 0) return cfg.model.vocab_size;
  try {
    return data_vocab(cfg.data.path, cfg.data.tokenizer, cfg.data.bpe_vocab_size);
  } catch (const std::exception&) {
    return data_vocab("", cfg.data.tokenizer, cfg.data.bpe_vocab_size);
  }
}

int64_t data_vocab(const std::string& input_path, config::tokenizer_kind kind, int64_t bpe_vocab_size) {
  std::error_code ec;
  if (fs::is_directory(input_path, ec)) return use_user_shards(input_path, {}).vocab_size;
  return kind == config::tokenizer_kind::bpe ? bpe_vocab_size : 256;
}

std::optional<prepared_dataset> find_prepared(const std::string& input_path, config::tokenizer_kind kind,
                                              int64_t bpe_vocab_size, double val_fraction,
                                              const std::string& dir, std::string& why) {
  std::error_code ec;
  if (fs::is_directory(input_path, ec)) return use_user_shards(input_path, {});
  const auto inputs = stamp_inputs(input_path, kind, bpe_vocab_size, val_fraction);
  prepared_dataset result;
  if (!fs::is_directory(dir, ec)) {
    why = "it does not exist";
    return std::nullopt;
  }
  if (load_cached(dir, inputs, result, why)) return result;
  if (why.empty()) why = "it holds no prepared.txt";
  return std::nullopt;
}

std::string prepared_from(const std::string& dir) {
  std::error_code ec;
  const fs::path stamp = fs::path(dir) / "prepared.txt";
  if (!fs::is_regular_file(stamp, ec)) return {};
  try {
    const auto kv = parse_stamp(read_file(stamp.string(), "prepared.txt"));
    const auto it = kv.find("input");
    return it == kv.end() ? std::string() : it->second;
  } catch (const lw_error&) {
    return {};
  }
}

std::string data_cache_key(const std::string& input_path, config::tokenizer_kind kind, int64_t bpe_vocab_size,
                           double val_fraction) {
  std::error_code ec;
  const std::string input = fs::weakly_canonical(fs::absolute(input_path), ec).string();
  const std::string text =
      fmt::format("{}\n{}\n{}\n{}", input, config::to_string(kind),
                  kind == config::tokenizer_kind::bpe ? bpe_vocab_size : 256, val_fraction);
  return fmt::format("{:016x}", config::cluster_id_of(text));  // the project's one 64-bit FNV-1a
}

namespace {

/// The text of corpus `path` (`input_path` as the user named it), refused when it is binary data; warns when
/// much of it is not UTF-8.
std::string read_text_corpus(const std::string& path, const std::string& input_path,
                             const std::function<void(const std::string&)>& log) {
  std::string text = read_corpus(path, input_path);
  const text_profile profile = profile_text(text);
  check_is_text(input_path, profile);
  if (log) log(fmt::format("data: read corpus {} ({} bytes of text)", path, text.size()));
  if (log && profile.invalid_utf8 * 100 > profile.bytes) {
    log(fmt::format(
        "data: warning: {:.1f} % of the bytes of corpus {} are not UTF-8 (a legacy encoding such "
        "as Latin-1?); the tokenizer takes them as they are",
        100.0 * static_cast<double>(profile.invalid_utf8) / static_cast<double>(profile.bytes), input_path));
  }
  return text;
}

/// How many of a corpus's n tokens are validation tokens: its last val_fraction, at least 1 and leaving 1.
int64_t val_count(const std::string& input_path, int64_t n, size_t n_bytes, double val_fraction,
                  std::chrono::steady_clock::time_point encode_began,
                  const std::function<void(const std::string&)>& log) {
  if (n < 2) {
    throw lw_error(
        errc::corrupt_data,
        fmt::format("corpus '{}' is too small: {} tokens cannot be split into train and val", input_path, n));
  }
  if (log) {
    log(fmt::format("data: tokenized {} bytes into {} tokens ({:.2f} bytes/token) in {:.1f} s", n_bytes, n,
                    static_cast<double>(n_bytes) / static_cast<double>(n), seconds_since(encode_began)));
  }
  return std::clamp<int64_t>(std::llround(static_cast<double>(n) * val_fraction), 1, n - 1);
}

}  // namespace

std::vector<uint16_t> validation_tokens(const std::string& input_path, const tokenizer& tok,
                                        double val_fraction,
                                        const std::function<void(const std::string&)>& log) {
  std::string text = read_text_corpus(input_path, input_path, log);
  const auto began = std::chrono::steady_clock::now();
  std::vector<uint16_t> tokens = tok.encode(text);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t n_val = val_count(input_path, n, text.size(), val_fraction, began, log);
  return std::vector<uint16_t>(tokens.end() - n_val, tokens.end());  // not the whole corpus's capacity
}

prepared_dataset prepare_dataset(const std::string& input_path, config::tokenizer_kind kind,
                                 int64_t bpe_vocab_size, double val_fraction, const std::string& out_dir,
                                 std::function<void(const std::string&)> log) {
  std::error_code ec;
  if (fs::is_directory(input_path, ec)) return use_user_shards(input_path, log);
  const auto inputs = stamp_inputs(input_path, kind, bpe_vocab_size, val_fraction);
  const bool bpe = kind == config::tokenizer_kind::bpe;
  const fs::path input(inputs.at("input"));
  const std::string sidecar = input.string() + ".docs";
  const bool has_sidecar = inputs.at("documents_file") != "none";

  const fs::path dir(out_dir);
  refuse_writing_over(dir, input, "corpus");
  if (has_sidecar) refuse_writing_over(dir, sidecar, "corpus's document file");
  refuse_foreign_files(dir);
  const prepare_lock lock(dir, log);
  prepared_dataset result;
  std::string why;
  if (load_cached(dir, inputs, result, why)) {
    if (log) {
      log(fmt::format("data: using cached shards in {} ({} train, {} val tokens, vocab {})", dir.string(),
                      result.n_train_tokens, result.n_val_tokens, result.vocab_size));
    }
    return result;
  }
  if (!why.empty() && log) log(fmt::format("data: re-preparing {}: {}", dir.string(), why));

  fs::create_directories(dir, ec);
  if (ec) throw lw_error(errc::io_error, fmt::format("cannot create '{}': {}", out_dir, ec.message()));
  fs::remove(dir / "prepared.txt", ec);  // a half-finished preparation must never look cached

  auto t0 = std::chrono::steady_clock::now();
  std::string text = read_text_corpus(input.string(), input_path, log);

  std::unique_ptr<tokenizer> tok;
  if (bpe) {
    if (log) log(fmt::format("data: training BPE tokenizer to vocab {}", bpe_vocab_size));
    auto t_train = std::chrono::steady_clock::now();
    int64_t last_decile = 0;
    auto progress = [&](int64_t done, int64_t total) {
      const int64_t decile = total > 0 ? done * 10 / total : 10;
      if (decile > last_decile && log) {
        log(fmt::format("data: BPE merges {}% ({}/{})", decile * 10, done, total));
      }
      last_decile = std::max(last_decile, decile);
    };
    tok = std::make_unique<bpe_tokenizer>(bpe_tokenizer::train(text, bpe_vocab_size, progress));
    if (log) {
      log(fmt::format("data: BPE trained in {:.1f} s: vocab {}{}", seconds_since(t_train), tok->vocab_size(),
                      tok->vocab_size() < bpe_vocab_size ? " (the corpus ran out of pairs to merge)" : ""));
    }
  } else {
    tok = make_byte_tokenizer();
  }

  auto t_encode = std::chrono::steady_clock::now();
  std::vector<uint16_t> train = tok->encode(text);
  std::vector<int64_t> token_bytes(static_cast<size_t>(tok->vocab_size()));
  for (size_t id = 0; id < token_bytes.size(); ++id)
    token_bytes[id] = static_cast<int64_t>(tok->decode({static_cast<uint16_t>(id)}).size());
  std::vector<int64_t> doc_starts;
  if (has_sidecar) {
    const auto bytes = read_document_bytes(sidecar);
    // Offsets of another corpus (or of this one before an edit) would split it at the wrong places.
    if (const auto past = std::upper_bound(bytes.begin(), bytes.end(), static_cast<int64_t>(text.size()));
        past != bytes.end())
      throw lw_error(
          errc::corrupt_data,
          fmt::format("{}:{}: document offset {} is past the end of corpus {} ({} bytes): is it the "
                      "document file of another corpus, or of this one before an edit?",
                      sidecar, past - bytes.begin() + 2, *past, input_path, text.size()));
    doc_starts = token_starts(bytes, train, token_bytes);
  } else {
    doc_starts = document_starts(text, train, token_bytes);
  }
  const auto n_bytes = text.size();
  std::string().swap(text);
  const auto n = static_cast<int64_t>(train.size());
  const int64_t n_val = val_count(input_path, n, n_bytes, val_fraction, t_encode, log);
  std::vector<uint16_t> val(train.end() - n_val, train.end());
  train.resize(static_cast<size_t>(n - n_val));

  result.train_path = (dir / "train.bin").string();
  result.val_path = (dir / "val.bin").string();
  result.tokenizer_path = (dir / "tokenizer.txt").string();
  result.docs_path = (dir / "train.docs").string();
  result.vocab_size = tok->vocab_size();
  result.n_train_tokens = n - n_val;
  result.n_val_tokens = n_val;
  write_shard(result.train_path, train);
  write_shard(result.val_path, val);
  tok->save(result.tokenizer_path);
  write_document_starts(result.docs_path, doc_starts, result.n_train_tokens);

  std::string stamp = std::string(stamp_header) + "\n";
  for (const auto& [key, value] : inputs) stamp += fmt::format("{}={}\n", key, value);
  stamp += fmt::format("vocab_size={}\nn_train_tokens={}\nn_val_tokens={}\n", result.vocab_size,
                       result.n_train_tokens, result.n_val_tokens);
  for (const auto& [key, file] : checked_files) stamp += fmt::format("{}={}\n", key, file_crc32c(dir / file));
  write_file_atomic((dir / "prepared.txt").string(), {stamp});
  if (log) {
    log(fmt::format("data: wrote {} train and {} val tokens to {} in {:.1f} s", result.n_train_tokens,
                    result.n_val_tokens, dir.string(), seconds_since(t0)));
  }
  return result;
}

bool remove_unless_preparing(const std::string& dir) {
  const int fd = ::open((fs::path(dir) / prepare_lock_name).c_str(), O_RDWR | O_CLOEXEC);
  const bool busy = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  std::error_code ec;
  const bool gone = !busy && fs::remove_all(dir, ec) != static_cast<std::uintmax_t>(-1) && !ec;
  if (fd >= 0) ::close(fd);
  return gone;
}

}  // namespace longwave::models::data
