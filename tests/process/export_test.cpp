// `longwave export`: a trained checkpoint as Hugging Face Llama safetensors, read back byte by byte, run
// through an independent PyTorch Llama forward pass (tests/support/llama_forward.py) that must give our
// logits; and the refusals (unknown format, missing or corrupt checkpoint, a non-empty --out). `longwave
// sample`, which reads a checkpoint's model and tokenizer as export does.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/checkpoint/checkpoint_store.hpp"
#include "runtime/json/json_reader.hpp"
#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

// The exported model's shape: grouped-query attention (4 heads, 2 KV heads), head_dim 16, byte vocab.
constexpr int64_t dim = 64, layers = 2, heads = 4, kv_heads = 2, ffn = 96, vocab = 256, context = 32;

std::string tiny_run_config(const std::string& dir) {
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "In the beginning God created the heaven and the earth. Line " + std::to_string(i) + ".\n";
  write_text(dir + "/corpus.txt", corpus);
  const auto path = dir + "/tiny.toml";
  write_text(path, "[run]\nout_dir = \"" + dir + "/run\"\n[data]\npath = \"" + dir + "/corpus.txt\"\n" +
                       R"([model]
seq_len = 32
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn_hidden = 96
[train]
workers = 2
inner_steps = 4
rounds = 2
batch_size = 4
warmup_steps = 2
[eval]
every_rounds = 2
batches = 1
[metrics]
enabled = false
)");
  return path;
}

/// One tensor the export must hold: its HF name and shape, and where its values are in theta.
struct expected_tensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset;
  int64_t heads = 0;  ///< q/k projections: rows reordered per head from (2i, 2i+1) pairs to (i, i + D/2)
};

/// Written out from the model's flat layout (models/model_spec.cpp), independently of the exporter.
std::vector<expected_tensor> expected_tensors() {
  std::vector<expected_tensor> out;
  int64_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, int64_t h = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back({std::move(name), std::move(shape), off, h});
    off += n;
  };
  add("model.embed_tokens.weight", {vocab, dim});
  const int64_t kv = kv_heads * (dim / heads);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {dim});
    add(p + "self_attn.q_proj.weight", {dim, dim}, heads);
    add(p + "self_attn.k_proj.weight", {kv, dim}, kv_heads);
    add(p + "self_attn.v_proj.weight", {kv, dim});
    add(p + "self_attn.o_proj.weight", {dim, dim});
    add(p + "post_attention_layernorm.weight", {dim});
    add(p + "mlp.gate_proj.weight", {ffn, dim});
    add(p + "mlp.up_proj.weight", {ffn, dim});
    add(p + "mlp.down_proj.weight", {dim, ffn});
  }
  add("model.norm.weight", {dim});
  return out;
}

/// The values the export must hold for `t`: theta's slice, q/k rows in rotate-half order.
std::vector<float> expected_values(const expected_tensor& t, const std::vector<float>& theta) {
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1, rows = t.shape[0];
  std::vector<float> out(theta.begin() + t.offset, theta.begin() + t.offset + rows * cols);
  if (t.heads == 0) return out;
  const int64_t hd = rows / t.heads, half = hd / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / hd, j = r % hd;
    const int64_t from = h * hd + (j < half ? 2 * j : 2 * (j - half) + 1);
    std::copy_n(theta.begin() + t.offset + from * cols, cols, out.begin() + r * cols);
  }
  return out;
}

std::vector<float> checkpoint_theta(const std::string& ckpt_dir) {
  const auto c = longwave::runtime::checkpoint_store(ckpt_dir, 100).load_latest();
  if (!c) throw std::runtime_error("no checkpoint in " + ckpt_dir);
  const auto* b = c->find("theta");
  if (!b) throw std::runtime_error("no theta in the checkpoint");
  std::vector<float> theta(b->size / sizeof(float));
  std::memcpy(theta.data(), b->data, b->size);
  return theta;
}

