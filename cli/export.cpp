// `longwave export`: loads theta_global and the resolved config of a checkpoint as `eval` does, and writes
// them as a Hugging Face LlamaForCausalLM directory.
#include "cli/export.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "actors/run_files.hpp"
#include "cli/checkpoint_model.hpp"
#include "config/config_loader.hpp"
#include "models/data/file_io.hpp"
#include "models/data/tokenizer.hpp"
#include "models/gpt.hpp"
#include "models/llama_export.hpp"
#include "models/model_spec.hpp"
#include "models/safetensors.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"
#include "runtime/errors/errors.hpp"
#include "runtime/files/directory.hpp"
#include "runtime/log/log.hpp"

namespace fs = std::filesystem;

namespace longwave::cli {

namespace {

/// Parses "1,2,3" into token ids below vocab, at most seq_len of them; throws lw_error(invalid_config).
std::vector<int64_t> parse_ids(const std::string& text, const models::model_spec& s) {
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v >= s.vocab_size)
      throw lw_error(errc::invalid_config,
                     fmt::format("--logits-for: '{}' is not a token id below {}", item, s.vocab_size));
    ids.push_back(v);
    pos = comma + 1;
  }
  if (static_cast<int64_t>(ids.size()) > s.seq_len)
    throw lw_error(errc::invalid_config,
                   fmt::format("--logits-for: {} tokens, the model's context is {}", ids.size(), s.seq_len));
  return ids;
}

/// Our model's logits of one sequence, as text: "T V", then T lines of V values.
std::string logits_text(const checkpoint_model& m, const std::vector<int64_t>& ids) {
  auto flat = at::empty({static_cast<int64_t>(m.theta.size())}, at::kFloat);
  std::memcpy(flat.data_ptr<float>(), m.theta.data(), m.theta.size() * sizeof(float));
  models::gpt model(m.spec, flat);
  auto idx = at::tensor(ids, at::kLong).view({1, static_cast<int64_t>(ids.size())});
  const auto logits = model.logits(idx).contiguous();
  const float* v = logits.data_ptr<float>();
  std::string out = fmt::format("{} {}\n", ids.size(), m.spec.vocab_size);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t j = 0; j < m.spec.vocab_size; ++j)
      out += fmt::format("{}{:.9g}", j ? " " : "", v[static_cast<int64_t>(t) * m.spec.vocab_size + j]);
    out += '\n';
  }
  return out;
}

/// Writes the export; throws lw_error(io_error) when a file cannot be written.
void write_export(const checkpoint_model& m, const export_options& o) {
  const fs::path out(o.out_dir);
  fs::create_directories(out);
  const models::llama_weights weights(m.spec, m.theta.data());
  const auto model_path = (out / "model.safetensors").string();
  const uint64_t bytes = models::write_safetensors(model_path, weights.tensors(), {{"format", "pt"}});
  std::printf("export: wrote %s (%zu tensors, %zu parameters, %.2f MiB, float32)\n", model_path.c_str(),
              weights.tensors().size(), m.theta.size(), static_cast<double>(bytes) / (1 << 20));
  const auto config_path = (out / "config.json").string();
  const std::string config = models::llama_config_json(m.spec);
  models::data::write_file_atomic(config_path, {config});
  std::printf(
      "export: wrote %s (LlamaForCausalLM: hidden %ld, layers %ld, heads %ld, kv heads %ld, ffn %ld, vocab "
      "%ld, context %ld, tied embeddings)\n",
      config_path.c_str(), m.spec.dim, m.spec.n_layers, m.spec.n_heads, m.spec.n_kv_heads, m.spec.ffn_hidden,
      m.spec.vocab_size, m.spec.seq_len);
  if (const auto tok = find_tokenizer(m, o.checkpoint, "export")) {
    const auto tok_path = (out / "tokenizer.txt").string();
    models::data::write_file_atomic(tok_path, {tok->text});
    std::printf(
        "export: wrote %s's tokenizer to %s (Longwave's %s tokenizer format, not a Hugging Face "
        "tokenizer)\n",
        tok->from.c_str(), tok_path.c_str(),
        models::data::parse_tokenizer(tok->text, tok->from)->kind().c_str());
  } else {
    std::printf("export: no tokenizer file of this run found; none copied\n");
    // An earlier export's (--force): left there, it would be taken for this model's. A file whose first
    // line is not a Longwave tokenizer's ("longwave-byte 1", "longwave-bpe 1") is the user's: it stays.
    const auto stale = out / "tokenizer.txt";
    std::error_code ec;
    if (!fs::is_regular_file(stale, ec)) return;
    std::string head;
    std::ifstream in(stale);
    std::getline(in, head);
    if (head.rfind("longwave-", 0) != 0) {
      std::printf("export: left %s as it is: it is no Longwave tokenizer (a file of yours?)\n",
                  stale.c_str());
      return;
    }
    if (fs::remove(stale, ec))
      std::printf("export: removed %s, an earlier export's tokenizer, not this model's\n", stale.c_str());
  }
}

