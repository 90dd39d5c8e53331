// Byte-level BPE (GPT-2 style, without a regex dependency): pre-splitting, training with incremental pair
// counts, encoding by merge rank, exact decoding, and the "longwave-bpe 1" text file format.
#include "models/data/bpe_tokenizer.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <charconv>
#include <climits>
#include <queue>

#include "models/data/file_io.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::models::data {

namespace {

enum class byte_class { space, letter, digit, other };

byte_class classify(char ch) {
  auto c = static_cast<unsigned char>(ch);
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return byte_class::space;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return byte_class::letter;
  if (c >= '0' && c <= '9') return byte_class::digit;
  return byte_class::other;
}

// Calls f(chunk) for each pre-split chunk of text, in order; see bpe_tokenizer::pre_split.
template <typename F>
void for_each_chunk(std::string_view text, F&& f) {
  const size_t n = text.size();
  auto emit = [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; b += bpe_tokenizer::max_chunk_bytes) {
      f(text.substr(b, std::min(bpe_tokenizer::max_chunk_bytes, end - b)));
    }
  };
  auto run_end = [&](size_t j, byte_class c) {
    while (j < n && classify(text[j]) == c) ++j;
    return j;
  };
  size_t i = 0;
  while (i < n) {
    byte_class c = classify(text[i]);
    if (text[i] == ' ' && i + 1 < n && classify(text[i + 1]) != byte_class::space) {
      size_t j = run_end(i + 1, classify(text[i + 1]));  // " word", " 123", " ..."
      emit(i, j);
      i = j;
    } else if (c == byte_class::space) {
      size_t j = run_end(i, c);
      // Leave a final ' ' before a word to that word, as GPT-2's \s+(?!\S) does.
      if (j < n && j - i > 1 && text[j - 1] == ' ') --j;
      emit(i, j);
      i = j;
    } else {
      size_t j = run_end(i, c);
      emit(i, j);
      i = j;
    }
  }
}

uint32_t pair_key(uint16_t a, uint16_t b) {
  return (static_cast<uint32_t>(a) << 16) | b;
}

struct heap_entry {
  int64_t count;
  uint32_t key;
};

// Max-heap order: higher count first, then the smaller (left, right) pair.
struct heap_less {
  bool operator()(const heap_entry& x, const heap_entry& y) const {
    return x.count < y.count || (x.count == y.count && x.key > y.key);
  }
};

std::string_view strip_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