/// Checks model.safetensors against theta: the header's framing, every tensor's name, dtype, shape and
/// offsets, and its bytes.
void check_round_trip(const std::string& path, const std::vector<float>& theta) {
  const std::string file = read_text(path);
  CATCH_REQUIRE(file.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  CATCH_REQUIRE(8 + n <= file.size());
  CATCH_CHECK((8 + n) % 8 == 0);
  rapidjson::Document header;
  const auto err = longwave::runtime::parse_json(std::string_view(file).substr(8, n), header);
  CATCH_REQUIRE(!err);
  CATCH_REQUIRE(header.IsObject());
  const auto* meta = longwave::runtime::find_member(header, "__metadata__");
  CATCH_REQUIRE(meta);
  CATCH_CHECK(std::string((*meta)["format"].GetString()) == "pt");
  const auto expected = expected_tensors();
  CATCH_CHECK(header.MemberCount() == expected.size() + 1);  // + __metadata__; no lm_head: tied
  const size_t data = 8 + n;
  uint64_t covered = 0;
  bool any_reordered = false;
  for (const auto& t : expected) {
    CATCH_INFO(t.name);
    const auto* v = longwave::runtime::find_member(header, t.name);
    CATCH_REQUIRE(v);
    CATCH_CHECK(std::string((*v)["dtype"].GetString()) == "F32");
    std::vector<int64_t> shape;
    for (const auto& d : (*v)["shape"].GetArray()) shape.push_back(d.GetInt64());
    CATCH_CHECK(shape == t.shape);
    const uint64_t begin = (*v)["data_offsets"][0].GetUint64(), end = (*v)["data_offsets"][1].GetUint64();
    const auto want = expected_values(t, theta);
    CATCH_REQUIRE(end - begin == want.size() * sizeof(float));
    CATCH_REQUIRE(data + end <= file.size());
    CATCH_CHECK(std::memcmp(file.data() + data + begin, want.data(), end - begin) == 0);
    if (t.heads) any_reordered |= std::memcmp(want.data(), theta.data() + t.offset, end - begin) != 0;
    covered += end - begin;
  }
  CATCH_CHECK(covered == file.size() - data);
  CATCH_CHECK(covered == theta.size() * sizeof(float));
  CATCH_CHECK(any_reordered);  // the q/k check above is not vacuous
}

void check_config_json(const std::string& path) {
  rapidjson::Document c;
  CATCH_REQUIRE(!longwave::runtime::parse_json(read_text(path), c));
  auto integer = [&](const char* key) { return c[key].GetInt64(); };
  CATCH_CHECK(std::string(c["architectures"][0].GetString()) == "LlamaForCausalLM");
  CATCH_CHECK(std::string(c["model_type"].GetString()) == "llama");
  CATCH_CHECK(std::string(c["torch_dtype"].GetString()) == "float32");
  CATCH_CHECK(integer("hidden_size") == dim);
  CATCH_CHECK(integer("num_hidden_layers") == layers);
  CATCH_CHECK(integer("num_attention_heads") == heads);
  CATCH_CHECK(integer("num_key_value_heads") == kv_heads);
  CATCH_CHECK(integer("intermediate_size") == ffn);
  CATCH_CHECK(integer("vocab_size") == vocab);
  CATCH_CHECK(integer("max_position_embeddings") == context);
  CATCH_CHECK(c["rope_theta"].GetDouble() == 10000.0);
  CATCH_CHECK(c["rms_norm_eps"].GetDouble() == 1e-5);
  CATCH_CHECK(c["tie_word_embeddings"].GetBool());
}

/// "T V" then T lines of V values (our --logits-out, the script's output).
std::vector<std::vector<double>> read_logits(const std::string& path) {
  std::istringstream in(read_text(path));
  size_t t = 0, v = 0;
  in >> t >> v;
  std::vector<std::vector<double>> out(t, std::vector<double>(v));
  for (auto& row : out)
    for (auto& x : row)
      if (!(in >> x)) throw std::runtime_error(path + ": fewer values than its first line says");
  return out;
}

const char* const python = "/usr/bin/python3";

}  // namespace

