// libFuzzer target: the files the data pipeline reads (models/data/): a .jsonl corpus, a plain-text corpus
// and its text profile, an llm.c .bin token shard, and a tokenizer file. The first input byte picks the
// reader; the rest is the file, written to one temporary file of this process. Each reader throws
// lw_error(corrupt_data) and nothing else; a tokenizer that loads must round-trip a text exactly.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "fuzz/fuzz_seeds.hpp"
#include "models/data/bpe_tokenizer.hpp"
#include "models/data/corpus.hpp"
#include "models/data/shard.hpp"
#include "models/data/tokenizer.hpp"
#include "runtime/errors/errors.hpp"

using namespace longwave::models::data;

namespace {

enum reader : uint8_t { jsonl = 0, text = 1, shard = 2, tokenizer_file = 3, n_readers = 4 };
const char* const suffix[n_readers] = {".jsonl", ".txt", ".bin", ".tok"};
std::string scratch[n_readers];  // this process's input file per reader

std::filesystem::path scratch_dir() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

void seed(const std::string& dir, const std::string& name, reader r, const std::string& file) {
  longwave::fuzz::write_seed(dir, name, static_cast<char>(r) + file);
}

void write_seeds(const std::string& dir) {
  const std::string sample =
      "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void; "
      "and darkness was upon the face of the deep. 123 \xc3\xa9t\xc3\xa9\n";
  seed(dir, "jsonl", jsonl,
       "{\"text\": \"In the beginning\\nGod \\u00e9 \\ud83d\\ude00\", \"id\": 1}\n\n"
       "{\"id\": 2.5e3, \"meta\": {\"a\": [1, null, true]}, \"text\": \"second \\\"doc\\\"\"}\n");
  seed(dir, "text", text, sample);
  const auto tmp = scratch_dir() / ("lw_fuzz_seeds_" + std::to_string(getpid()));
  std::filesystem::create_directories(tmp);
  write_shard((tmp / "s.bin").string(), {1, 2, 3, 65535, 0, 256});
  seed(dir, "shard", shard, longwave::fuzz::read_file((tmp / "s.bin").string()));
  bpe_tokenizer::train(sample, 300).save((tmp / "bpe.tok").string());
  seed(dir, "tokenizer_bpe", tokenizer_file, longwave::fuzz::read_file((tmp / "bpe.tok").string()));
  make_byte_tokenizer()->save((tmp / "byte.tok").string());
  seed(dir, "tokenizer_byte", tokenizer_file, longwave::fuzz::read_file((tmp / "byte.tok").string()));
  std::filesystem::remove_all(tmp);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  longwave::fuzz::seeds_mode(write_seeds);
  for (int r = 0; r < n_readers; ++r)
    scratch[r] = (scratch_dir() / ("lw_fuzz_corpus_" + std::to_string(getpid()) + suffix[r])).string();
  std::atexit([] {
    for (auto& s : scratch) std::filesystem::remove(s);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || data[0] >= n_readers) return 0;
  const auto r = static_cast<reader>(data[0]);
  const std::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  {
    std::ofstream f(scratch[r], std::ios::binary | std::ios::trunc);
    f.write(file.data(), static_cast<std::streamsize>(file.size()));
  }
  try {
    switch (r) {
      case jsonl: (void)profile_text(read_corpus(scratch[r])); break;
      case text: {
        const auto bytes = read_corpus(scratch[r]);
        if (bytes != file) longwave::fuzz::fail("a text corpus does not read back as its bytes");
        check_is_text(scratch[r], profile_text(bytes));
        break;
      }
      case shard: {
        const auto count = read_shard_token_count(scratch[r]);
        if (static_cast<int64_t>(read_shard(scratch[r]).size()) != count)
          longwave::fuzz::fail("read_shard and read_shard_token_count disagree");
        break;
      }
      case tokenizer_file: {
        const auto tok = load_tokenizer(scratch[r]);
        const std::string probe = "The quick brown fox, 123 jumps \xc3\xa9\n\x01";
        if (tok->decode(tok->encode(probe)) != probe) longwave::fuzz::fail("a tokenizer does not round-trip");
        break;
      }
      case n_readers: break;
    }
  } catch (const longwave::lw_error& e) {
    if (e.code() != longwave::errc::corrupt_data) longwave::fuzz::fail("not a corrupt_data error");
  }
  return 0;
}
