// libFuzzer target: a run's metrics.jsonl as `longwave report` reads it (runtime::parse_json, then
// report::read_metrics_file on the whole file). What parses must come back the same through RapidJSON's
// writer (as the sweep's results.jsonl is written) and parse_json again: every number to the bit.
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "cli/report/records.hpp"
#include "fuzz/fuzz_seeds.hpp"
#include "runtime/json/json_reader.hpp"

using longwave::runtime::parse_json;

namespace {

// A few lines of each kind a run writes, as metrics_sink writes them.
constexpr std::string_view seed_run =
    R"({"kind":"start","ts":1795677967.304,"node":"n0","mode":"diloco","preset":"tiny","params":1820352,"workers":8,"rounds":50,"inner_steps":10,"inner_lr":0.004,"outer_lr":1,"comm_dtype":"fp32"})"
    "\n"
    R"({"kind":"step","ts":1795677967.734,"step":1,"round":1,"loss":5.603291631,"tokens_per_second":4756.867866,"lr":0.00016})"
    "\n"
    R"({"kind":"allreduce","ts":1795677969.464,"round":1,"label":0,"seconds":0.008486829,"bytes_sent":0,"bytes_received":0,"dtype":"fp32"})"
    "\n"
    R"({"kind":"outer","ts":1795677969.466,"round":1,"pseudo_gradient_norm":4.512001038,"update_norm":4.512001038,"outer_lr":1})"
    "\n"
    R"({"kind":"worker","ts":1795677969.466,"round":1,"worker":0,"compute_s":2.015213446,"wall_s":2.161778162,"idle_s":0.146564716,"stall_s":0,"utilization":0.9322017779,"staleness":0,"tokens":5120})"
    "\n"
    R"({"kind":"round","ts":1795677969.466,"round":1,"step":10,"theta_crc32c":"f1c405e4"})"
    "\n"
    R"({"kind":"checkpoint","ts":1795677977.414,"round":5,"step":50,"seconds":0.248165776,"bytes":182037789})"
    "\n"
    R"({"kind":"eval","ts":1795677987.475,"round":10,"step":100,"val_loss":NaN,"val_ppl":Infinity})"
    "\n"
    R"({"kind":"end","ts":1795678077.955,"exit_code":0,"val_loss":1.629089057,"val_ppl":5.099227499,"seconds":110.651613,"steps":500,"rounds":50})"
    "\n";

void write_seeds(const std::string& dir) {
  longwave::fuzz::write_seed(dir, "run.jsonl", seed_run);
  longwave::fuzz::write_seed(dir, "zeros.jsonl", R"({"kind":"step","step":0e100,"loss":-0.000000000000})");
  longwave::fuzz::write_seed(dir, "cut.jsonl", seed_run.substr(0, seed_run.size() / 2));
}

bool same_number(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

bool same_value(const rapidjson::Value& a, const rapidjson::Value& b) {
  if (a.IsNumber() || b.IsNumber())
    return a.IsNumber() && b.IsNumber() && a.IsDouble() == b.IsDouble() &&
           same_number(a.GetDouble(), b.GetDouble());
  if (a.GetType() != b.GetType()) return false;
  if (a.IsString())
    return std::string_view(a.GetString(), a.GetStringLength()) ==
           std::string_view(b.GetString(), b.GetStringLength());
  if (a.IsArray()) {
    if (a.Size() != b.Size()) return false;
    for (rapidjson::SizeType i = 0; i < a.Size(); ++i)
      if (!same_value(a[i], b[i])) return false;
    return true;
  }
  if (a.IsObject()) {
    if (a.MemberCount() != b.MemberCount()) return false;
    for (auto i = a.MemberBegin(), j = b.MemberBegin(); i != a.MemberEnd(); ++i, ++j)
      if (!same_value(i->name, j->name) || !same_value(i->value, j->value)) return false;
    return true;
  }
  return true;  // null, true, false: the same type
}

std::string file_path() {
  return "/dev/shm/lw_metrics_jsonl_fuzz_" + std::to_string(getpid()) + ".jsonl";
}

}  // namespace

LW_FUZZ_INITIALIZE(write_seeds)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  rapidjson::Document doc, again;
  if (!parse_json(text, doc)) {
    rapidjson::StringBuffer out;
    rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator,
                      rapidjson::kWriteNanAndInfFlag>
        writer(out);
    if (!doc.Accept(writer)) longwave::fuzz::fail("a parsed text cannot be written back");
    if (parse_json(std::string_view(out.GetString(), out.GetSize()), again))
      longwave::fuzz::fail("a parsed text written back does not parse");
    if (!same_value(doc, again)) longwave::fuzz::fail("a parsed text written back reads other values");
  }

  const std::string path = file_path();
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  longwave::cli::report::node_metrics m;
  (void)longwave::cli::report::read_metrics_file(path, m);
  ::unlink(path.c_str());
  return 0;
}