template <typename T>
bool parse_int(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

std::vector<std::string_view> bpe_tokenizer::pre_split(std::string_view text) {
  std::vector<std::string_view> chunks;
  for_each_chunk(text, [&](std::string_view chunk) { chunks.push_back(chunk); });
  return chunks;
}

bpe_tokenizer::bpe_tokenizer(std::vector<merge> merges) : merges_(std::move(merges)) {
  if (merges_.size() > 65536 - 256) {
    throw lw_error(
        errc::corrupt_data,
        fmt::format("bpe tokenizer: {} merges exceed the 65280 that uint16 tokens allow", merges_.size()));
  }
  pieces_.reserve(256 + merges_.size());
  for (int b = 0; b < 256; ++b) pieces_.emplace_back(1, static_cast<char>(b));
  ranks_.reserve(merges_.size());
  for (size_t r = 0; r < merges_.size(); ++r) {
    auto [a, b] = merges_[r];
    if (a >= pieces_.size() || b >= pieces_.size()) {
      throw lw_error(
          errc::corrupt_data,
          fmt::format("bpe tokenizer: merge {} ({} {}) uses an id not defined before it", r, a, b));
    }
    if (!ranks_.emplace(pair_key(a, b), static_cast<int32_t>(r)).second) {
      throw lw_error(errc::corrupt_data,
                     fmt::format("bpe tokenizer: merge {} ({} {}) is a duplicate", r, a, b));
    }
    pieces_.push_back(pieces_[a] + pieces_[b]);
  }
}

bpe_tokenizer bpe_tokenizer::train(std::string_view text, int64_t vocab_size, progress_fn progress) {
  if (vocab_size < 256 || vocab_size > 65536) {
    throw lw_error(
        errc::invalid_config,
        fmt::format("bpe vocab size {} is out of range: tokens are uint16, so use 256..65536", vocab_size));
  }
  const int64_t n_wanted = vocab_size - 256;

  // Distinct chunks ("words") with their frequencies; merges never cross a chunk boundary.
  std::unordered_map<std::string_view, int64_t> chunk_freq;
  for_each_chunk(text, [&](std::string_view chunk) { ++chunk_freq[chunk]; });
  std::vector<std::vector<uint16_t>> words;
  std::vector<int64_t> word_freq;
  words.reserve(chunk_freq.size());
  word_freq.reserve(chunk_freq.size());
  for (const auto& [chunk, freq] : chunk_freq) {
    std::vector<uint16_t> symbols(chunk.size());
    for (size_t i = 0; i < chunk.size(); ++i) symbols[i] = static_cast<unsigned char>(chunk[i]);
    words.push_back(std::move(symbols));
    word_freq.push_back(freq);
  }
  chunk_freq.clear();

  // Pair counts, the words each pair may occur in (a superset: entries go stale), and a lazy max-heap whose
  // entries are valid only while they match the current count.
  std::unordered_map<uint32_t, int64_t> pair_count;
  std::unordered_map<uint32_t, std::vector<int32_t>> pair_words;
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint32_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += word_freq[w];
      pair_words[k].push_back(static_cast<int32_t>(w));
    }
  }
  std::priority_queue<heap_entry, std::vector<heap_entry>, heap_less> heap;
  for (const auto& [k, count] : pair_count) heap.push({count, k});

  std::vector<merge> merges;
  merges.reserve(static_cast<size_t>(n_wanted));
  std::unordered_map<uint32_t, int64_t> delta;
  std::vector<uint16_t> merged;
  while (static_cast<int64_t>(merges.size()) < n_wanted && !heap.empty()) {
    heap_entry top = heap.top();
    heap.pop();
    auto count_it = pair_count.find(top.key);
    if (count_it == pair_count.end() || count_it->second != top.count) continue;  // stale entry
    const auto a = static_cast<uint16_t>(top.key >> 16);
    const auto b = static_cast<uint16_t>(top.key & 0xFFFF);
    const auto c = static_cast<uint16_t>(256 + merges.size());
    merges.emplace_back(a, b);

    std::vector<int32_t> affected;
    if (auto it = pair_words.find(top.key); it != pair_words.end()) {
      affected = std::move(it->second);
      pair_words.erase(it);
    }
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());

    delta.clear();
    for (int32_t w : affected) {
      auto& s = words[static_cast<size_t>(w)];
      merged.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(c);
          i += 2;
        } else {
          merged.push_back(s[i++]);
        }
      }
      if (merged.size() == s.size()) continue;  // stale: the pair no longer occurs here
      const int64_t f = word_freq[static_cast<size_t>(w)];
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= f;
      // Only pairs containing the new id can gain occurrences, so only they need this word listed.
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        uint32_t k = pair_key(merged[i], merged[i + 1]);
        delta[k] += f;
        if (merged[i] == c || merged[i + 1] == c) pair_words[k].push_back(w);
      }
      s.swap(merged);
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      auto it = pair_count.try_emplace(k, 0).first;
      it->second += d;
      if (it->second <= 0) {
        pair_count.erase(it);
      } else {
        heap.push({it->second, k});
      }
    }
    if (progress) progress(static_cast<int64_t>(merges.size()), n_wanted);
  }
  return bpe_tokenizer(std::move(merges));
}

void bpe_tokenizer::encode_chunk(std::string_view chunk, std::vector<uint16_t>& out) const {
  std::vector<uint16_t> s(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) s[i] = static_cast<unsigned char>(chunk[i]);
  while (s.size() > 1) {
    int32_t best = INT32_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = ranks_.find(pair_key(s[i], s[i + 1]));
      if (it != ranks_.end() && it->second < best) best = it->second;
    }
    if (best == INT32_MAX) break;
    const auto [a, b] = merges_[static_cast<size_t>(best)];
    const auto c = static_cast<uint16_t>(256 + best);
    size_t j = 0;
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        s[j++] = c;
        i += 2;
      } else {
        s[j++] = s[i++];
      }
    }
    s.resize(j);
  }
  out.insert(out.end(), s.begin(), s.end());
}

