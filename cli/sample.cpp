// `longwave sample`: the model of a checkpoint (cli/checkpoint_model.hpp) writes text after a prompt.
#include "cli/sample.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "cli/checkpoint_model.hpp"
#include "config/config_loader.hpp"
#include "models/data/tokenizer.hpp"
#include "models/decoder.hpp"
#include "models/gpt.hpp"
#include "runtime/errors/errors.hpp"

namespace longwave::cli {

namespace {

/// The run's tokenizer; a byte-level run that left no file is read with the byte tokenizer.
std::unique_ptr<models::data::tokenizer> tokenizer_of(const checkpoint_model& m, const std::string& path) {
  if (const auto file = find_tokenizer(m, path, "sample"))
    return models::data::parse_tokenizer(file->text, file->from);
  // Pre-tokenized shards (data.path a directory; a vocabulary taken from their largest id) carry ids of a
  // tokenizer Longwave does not know: bytes would print noise.
  if (m.cfg.data.tokenizer == config::tokenizer_kind::byte) {
    std::error_code ec;
    const bool shards = !m.cfg.data.path.empty() && std::filesystem::is_directory(m.cfg.data.path, ec);
    if (shards || (m.cfg.model.vocab_size == 0 && m.spec.vocab_size != 256))
      throw lw_error(
          errc::invalid_config,
          fmt::format("the run read pre-tokenized shards ({}, a vocabulary of {}), whose tokenizer "
                      "Longwave does not know; sample writes text with the run's own tokenizer.txt "
                      "or with bytes",
                      m.cfg.data.path, m.spec.vocab_size));
    if (m.spec.vocab_size >= 256) return models::data::make_byte_tokenizer();
  }
  throw lw_error(
      errc::invalid_config,
      fmt::format("no tokenizer of this run found (looked for tokenizer.txt in the data folder beside "
                  "{}, in its stored data folder and in data.path); sample needs the run's own",
                  path));
}

/// The next token after `logits` (one position's): the likeliest at temperature 0, else a draw from the
/// softmax of logits / temperature over the top_k likeliest. The draw is our own (std::mt19937_64 over
/// doubles), so one seed gives one text on every LibTorch.
int64_t next_token(const at::Tensor& logits, const sample_options& o, std::mt19937_64& rng) {
  const auto v = logits.to(at::kDouble).contiguous();
  const double* x = v.data_ptr<double>();
  const int64_t n = v.numel();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  if (o.temperature == 0) return order[0];
  std::vector<double> weight(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i)
    total += weight[static_cast<size_t>(i)] =
        std::exp((x[order[static_cast<size_t>(i)]] - x[order[0]]) / o.temperature);
  double draw = std::uniform_real_distribution<double>(0, total)(rng);
  for (int64_t i = 0; i < k; ++i)
    if ((draw -= weight[static_cast<size_t>(i)]) < 0) return order[static_cast<size_t>(i)];
  return order[static_cast<size_t>(k - 1)];
}

/// The reader of standard output closed it (`| head`): it has all the text it wants.
struct reader_gone {};

/// Writes to stdout; a failed write (a full disk, a closed stdout) throws, naming why.
void write_text(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0) return;
  if (errno == EPIPE) throw reader_gone{};
  throw lw_error(errc::io_error,
                 fmt::format("cannot write the text to standard output: {}", std::strerror(errno)));
}

}  // namespace

int sample_checkpoint(const sample_options& o) {
  std::error_code ec;
  if (!std::filesystem::exists(o.checkpoint, ec)) {
    std::fprintf(stderr, "sample: checkpoint '%s': no such file or directory\n", o.checkpoint.c_str());
    return 2;
  }
  checkpoint_model m;
  std::unique_ptr<models::data::tokenizer> tok;
  try {
    m = load_checkpoint_model(o.checkpoint);
    tok = tokenizer_of(m, o.checkpoint);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "sample: checkpoint '%s': %s\n", o.checkpoint.c_str(), e.what());
    return 2;
  } catch (const lw_error& e) {
    std::fprintf(stderr, "sample: %s: %s\n", to_string(e.code()), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sample: checkpoint '%s': %s\n", o.checkpoint.c_str(), describe(e).c_str());
    return 1;
  }
  std::vector<uint16_t> ids = tok->encode(o.prompt.empty() ? std::string("\n") : o.prompt);
  if (ids.empty()) ids = tok->encode("\n");
  std::fprintf(stderr, "sample: checkpoint %s: model %s, %s tokenizer; %ld tokens", m.label.c_str(),
               models::model_label(m.spec).c_str(), tok->kind().c_str(), o.tokens);
  if (o.temperature == 0)
    std::fprintf(stderr, ", the likeliest each time\n");
  else
    std::fprintf(stderr, " at temperature %g, top-k %ld, seed %lu\n", o.temperature, o.top_k, o.seed);
  if (static_cast<int64_t>(ids.size()) > m.spec.seq_len)
    std::fprintf(stderr,
                 "sample: the prompt's %zu tokens are more than the model's context; it sees the last %ld\n",
                 ids.size(), m.spec.seq_len);
  try {
    auto flat = at::empty({static_cast<int64_t>(m.theta.size())}, at::kFloat);
    std::memcpy(flat.data_ptr<float>(), m.theta.data(), m.theta.size() * sizeof(float));
    models::gpt model(m.spec, flat);
    std::mt19937_64 rng(o.seed);
    const int64_t vocab = std::min(tok->vocab_size(), m.spec.vocab_size);  // ids the tokenizer can write
    write_text(o.prompt);
    const auto t0 = std::chrono::steady_clock::now();
    models::decoder dec(model, std::vector<int64_t>(ids.begin(), ids.end()));
    for (int64_t i = 0; i < o.tokens; ++i) {
      const int64_t next = next_token(dec.next_logits().slice(0, 0, vocab), o, rng);
      write_text(tok->decode({static_cast<uint16_t>(next)}));
      if (i + 1 < o.tokens) dec.push(next);
    }
    write_text("\n");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "sample: %ld tokens in %.1f s (%.0f tokens/s)\n", o.tokens, s,
                 s > 0 ? static_cast<double>(o.tokens) / s : 0.0);
    return 0;
  } catch (const reader_gone&) {
    // As a tool killed by SIGPIPE would end, without a word (SIGPIPE is ignored: commands.cpp). The unwritten
    // rest goes nowhere, so the exit's check of stdout finds nothing amiss.
    if (!std::freopen("/dev/null", "w", stdout)) return 1;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sample: %s\n", describe(e).c_str());
    return 1;
  }
}

}  // namespace longwave::cli