/// An export that ended before it was done (Ctrl-C, a kill): the folder holds only the files an export
/// writes and at least one of their unfinished .tmp copies (a folder with only a config.json may be
/// another model's). The next export takes it over without --force. Fills `leftovers` with the .tmp files.
bool unfinished_export(const fs::path& dir, std::vector<fs::path>& leftovers) {
  const std::vector<std::string> ours{"model.safetensors", "config.json", "tokenizer.txt"};
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    const auto base = tmp ? name.substr(0, name.size() - 4) : name;
    if (std::find(ours.begin(), ours.end(), base) == ours.end() || !it->is_regular_file(ec)) return false;
    if (tmp) leftovers.push_back(it->path());
  }
  return !ec && !leftovers.empty();
}

}  // namespace

int export_checkpoint(const export_options& o) {
  if (o.format != "safetensors") {
    std::fprintf(stderr, "export: --format '%s': unknown format (the one format is safetensors)\n",
                 o.format.c_str());
    return 2;
  }
  if (o.logits_for.empty() != o.logits_out.empty()) {
    std::fprintf(stderr, "export: --logits-for and --logits-out go together\n");
    return 2;
  }
  std::error_code ec;
  if (!fs::exists(o.checkpoint, ec)) {
    std::fprintf(stderr, "export: checkpoint '%s': no such file or directory\n", o.checkpoint.c_str());
    return 2;
  }
  if (o.out_dir.empty()) {
    std::fprintf(stderr, "export: --out is empty: name the output directory\n");
    return 2;
  }
  std::vector<fs::path> leftovers;
  if (fs::is_directory(o.out_dir, ec) && !fs::is_empty(o.out_dir, ec) && !o.force) {
    if (!unfinished_export(o.out_dir, leftovers)) {
      std::fprintf(
          stderr,
          "export: --out '%s' is not empty (an earlier export?); use --force to overwrite its files\n",
          o.out_dir.c_str());
      return 2;
    }
    std::printf("export: --out '%s' holds an export that did not finish: this one writes over it\n",
                o.out_dir.c_str());
  }
  for (const auto& f : leftovers)
    if (fs::remove(f, ec)) std::printf("export: removed %s, an unfinished write\n", f.c_str());
  // Made before the checkpoint is read, so that a place no directory can be made (a file or a dangling link
  // on the way) is named as bad input.
  fs::path first_made;  // the outermost directory this makes ("": none)
  for (fs::path d = fs::path(o.out_dir); !d.empty() && !fs::exists(d, ec) && d != d.parent_path();
       d = d.parent_path())
    first_made = d;
  if (const auto why = runtime::make_directories(o.out_dir); !why.empty()) {
    std::fprintf(stderr, "export: --out '%s': %s\n", o.out_dir.c_str(), why.c_str());
    return 2;
  }
  const auto refuse = [&](int code) {  // what this made is empty: nothing was written
    if (!first_made.empty())
      for (fs::path d = o.out_dir; fs::remove(d, ec) && d != first_made;) d = d.parent_path();
    return code;
  };
  checkpoint_model m;
  std::vector<int64_t> ids;
  try {
    m = load_checkpoint_model(o.checkpoint);
    if (!o.logits_for.empty()) ids = parse_ids(o.logits_for, m.spec);
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "export: checkpoint '%s': %s\n", o.checkpoint.c_str(), e.what());
    return refuse(2);
  } catch (const lw_error& e) {
    std::fprintf(stderr, "export: %s: %s\n", to_string(e.code()), e.what());
    return refuse(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export: checkpoint '%s': %s\n", o.checkpoint.c_str(), describe(e).c_str());
    return refuse(1);
  }
  std::printf("export: checkpoint %s: model %s, %zu parameters\n", m.label.c_str(),
              models::model_label(m.spec).c_str(), m.theta.size());
  try {
    write_export(m, o);
    if (!ids.empty()) {
      models::data::write_file_atomic(o.logits_out, {logits_text(m, ids)});
      std::printf("export: wrote our logits of %zu tokens to %s\n", ids.size(), o.logits_out.c_str());
    }
    return 0;
  } catch (const lw_error& e) {
    std::fprintf(stderr, "export: %s: %s\n", to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export: %s\n", describe(e).c_str());
    return 1;
  }
}

}  // namespace longwave::cli