CATCH_TEST_CASE(
    "an exported checkpoint holds theta as Llama tensors and a plain PyTorch Llama gives our logits",
    "[process][export]") {
  const auto dir = scratch_dir("export");
  const auto ckpt_dir = dir + "/run/checkpoints";
  {
    // More evaluation batches than the validation set holds: the run's evaluations use each window once,
    // as eval does, and both give one loss (the run repeated windows, and a huge value ran for hours).
    const auto [code, out] = run({binary(), "run", tiny_run_config(dir), "--set", "eval.batches=100000000"},
                                 dir + "/run.log", 600);
    CATCH_INFO(out);
    CATCH_REQUIRE(code == 0);
    CATCH_CHECK(out.find("eval.batches = 100000000 is more than the ") != std::string::npos);
    const auto [ecode, eout] = run({binary(), "eval", ckpt_dir}, dir + "/eval.log", 300);
    CATCH_INFO(eout);
    CATCH_CHECK(ecode == 0);
    const auto at = out.find("final: val loss ");
    CATCH_REQUIRE(at != std::string::npos);
    CATCH_CHECK(eout.find("val loss " + out.substr(at + 16, 6)) != std::string::npos);
  }
  const auto exp = dir + "/hf";
  // "In the beginning" in bytes, then a few other ids: 20 positions of the 32-token context.
  const std::string ids = "73,110,32,116,104,101,32,98,101,103,105,110,110,105,110,103,0,255,17,200";
  const auto [code, out] = run({binary(), "export", ckpt_dir, "--format", "safetensors", "--out", exp,
                                "--logits-for", ids, "--logits-out", dir + "/ours.txt"},
                               dir + "/export.log", 300);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(out.find("wrote " + exp + "/model.safetensors (20 tensors, ") != std::string::npos);
  CATCH_CHECK(out.find("wrote " + exp + "/config.json") != std::string::npos);
  CATCH_CHECK(out.find("tokenizer.txt") != std::string::npos);
  CATCH_CHECK(fs::is_regular_file(exp + "/tokenizer.txt"));

  const auto theta = checkpoint_theta(ckpt_dir);
  CATCH_CHECK(out.find(std::to_string(theta.size()) + " parameters") != std::string::npos);
  check_round_trip(exp + "/model.safetensors", theta);
  check_config_json(exp + "/config.json");

  // The independent forward pass: Debian's python3 and python3-torch (scripts/setup installs both).
  if (access(python, X_OK) != 0)
    CATCH_FAIL(python << " is missing: run scripts/setup (it installs python3 and python3-torch)");
  const auto [pcode, pout] = run(
      {python, std::string(LW_SOURCE_DIR) + "/tests/support/llama_forward.py", exp, ids, dir + "/theirs.txt"},
      dir + "/python.log", 300);
  CATCH_INFO(pout);
  if (pcode == 3)
    CATCH_FAIL("python3-torch is not installed: run scripts/setup (apt-get install python3-torch)");
  CATCH_REQUIRE(pcode == 0);
  const auto ours = read_logits(dir + "/ours.txt"), theirs = read_logits(dir + "/theirs.txt");
  CATCH_REQUIRE(ours.size() == 20);
  CATCH_REQUIRE(theirs.size() == ours.size());
  double max_diff = 0, max_abs = 0;
  for (size_t t = 0; t < ours.size(); ++t) {
    CATCH_REQUIRE(ours[t].size() == static_cast<size_t>(vocab));
    CATCH_REQUIRE(theirs[t].size() == ours[t].size());
    for (size_t j = 0; j < ours[t].size(); ++j) {
      max_diff = std::max(max_diff, std::abs(ours[t][j] - theirs[t][j]));
      max_abs = std::max(max_abs, std::abs(ours[t][j]));
    }
  }
  std::cout << "export: max |logit difference| " << max_diff << " (largest |logit| " << max_abs << ")\n";
  CATCH_CHECK(max_abs > 0.1);  // trained logits, not a degenerate all-zero comparison
  CATCH_CHECK(max_diff <= 1e-4);

  // A second export into the same directory is refused, and allowed with --force (from a .lwc file).
  {
    const auto [c2, o2] = run({binary(), "export", ckpt_dir, "--out", exp}, dir + "/again.log", 120);
    CATCH_INFO(o2);
    CATCH_CHECK(c2 == 2);
    CATCH_CHECK(o2.find("not empty") != std::string::npos);
    CATCH_CHECK(o2.find("--force") != std::string::npos);
  }
  {
    const auto files = longwave::runtime::checkpoint_store(ckpt_dir, 100).list();
    CATCH_REQUIRE(!files.empty());
    const auto before = read_text(exp + "/model.safetensors");
    fs::remove(exp + "/model.safetensors");
    const auto [c3, o3] =
        run({binary(), "export", files.back(), "--out", exp, "--force"}, dir + "/force.log", 120);
    CATCH_INFO(o3);
    CATCH_CHECK(c3 == 0);
    CATCH_CHECK(read_text(exp + "/model.safetensors") == before);
    CATCH_CHECK(!fs::exists(exp + "/model.safetensors.tmp"));
    // An export cut short (Ctrl-C left model.safetensors.tmp) is taken over without --force (a probe: the
    // same command was refused as "not empty"); a folder with another file in it is still refused.
    const auto cut = dir + "/cut";
    fs::create_directories(cut);
    write_text(cut + "/config.json", read_text(exp + "/config.json"));
    write_text(cut + "/model.safetensors.tmp", "partial");
    const auto [c4, o4] = run({binary(), "export", files.back(), "--out", cut}, dir + "/cut.log", 120);
    CATCH_INFO(o4);
    CATCH_CHECK(c4 == 0);
    CATCH_CHECK(o4.find("holds an export that did not finish: this one writes over it") != std::string::npos);
    CATCH_CHECK(read_text(cut + "/model.safetensors") == before);
    CATCH_CHECK(!fs::exists(cut + "/model.safetensors.tmp"));
    write_text(cut + "/notes.txt", "mine");
    write_text(cut + "/config.json.tmp", "partial");
    const auto [c5, o5] = run({binary(), "export", files.back(), "--out", cut}, dir + "/cut2.log", 120);
    CATCH_INFO(o5);
    CATCH_CHECK(c5 == 2);
    CATCH_CHECK(o5.find("not empty") != std::string::npos);
    CATCH_CHECK(fs::exists(cut + "/config.json.tmp"));
  }
  // A theta with a NaN in it, and one a value short: eval and export refuse both as bad input (exit 2).
  for (const bool with_nan : {true, false}) {
    auto c = longwave::runtime::checkpoint_store::load_file(
        longwave::runtime::checkpoint_store(ckpt_dir, 100).list().back());
    for (auto& b : c.blobs) {
      if (b.name != "theta") continue;
      if (with_nan) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(b.storage.data() + sizeof(float), &nan, sizeof nan);
      } else {
        b.storage.resize(b.storage.size() - sizeof(float));
        b.size = b.storage.size();
      }
      b.data = b.storage.data();
    }
    const std::string bad = dir + (with_nan ? "/nan" : "/short");
    longwave::runtime::checkpoint_store(bad, 1).write(c);
    const auto [ce, oe] = run({binary(), "eval", bad}, bad + "-eval.log", 300);
    CATCH_INFO(oe);
    CATCH_CHECK(ce == 2);
    CATCH_CHECK(oe.find(with_nan ? "holds NaN or infinite values" : "no vocabulary") != std::string::npos);
    const auto [cx, ox] = run({binary(), "export", bad, "--out", bad + "-hf"}, bad + "-export.log", 120);
    CATCH_INFO(ox);
    CATCH_CHECK(cx == 2);
    CATCH_CHECK(ox.find(with_nan ? "holds NaN or infinite values" : "no vocabulary") != std::string::npos);
    CATCH_CHECK(!fs::exists(bad + "-hf/model.safetensors"));
  }
  // A stored config edited by hand: eval refuses a model whose one forward pass cannot fit in this machine's
  // memory before allocating anything (it reached the allocator), and cuts a stored eval.batches to the
  // windows the validation set holds, as it cuts --batches (it ran them all).
  auto with_setting = [&](const std::string& from, const std::string& key, const std::string& value,
                          const std::string& name) {
    auto c = longwave::runtime::checkpoint_store::load_file(
        longwave::runtime::checkpoint_store(from, 100).list().back());
    const auto at = c.meta.find("\n" + key + " = ", c.meta.find("--- config ---"));
    CATCH_REQUIRE(at != std::string::npos);
    c.meta.replace(at + 1, c.meta.find('\n', at + 1) - at - 1, key + " = " + value);
    fs::remove_all(dir + "/" + name);
    longwave::runtime::checkpoint_store(dir + "/" + name, 1).write(c);
    return dir + "/" + name;
  };
  const auto huge =
      with_setting(with_setting(ckpt_dir, "batch_size", "1048576", "big"), "seq_len", "8192", "huge");
  const auto [cm, om] = run({binary(), "eval", huge}, huge + "-eval.log", 300);
  CATCH_INFO(om);
  CATCH_CHECK(cm == 2);
  CATCH_CHECK(om.find("to evaluate, more than this machine's") != std::string::npos);
  const auto many = with_setting(ckpt_dir, "batches", "100000000", "many");
  const auto [cb, ob] = run({binary(), "eval", many}, many + "-eval.log", 300);
  CATCH_INFO(ob);
  CATCH_CHECK(cb == 0);
  CATCH_CHECK(ob.find("the checkpoint's eval.batches = 100000000 is more than the ") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "export refuses an unknown format, a missing or corrupt checkpoint and a file as --out with exit 2",
    "[process][export]") {
  const auto dir = scratch_dir("export-bad");
  {
    const auto [code, out] = run({binary(), "export", "--help"}, dir + "/help.log", 60);
    CATCH_INFO(out);
    CATCH_CHECK(code == 0);
    for (const char* s : {"safetensors", "--out", "--force", "config.json", "model.embed_tokens.weight"})
      CATCH_CHECK(out.find(s) != std::string::npos);
    CATCH_CHECK(out.find("--logits-for") == std::string::npos);  // a diagnostic, not in --help
  }
  {
    const auto [code, out] = run({binary(), "--help"}, dir + "/main-help.log", 60);
    CATCH_CHECK(out.find("export") != std::string::npos);
  }
  fs::create_directories(dir + "/empty");
  write_text(dir + "/ckpt-00000001-0000000004.lwc", "LWCKPT01 but not really a checkpoint\n");
  fs::create_directories(dir + "/corrupt");
  fs::create_directories(dir + "/run_dir/checkpoints");
  fs::copy_file(dir + "/ckpt-00000001-0000000004.lwc", dir + "/corrupt/ckpt-00000001-0000000004.lwc");
  write_text(dir + "/a_file", "x\n");
  struct bad_case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<bad_case> cases = {
      {{dir + "/corrupt", "--format", "gguf"}, "--format 'gguf': unknown format"},
      {{dir + "/nope"}, "checkpoint '" + dir + "/nope': no such file or directory"},
      {{dir + "/empty"}, "no checkpoint in this directory"},
      // A run's out_dir named instead of its checkpoints: said.
      {{dir + "/run_dir"},
       "run_dir: no checkpoint in this directory (did you mean " + dir + "/run_dir/checkpoints?)"},
      {{dir + "/ckpt-00000001-0000000004.lwc"}, "corrupt_checkpoint"},
      {{dir + "/corrupt"}, "corrupt_checkpoint"},
      {{dir + "/corrupt", "--out", dir + "/a_file"}, "a_file': a file, not a directory"},
      {{dir + "/corrupt", "--out", dir + "/a_file/x/y"}, "y': " + dir + "/a_file is a file, not a directory"},
      {{dir + "/corrupt", "--out", ""}, "--out is empty"},
      {{dir + "/corrupt", "--out", dir + "/new/deeper/out"}, "corrupt_checkpoint"},
      // A link whose target is gone (it was a filesystem_error, exit 1).
      {{dir + "/corrupt", "--out", dir + "/dangling"},
       "--out '" + dir + "/dangling': a symbolic link to " + dir + "/gone, which does not exist"},
      {{dir + "/corrupt", "--out", dir + "/dangling/x"},
       "x': " + dir + "/dangling is a symbolic link to " + dir + "/gone, which does not exist"},
  };
  fs::create_symlink(dir + "/gone", dir + "/dangling");
  int i = 0;
  for (const auto& c : cases) {
    std::vector<std::string> args{binary(), "export"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    if (std::find(c.args.begin(), c.args.end(), "--out") == c.args.end())
      args.insert(args.end(), {"--out", dir + "/out"});
    const auto [code, out] = run(args, dir + "/bad" + std::to_string(i++) + ".log", 60);
    CATCH_INFO(c.says << ": " << out);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(out.find(c.says) != std::string::npos);
    CATCH_CHECK(!fs::exists(dir + "/out/model.safetensors"));
  }
  // Made before the checkpoint was read, removed when refused, with the parents that it made.
  CATCH_CHECK_FALSE(fs::exists(dir + "/out"));
  CATCH_CHECK_FALSE(fs::exists(dir + "/new"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "export and sample take the tokenizer the checkpoint carries, not a later run's in its out_dir",
    "[process][export]") {
  const auto dir = scratch_dir("export-tokenizer");
  const auto cfg = tiny_run_config(dir);
  const auto train = [&](int vocab, const std::string& log) {
    const auto [code, out] = run({binary(), "run", cfg, "--fresh", "--set", "data.tokenizer=\"bpe\"", "--set",
                                  "data.bpe_vocab_size=" + std::to_string(vocab)},
                                 dir + "/" + log, 600);
    CATCH_INFO(out);
    CATCH_REQUIRE(code == 0);
  };
  train(300, "a.log");
  fs::copy(dir + "/run", dir + "/archive", fs::copy_options::recursive);
  train(280, "b.log");  // the same out_dir again, another tokenizer
  const auto [code, out] =
      run({binary(), "export", dir + "/archive/checkpoints", "--out", dir + "/hf"}, dir + "/export.log", 300);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(read_text(dir + "/hf/tokenizer.txt") == read_text(dir + "/archive/data/tokenizer.txt"));
  CATCH_CHECK(read_text(dir + "/hf/tokenizer.txt") != read_text(dir + "/run/data/tokenizer.txt"));
  // eval on shards of another tokenizer is refused, naming both (the loss would be over other tokens).
  // eval of a run's checkpoints (RUN: its folder in dir) on other data: its exit code and output.
  const auto eval_of = [&](const std::string& run_dir, const std::string& data, const std::string& log) {
    return run({binary(), "eval", dir + "/" + run_dir + "/checkpoints", "--data", data}, dir + "/" + log,
               300);
  };
  const auto [ecode, eout] = eval_of("archive", dir + "/run/data", "eval-other.log");
  CATCH_INFO(eout);
  CATCH_CHECK(ecode == 2);
  CATCH_CHECK(eout.find("its shards are tokenized by a bpe tokenizer of ") != std::string::npos);
  CATCH_CHECK(eout.find("the loss would be over other tokens") != std::string::npos);
  // The checkpoint carries its tokenizer: sample and export need no file beside it (a probe: a resume refused
  // for another data.bpe_vocab_size had prepared the run's data again, and sample found no tokenizer).
  fs::remove(dir + "/archive/data/tokenizer.txt");
  const auto [scode, sout] =
      run({binary(), "sample", dir + "/archive/checkpoints", "--tokens", "5"}, dir + "/sample.log", 300);
  CATCH_INFO(sout);
  CATCH_CHECK(scode == 0);
  CATCH_CHECK(sout.find("bpe tokenizer; 5 tokens") != std::string::npos);
  const auto tok280 = read_text(dir + "/run/data/tokenizer.txt");
  const auto [rcode2, refused] = run({binary(), "run", cfg, "--set", "data.tokenizer=\"bpe\"", "--set",
                                      "data.bpe_vocab_size=300", "--set", "train.rounds=3"},
                                     dir + "/c.log", 600);
  CATCH_INFO(refused);
  CATCH_CHECK(rcode2 == 1);
  CATCH_CHECK(refused.find("checkpoint was trained with the tokenizer 'bpe vocab=280 crc32c=") !=
              std::string::npos);
  CATCH_CHECK(refused.find("this run prepared 'bpe vocab=300 crc32c=") != std::string::npos);
  CATCH_CHECK(read_text(dir + "/run/data/tokenizer.txt") != tok280);
  const auto [xcode, xout] = run({binary(), "export", dir + "/run/checkpoints", "--out", dir + "/hf280"},
                                 dir + "/export280.log", 300);
  CATCH_INFO(xout);
  CATCH_CHECK(xcode == 0);
  CATCH_CHECK(xout.find("wrote the checkpoint's tokenizer to " + dir + "/hf280/tokenizer.txt") !=
              std::string::npos);
  CATCH_CHECK(read_text(dir + "/hf280/tokenizer.txt") == tok280);

  // A run on ready-made shards without a tokenizer: its ids are another tokenizer's. sample refuses (it
  // wrote them as bytes), and an export over an earlier one leaves no tokenizer that is not this model's.
  const auto [pcode, pout] = run({binary(), "data", "prepare", dir + "/corpus.txt", "--out", dir + "/shards"},
                                 dir + "/prep.log", 300);
  CATCH_REQUIRE(pcode == 0);
  const auto [bcode, bout] = eval_of("archive", dir + "/shards", "eval-bytes.log");
  CATCH_INFO(bout);
  CATCH_CHECK(bcode == 2);
  CATCH_CHECK(bout.find("its shards are tokenized by a byte tokenizer of 256 tokens") != std::string::npos);
  // A run on ready BPE shards takes their tokenizer whatever data.tokenizer says (the docs' recipe): eval
  // on its own shards counts, and on the byte shards is refused.
  const auto [qcode, qout] = run({binary(), "data", "prepare", dir + "/corpus.txt", "--out",
                                  dir + "/bpe-shards", "--tokenizer", "bpe", "--vocab", "300"},
                                 dir + "/prep-bpe.log", 300);
  CATCH_REQUIRE(qcode == 0);
  const auto [rb, rbout] =
      run({binary(), "run", cfg, "--fresh", "--set", "data.path=\"" + dir + "/bpe-shards\"", "--set",
           "run.out_dir=\"" + dir + "/bpe-run\""},
          dir + "/bpe-run.log", 600);
  CATCH_INFO(rbout);
  CATCH_REQUIRE(rb == 0);
  // A model.vocab_size below the shards' is refused by the dry run as by the run (the dry run said yes).
  const auto [dry_code, dry] = run({binary(), "run", cfg, "--dry-run", "--set",
                                    "data.path=\"" + dir + "/bpe-shards\"", "--set", "model.vocab_size=299"},
                                   dir + "/bpe-dry.log", 300);
  CATCH_INFO(dry);
  CATCH_CHECK(dry_code == 2);
  CATCH_CHECK(dry.find("model.vocab_size = 299: the data has token ids up to 299") != std::string::npos);
  const auto [own_code, own] = eval_of("bpe-run", dir + "/bpe-shards", "eval-bpe-own.log");
  CATCH_INFO(own);
  CATCH_CHECK(own_code == 0);
  CATCH_CHECK(own.find("val loss") != std::string::npos);
  const auto [byte_code, on_bytes] = eval_of("bpe-run", dir + "/shards", "eval-bpe-bytes.log");
  CATCH_INFO(on_bytes);
  CATCH_CHECK(byte_code == 2);
  CATCH_CHECK(on_bytes.find("the loss would be over other tokens") != std::string::npos);
  for (const char* f : {"tokenizer.txt", "prepared.txt"}) fs::remove(dir + "/shards/" + f);
  const auto [ucode, uout] =
      eval_of("archive", dir + "/shards", "eval-unchecked.log");  // nothing to compare: a warning
  CATCH_INFO(uout);
  CATCH_CHECK(ucode == 0);
  CATCH_CHECK(uout.find("has no tokenizer.txt: its token ids are taken as the run's bpe tokens, unchecked") !=
              std::string::npos);
  const auto [rcode, rout] =
      run({binary(), "run", cfg, "--fresh", "--set", "data.path=\"" + dir + "/shards\"", "--set",
           "run.out_dir=\"" + dir + "/shard-run\""},
          dir + "/shard-run.log", 600);
  CATCH_INFO(rout);
  CATCH_REQUIRE(rcode == 0);
  const auto [s2, said] =
      run({binary(), "sample", dir + "/shard-run/checkpoints"}, dir + "/sample-shards.log", 300);
  CATCH_INFO(said);
  CATCH_CHECK(s2 == 2);
  CATCH_CHECK(said.find("the run read pre-tokenized shards") != std::string::npos);
  CATCH_REQUIRE(fs::exists(dir + "/hf/tokenizer.txt"));
  const auto [x2, over] =
      run({binary(), "export", dir + "/shard-run/checkpoints", "--out", dir + "/hf", "--force"},
          dir + "/export-over.log", 300);
  CATCH_INFO(over);
  CATCH_CHECK(x2 == 0);
  CATCH_CHECK(over.find("removed " + dir + "/hf/tokenizer.txt, an earlier export's") != std::string::npos);
  CATCH_CHECK_FALSE(fs::exists(dir + "/hf/tokenizer.txt"));
  // A tokenizer.txt that is no tokenizer of ours is the user's: it stays (a probe: it was removed).
  write_text(dir + "/hf/tokenizer.txt", "my notes\n");
  const auto [x3, mine] =
      run({binary(), "export", dir + "/shard-run/checkpoints", "--out", dir + "/hf", "--force"},
          dir + "/export-mine.log", 300);
  CATCH_INFO(mine);
  CATCH_CHECK(x3 == 0);
  CATCH_CHECK(mine.find("it is no Longwave tokenizer") != std::string::npos);
  CATCH_CHECK(read_text(dir + "/hf/tokenizer.txt") == "my notes\n");
  // eval compares the data's tokenizer with the one the checkpoint names: the corpus as it was gives it
  // again (a private copy at vocab 280), and edited, it is tokenized with the checkpoint's own BPE (a BPE
  // trained on it again gave a loss over other tokens, then was refused).
  const auto [e1, same] = run({binary(), "eval", dir + "/run/checkpoints"}, dir + "/eval-same.log", 300);
  CATCH_INFO(same);
  CATCH_CHECK(e1 == 0);
  write_text(dir + "/corpus.txt",
             read_text(dir + "/corpus.txt") + "And the earth was without form, and void.\n");
  const auto [e2, edited] = run({binary(), "eval", dir + "/run/checkpoints"}, dir + "/eval-edited.log", 300);
  CATCH_INFO(edited);
  CATCH_CHECK(e2 == 0);
  CATCH_CHECK(edited.find("tokenized with the checkpoint's tokenizer (bpe vocab=280 crc32c=") !=
              std::string::npos);
  CATCH_CHECK(edited.find("training BPE") == std::string::npos);
  // One line more at the end moves the validation text by a line: about the same loss (another BPE's ids
  // would score far worse).
  const auto loss_of = [](const std::string& out) {
    const auto at = out.find("val loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 9));
  };
  CATCH_CHECK(loss_of(same) > 0);
  CATCH_CHECK(std::abs(loss_of(edited) - loss_of(same)) < 0.05 * loss_of(same));
  // Shards of another corpus at the same vocabulary: their tokenizer is not the checkpoint's.
  std::string other;
  for (int i = 0; i < 300; ++i)
    other += "Quick zephyrs blow, vexing daft Jim " + std::to_string(i * 7) + ".\n";
  write_text(dir + "/other.txt", other);
  const auto [q2, qout2] = run({binary(), "data", "prepare", dir + "/other.txt", "--out",
                                dir + "/other-shards", "--tokenizer", "bpe", "--vocab", "280"},
                               dir + "/prep-other.log", 300);
  CATCH_REQUIRE(q2 == 0);
  CATCH_REQUIRE(qout2.find("(vocab 280)") != std::string::npos);
  const auto [e3, on_other] =
      run({binary(), "eval", dir + "/run/checkpoints", "--data", dir + "/other-shards"},
          dir + "/eval-other-shards.log", 300);
  CATCH_INFO(on_other);
  CATCH_CHECK(e3 == 2);
  CATCH_CHECK(on_other.find("is not the one the checkpoint was trained with (bpe vocab=280 crc32c=") !=
              std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "sample writes a checkpoint's text: the likeliest token is our logits' argmax, one seed one text",
    "[process][export]") {
  const auto dir = scratch_dir("sample");
  {
    const auto [code, out] = run({binary(), "run", tiny_run_config(dir)}, dir + "/run.log", 600);
    CATCH_INFO(out);
    CATCH_REQUIRE(code == 0);
  }
  const auto ckpt_dir = dir + "/run/checkpoints";
  // stdout alone (the text), stderr to its own file.
  const auto sample = [&](const std::string& args, const std::string& name) {
    return run({"/bin/sh", "-c",
                "exec " + binary() + " sample " + ckpt_dir + " " + args + " 2>" + dir + "/" + name + ".err"},
               dir + "/" + name + ".out", 300);
  };
  const std::string prompt = "In the beginning";
  const auto [gcode, greedy] = sample("--prompt '" + prompt + "' --tokens 12 --temperature 0", "greedy");
  CATCH_INFO(greedy << read_text(dir + "/greedy.err"));
  CATCH_REQUIRE(gcode == 0);
  CATCH_REQUIRE(greedy.size() == prompt.size() + 12 + 1);  // a byte a token, and a line break
  CATCH_CHECK(greedy.rfind(prompt, 0) == 0);
  CATCH_CHECK(
      (read_text(dir + "/greedy.err").find("byte tokenizer; 12 tokens, the likeliest") != std::string::npos));
  // The first new byte is the argmax of the model's logits after the prompt (export's diagnostic).
  std::string ids;
  for (unsigned char ch : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(ch);
  const auto [ecode, eout] = run({binary(), "export", ckpt_dir, "--out", dir + "/hf", "--logits-for", ids,
                                  "--logits-out", dir + "/ours.txt"},
                                 dir + "/export.log", 300);
  CATCH_INFO(eout);
  CATCH_REQUIRE(ecode == 0);
  const auto logits = read_logits(dir + "/ours.txt");
  CATCH_REQUIRE(logits.size() == prompt.size());
  const auto& last = logits.back();
  const auto best = std::max_element(last.begin(), last.end()) - last.begin();
  CATCH_CHECK(static_cast<unsigned char>(greedy[prompt.size()]) == best);
  // Draws: one seed gives one text; another seed, over the whole vocabulary at temperature 1, another.
  const auto [c1, one] = sample("--tokens 24 --seed 7 --temperature 1 --top-k 0", "seed7");
  const auto [c2, again] = sample("--tokens 24 --seed 7 --temperature 1 --top-k 0", "seed7b");
  const auto [c3, other] = sample("--tokens 24 --seed 8 --temperature 1 --top-k 0", "seed8");
  CATCH_CHECK(c1 == 0);
  CATCH_CHECK(c2 == 0);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(one.size() == 24 + 1);  // the default prompt is the line break itself: no prompt text
  CATCH_CHECK(one == again);
  CATCH_CHECK(one != other);
  // Bad input: no such checkpoint, a negative temperature.
  const auto [m1, missing] = run({binary(), "sample", dir + "/nope"}, dir + "/missing.log", 60);
  CATCH_CHECK(m1 == 2);
  CATCH_CHECK(missing.find(dir + "/nope': no such file or directory") != std::string::npos);
  const auto [m2, cold] = run({binary(), "sample", ckpt_dir, "--temperature", "-1"}, dir + "/cold.log", 60);
  CATCH_CHECK(m2 == 2);
  CATCH_CHECK(cold.find("--temperature") != std::string::npos);
  // An empty value is no number (it read as 0: greedy, seed 0); a negative seed no seed (it wrapped).
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature", ""}, {"--seed", ""}, {"--seed", "-1"}, {"--seed", "18446744073709551616"}}) {
    const auto [code, said] = run({binary(), "sample", ckpt_dir, option, value}, dir + "/bad.log", 60);
    CATCH_INFO(option << " '" << value << "': " << said);
    CATCH_CHECK(code == 2);
    CATCH_CHECK(said.find(option + ": a") != std::string::npos);
  }
  // Text that cannot be written fails: a full disk, a closed stdout (it said "5 tokens" and exited 0).
  const auto [f1, full] = run({"/bin/sh", "-c", "exec " + binary() + " sample " + ckpt_dir + " > /dev/full"},
                              dir + "/full.log", 60);
  CATCH_INFO(full);
  CATCH_CHECK(f1 == 1);
  CATCH_CHECK(full.find("cannot write the text to standard output") != std::string::npos);
  const auto [f2, closed] =
      run({"/bin/sh", "-c", "exec " + binary() + " sample " + ckpt_dir + " >&-"}, dir + "/closed.log", 60);
  CATCH_INFO(closed);
  CATCH_CHECK(f2 == 1);
  CATCH_CHECK(closed.find("standard output is closed") != std::string::npos);
  const auto [f3, table] =
      run({"/bin/sh", "-c", "exec " + binary() + " presets > /dev/full"}, dir + "/presets.log", 60);
  CATCH_CHECK(f3 == 1);
  CATCH_CHECK(table.find("cannot write to standard output") != std::string::npos);
  // A dry run's resolved config is its product too (it exited 0; a probe).
  fs::create_directories(dir + "/dry");
  const auto dry_cfg = tiny_run_config(dir + "/dry");
  const auto [f4, dry] =
      run({"/bin/sh", "-c", "exec " + binary() + " run " + dry_cfg + " --dry-run > /dev/full"},
          dir + "/dry.log", 120);
  CATCH_INFO(dry);
  CATCH_CHECK(f4 == 1);
  CATCH_CHECK(dry.find("cannot write to standard output") != std::string::npos);
  // A reader that went (`sample … | head`): it has what it wanted, so sample ends quietly, exit 0 (SIGPIPE
  // killed it: 141; then it said "Broken pipe", exit 1).
  auto [reader_gone, read_end] = spawn_piped({binary(), "sample", ckpt_dir, "--tokens", "50"});
  CATCH_REQUIRE(read_end >= 0);
  close(read_end);
  CATCH_CHECK(wait_exit(reader_gone, 300) == 0);
  // eval and presets too: a closed stdout is refused before any work (they exited 0, the result lost).
  for (const std::string& command : {"eval " + ckpt_dir, std::string("presets")}) {
    const auto [code, said] =
        run({"/bin/sh", "-c", "exec " + binary() + " " + command + " >&-"}, dir + "/closed2.log", 300);
    CATCH_INFO(command << ": " << said);
    CATCH_CHECK(code == 1);
    CATCH_CHECK(said.find("standard output is closed") != std::string::npos);
  }
  // stdout holds the product alone: the information lines (data: ..., eval: k of n batches) go to stderr.
  const auto [o1, loss] = run({"/bin/sh", "-c", "exec " + binary() + " eval " + ckpt_dir + " 2>/dev/null"},
                              dir + "/only.log", 300);
  CATCH_INFO(loss);
  CATCH_CHECK(o1 == 0);
  CATCH_CHECK(loss.rfind("checkpoint ", 0) == 0);
  CATCH_CHECK(loss.find("] ") == std::string::npos);
  const auto [o2, text] =
      run({"/bin/sh", "-c", "exec " + binary() + " sample " + ckpt_dir + " --tokens 3 2>/dev/null"},
          dir + "/only_text.log", 300);
  CATCH_CHECK(o2 == 0);
  CATCH_CHECK(text.find("] sample") == std::string::npos);
  CATCH_CHECK(text.find("] data") == std::string::npos);
  // --data naming the run's own prepared shards is the data it read: the same loss, no warning (the
  // shards' fingerprint is not the corpus's; their stamp names the corpus).
  CATCH_REQUIRE(fs::exists(dir + "/run/data/prepared.txt"));
  const auto [s1, shards] =
      run({binary(), "eval", ckpt_dir, "--data", dir + "/run/data"}, dir + "/shards.log", 300);
  CATCH_INFO(shards);
  CATCH_CHECK(s1 == 0);
  CATCH_CHECK(shards.find("is not the data the checkpoint's run read") == std::string::npos);
  CATCH_CHECK(shards.find(loss.substr(loss.find("val loss"), 16)) != std::string::npos);
  // eval of a run whose corpus was edited in place says the loss is over other text.
  write_text(dir + "/corpus.txt", read_text(dir + "/corpus.txt") + "And the earth was without form.\n");
  const auto [e1, edited] = run({binary(), "eval", ckpt_dir}, dir + "/eval-edited.log", 300);
  CATCH_INFO(edited);
  CATCH_CHECK(e1 == 0);
  CATCH_CHECK(edited.find("eval: the corpus " + dir +
                          "/corpus.txt is not the data the checkpoint's run read") != std::string::npos);
  fs::remove_all(dir);
}