std::vector<uint16_t> bpe_tokenizer::encode(std::string_view text) const {
  constexpr size_t max_cache_entries = size_t{1} << 20;  // bounds memory on huge, diverse inputs
  std::vector<uint16_t> out;
  out.reserve(text.size() / 3 + 16);
  std::unordered_map<std::string_view, std::vector<uint16_t>> cache;  // per call: encode stays thread-safe
  std::vector<uint16_t> tokens;
  for_each_chunk(text, [&](std::string_view chunk) {
    if (chunk.size() == 1) {
      out.push_back(static_cast<unsigned char>(chunk[0]));
      return;
    }
    if (auto it = cache.find(chunk); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    tokens.clear();
    encode_chunk(chunk, tokens);
    out.insert(out.end(), tokens.begin(), tokens.end());
    if (cache.size() >= max_cache_entries) cache.clear();
    cache.emplace(chunk, tokens);
  });
  return out;
}

std::string bpe_tokenizer::decode(const std::vector<uint16_t>& tokens) const {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= pieces_.size()) {
      throw lw_error(errc::corrupt_data,
                     fmt::format("bpe tokenizer: token id {} at position {} is out of range "
                                 "(vocab {})",
                                 tokens[i], i, pieces_.size()));
    }
    out += pieces_[tokens[i]];
  }
  return out;
}

std::string bpe_tokenizer::text() const {
  std::string text = fmt::format("{}\n{}\n", header, vocab_size());
  for (auto [a, b] : merges_) text += fmt::format("{} {}\n", a, b);
  return text;
}

void bpe_tokenizer::save(const std::string& path) const {
  write_file_atomic(path, {text()});
}

bpe_tokenizer bpe_tokenizer::load(const std::string& path) {
  return parse(read_file(path, "tokenizer"), path);
}

bpe_tokenizer bpe_tokenizer::parse(std::string_view text, const std::string& path) {
  auto fail = [&](int64_t line_no, const std::string& what) -> lw_error {
    return lw_error(errc::corrupt_data, fmt::format("tokenizer {}:{}: {}", path, line_no, what));
  };
  std::vector<merge> merges;
  std::unordered_map<uint32_t, int64_t> first_line;  // pair -> line it was defined on
  int64_t vocab = -1;
  int64_t line_no = 0;
  int64_t blank_line = 0;  // first blank line seen; only allowed at the end of the file
  std::string_view rest = text;
  while (!rest.empty()) {
    ++line_no;
    size_t nl = rest.find('\n');
    std::string_view line = strip_cr(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (line_no == 1) {
      if (line != header) throw fail(1, fmt::format("expected '{}'", header));
      continue;
    }
    if (line_no == 2) {
      if (!parse_int(line, vocab) || vocab < 256 || vocab > 65536) {
        throw fail(
            2, fmt::format("bad vocab size '{}' (expected an integer in 256..65536)", line.substr(0, 40)));
      }
      continue;
    }
    if (line.empty()) {
      if (blank_line == 0) blank_line = line_no;
      continue;
    }
    if (blank_line != 0) throw fail(blank_line, "blank line inside the merge list");
    const size_t sp = line.find(' ');
    uint32_t a = 0;
    uint32_t b = 0;
    if (sp == std::string_view::npos || !parse_int(line.substr(0, sp), a) ||
        !parse_int(line.substr(sp + 1), b)) {
      throw fail(line_no, fmt::format("expected a merge 'left right' but found '{}'", line.substr(0, 40)));
    }
    const uint32_t defined = 256 + static_cast<uint32_t>(merges.size());
    if (a >= defined || b >= defined) {
      throw fail(line_no, fmt::format("merge '{} {}' uses an id not defined before it (ids so far: 0..{})", a,
                                      b, defined - 1));
    }
    if (static_cast<int64_t>(defined) >= vocab) {
      throw fail(line_no, fmt::format("more merges than vocab size {} allows ({})", vocab, vocab - 256));
    }
    auto [it, inserted] =
        first_line.emplace(pair_key(static_cast<uint16_t>(a), static_cast<uint16_t>(b)), line_no);
    if (!inserted)
      throw fail(line_no, fmt::format("duplicate merge '{} {}' (first on line {})", a, b, it->second));
    merges.emplace_back(static_cast<uint16_t>(a), static_cast<uint16_t>(b));
  }
  if (line_no < 2) throw fail(line_no + 1, "file ends before the vocab size line");
  if (static_cast<int64_t>(merges.size()) != vocab - 256) {
    throw fail(line_no, fmt::format("vocab size {} needs {} merges but the file has {}", vocab, vocab - 256,
                                    merges.size()));
  }
  return bpe_tokenizer(std::move(merges));
}

}  // namespace longwave::models::data
