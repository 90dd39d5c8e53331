// `longwave report RUN_DIR`: a real short run turned into one self-contained HTML page, that page rendered by
// Debian's headless Chromium (DOM dump and screenshot), and bad input (no directory, garbage, nothing valid).
#include <fmt/format.h>
#include <sys/stat.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>

#include "tests/support/process.hpp"

using namespace longwave::test;
namespace fs = std::filesystem;

namespace {

// 2 workers, 3 rounds x 5 inner steps, an evaluation every round: a few seconds on 2 cores.
const char* tiny_config = R"(
[model]
preset = "tiny"
seq_len = 64
[train]
workers = 2
inner_steps = 5
rounds = 3
batch_size = 8
warmup_steps = 5
[eval]
every_rounds = 1
batches = 2
[checkpoint]
every_rounds = 1
keep = 3
[metrics]
port = 0
)";

// The report's charts: loss, val perplexity, utilization, stalls, all-reduce seconds, all-reduce bytes.
constexpr size_t n_charts = 6;
const char* const chromium = "/usr/bin/chromium";

// One metrics.jsonl in the SPEC format: `rounds` rounds of `h` steps for `workers` workers from `t0`.
// kill_after > 0: after that round the writer dies mid-line and the run resumes from the round before.
std::string synthetic_metrics(const std::string& node, double t0, int workers, int rounds, int h,
                              int kill_after) {
  std::string out;
  char buf[512];
  double t = t0;
  auto start = [&](int resumed_step) {
    std::snprintf(buf, sizeof buf,
                  "{\"kind\":\"start\",\"ts\":%.3f,\"node\":\"%s\",\"mode\":\"diloco\",\"preset\":\"tiny\","
                  "\"params\":1820000,\"workers\":%d,\"rounds\":%d,\"inner_steps\":%d,\"batch_size\":8,"
                  "\"seq_len\":64,\"inner_lr\":0.004,\"outer_lr\":0.7,\"outer_momentum\":0.9,"
                  "\"comm_dtype\":\"fp32\",\"resumed_step\":%d}\n",
                  t, node.c_str(), workers, rounds, h, resumed_step);
    out += buf;
  };
  start(0);
  bool killed = false;
  for (int r = 1; r <= rounds; ++r) {
    for (int s = 1; s <= h; ++s) {
      const int step = (r - 1) * h + s;
      t += 0.1;
      std::snprintf(buf, sizeof buf,
                    "{\"kind\":\"step\",\"ts\":%.3f,\"step\":%d,\"round\":%d,\"loss\":%.4f,"
                    "\"tokens_per_second\":5000.0}\n",
                    t, step, r, 2.0 + 3.5 / (1 + 0.05 * step) + 0.05 * ((step * 7) % 5));
      out += buf;
    }
    for (int w = 0; w < workers; ++w) {
      std::snprintf(
          buf, sizeof buf,
          "{\"kind\":\"worker\",\"ts\":%.3f,\"round\":%d,\"worker\":%d,\"compute_s\":%.2f,\"wall_s\":2.0,"
          "\"idle_s\":0.3,\"stall_s\":%.2f,\"utilization\":%.3f,\"staleness\":0,\"tokens\":5120,"
          "\"loss\":2.5}\n",
          t, r, w, 1.6 + 0.05 * w, 0.01 * w * (r % 3), (1.6 + 0.05 * w) / 2.0);
      out += buf;
    }
    t += 0.2;
    std::snprintf(
        buf, sizeof buf,
        "{\"kind\":\"allreduce\",\"ts\":%.3f,\"round\":%d,\"seconds\":%.3f,\"bytes_sent\":%d,"
        "\"bytes_received\":7280000,\"dtype\":\"fp32\",\"pseudo_gradient_norm\":0.5,\"update_norm\":0.3}\n",
        t, r, 0.05 + 0.01 * (r % 4), 7280000);
    out += buf;
    const double val_loss = 2.0 + 3.0 / (1 + 0.05 * r * h);
    std::snprintf(
        buf, sizeof buf,
        "{\"kind\":\"eval\",\"ts\":%.3f,\"round\":%d,\"step\":%d,\"val_loss\":%.6f,\"val_ppl\":%.6f}\n", t, r,
        r * h, val_loss, std::exp(val_loss));
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "{\"kind\":\"checkpoint\",\"ts\":%.3f,\"round\":%d,\"step\":%d,\"seconds\":0.05,\"bytes\":"
                  "22000000}\n",
                  t, r, r * h);
    out += buf;
    if (r == kill_after && !killed) {
      killed = true;
      out += "{\"kind\":\"step\",\"ts\":" + std::to_string(t) + ",\"st\n";  // died mid-line
      t += 20;
      r -= 1;  // resumes from the last checkpoint and redoes this round
      start(r * h);
    }
  }
  const double val_loss = 2.0 + 3.0 / (1 + 0.05 * rounds * h);
  std::snprintf(
      buf, sizeof buf,
      "{\"kind\":\"end\",\"ts\":%.3f,\"exit_code\":0,\"val_loss\":%.6f,\"val_ppl\":%.6f,\"seconds\":%.1f,"
      "\"steps\":%d}\n",
      t, val_loss, std::exp(val_loss), t - t0, rounds * h);
  return out + buf;
}

/// Runs `args` in its own process group with stdout and stderr in separate files; the exit code, or -1 after
/// the deadline (the whole group is killed: Chromium starts helper processes).
int run_split(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path,
              double timeout_s) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  int code = -1;
  const bool done = wait_until(
      [&] {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) != pid) return false;
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return true;
      },
      timeout_s);
  if (!done) {
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  return code;
}

std::vector<std::string> chromium_args(const std::string& profile_dir) {
  return {chromium,
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-sync",
          "--hide-scrollbars",
          "--disable-component-update",
          "--user-data-dir=" + profile_dir};
}

/// The DOM of `html_path` after Chromium rendered it.
std::string chromium_dom(const std::string& html_path, const std::string& dir) {
  if (!fs::exists(chromium))
    CATCH_FAIL(
        "headless browser test: /usr/bin/chromium is missing; install Debian's `chromium` package "
        "(apt-get install --no-install-recommends chromium, as scripts/setup does)");
  auto args = chromium_args(dir + "/profile-dom");
  args.push_back("--dump-dom");
  args.push_back("file://" + fs::absolute(html_path).string());
  const int code = run_split(args, dir + "/dom.html", dir + "/chromium-dom.log", 180);
  CATCH_INFO("chromium log: " << read_text(dir + "/chromium-dom.log"));
  CATCH_REQUIRE(code == 0);
  return read_text(dir + "/dom.html");
}

/// Takes a 1280x2000 screenshot; returns the PNG's bytes.
std::string chromium_screenshot(const std::string& html_path, const std::string& png,
                                const std::string& dir) {
  auto args = chromium_args(dir + "/profile-shot");
  args.push_back("--screenshot=" + png);
  args.push_back("--window-size=1280,2000");
  args.push_back("file://" + fs::absolute(html_path).string());
  const int code = run_split(args, dir + "/chromium-shot.out", dir + "/chromium-shot.log", 180);
  CATCH_INFO("chromium log: " << read_text(dir + "/chromium-shot.log"));
  CATCH_REQUIRE(code == 0);
  std::ifstream in(png, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// "x,y" pairs in a points="..." or d="..." attribute value (std::regex would recurse per character here).
size_t count_pairs(const std::string& data) {
  size_t n = 0;
  for (size_t i = 1; i + 1 < data.size(); ++i)
    if (data[i] == ',' && std::isdigit(static_cast<unsigned char>(data[i - 1])) &&
        (std::isdigit(static_cast<unsigned char>(data[i + 1])) || data[i + 1] == '-'))
      ++n;
  return n;
}

/// For every <svg> in a document: how many x,y points its polylines and paths hold.
std::vector<size_t> points_per_svg(const std::string& html) {
  std::vector<size_t> out;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 4)) {
    const size_t end = std::min(html.find("</svg>", at), html.size());
    size_t n = 0;
    for (const char* shape : {"<polyline", "<path"}) {
      for (size_t e = html.find(shape, at); e < end; e = html.find(shape, e + 1)) {
        const size_t tag_end = html.find('>', e);
        const size_t attr = html.find(shape[1] == 'p' && shape[2] == 'o' ? " points=\"" : " d=\"", e);
        if (attr >= tag_end) continue;
        const size_t value = html.find('"', attr) + 1;
        n += count_pairs(html.substr(value, html.find('"', value) - value));
      }
    }
    out.push_back(n);
  }
  return out;
}

// Self-contained: nothing the browser would fetch, no script.
void check_self_contained(const std::string& html) {
  CATCH_CHECK(html.find("http://") == std::string::npos);
  CATCH_CHECK(html.find("https://") == std::string::npos);
  CATCH_CHECK(html.find("<script") == std::string::npos);
  CATCH_CHECK(html.find("<link") == std::string::npos);
  CATCH_CHECK(html.find("<img") == std::string::npos);
  CATCH_CHECK(html.find("@import") == std::string::npos);
  CATCH_CHECK(html.find("src=") == std::string::npos);
  CATCH_CHECK(html.find("href=") == std::string::npos);
}

void check_rendered_charts(const std::string& dom) {
  const auto points = points_per_svg(dom);
  CATCH_CHECK(points.size() >= n_charts);
  for (size_t i = 0; i < points.size(); ++i) {
    CATCH_INFO("svg " << i);
    CATCH_CHECK(points[i] >= 2);
  }
}

}  // namespace

CATCH_TEST_CASE("a run resumed with train.rounds raised and another lr shows its latest session's settings",
                "[process][report]") {
  // A probe: the page showed the first session's rounds ("inner steps per worker 30 of 20") and lr.
  const auto dir = scratch_dir("report-raised");
  auto m = synthetic_metrics("r", 1.7e9, 1, 4, 5, 2);  // 2 sessions
  const auto second = m.find("\"kind\":\"start\"", m.find("\"kind\":\"start\"") + 1);
  CATCH_REQUIRE(second != std::string::npos);
  m.replace(m.find("\"rounds\":4", second), 10, "\"rounds\":6");
  m.replace(m.find("\"inner_lr\":0.004", second), 16, "\"inner_lr\":0.001");
  fs::create_directories(dir + "/r");
  write_text(dir + "/r/metrics.jsonl", m);
  auto [code, out] = run({binary(), "report", dir + "/r"}, dir + "/report.log", 60);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  const auto html = read_text(dir + "/r/report.html");
  CATCH_CHECK(html.find("<tr><th>outer rounds</th><td>6</td>") != std::string::npos);
  CATCH_CHECK(html.find("<tr><th>inner learning rate (AdamW)</th><td>0.001</td>") != std::string::npos);
  CATCH_CHECK(html.find("<tr><th>inner steps per worker</th><td>20 of 30</td>") != std::string::npos);
  // A resume under another H plans its own end (planned_steps): the page shows it, not rounds × H.
  m.replace(m.find("\"resumed_step\"", second), 14, "\"planned_steps\":27,\"resumed_step\"");
  write_text(dir + "/r/metrics.jsonl", m);
  auto [code2, out2] = run({binary(), "report", dir + "/r"}, dir + "/report.log", 60);
  CATCH_INFO(out2);
  CATCH_REQUIRE(code2 == 0);
  CATCH_CHECK(
      read_text(dir + "/r/report.html").find("<tr><th>inner steps per worker</th><td>20 of 27</td>") !=
      std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a run resumed under another train.inner_steps keeps the rounds before its checkpoint",
                "[process][report]") {
  // A probe: rounds 1-4 at H = 3, then 5-6 at H = 5 from the checkpoint of round 4 (step 12). The report took
  // floor(12 / 5) = 2 for the checkpoint's round and dropped rounds 3 and 4 (58.9 % for 48.6 %).
  const auto dir = scratch_dir("report-other-h");
  std::string m;
  const auto start = [&](double ts, int h, int step, int round) {
    m += fmt::format(
        "{{\"kind\":\"start\",\"ts\":{},\"node\":\"r\",\"mode\":\"diloco\",\"workers\":1,\"rounds\":6,"
        "\"inner_steps\":{},\"resumed_step\":{},\"resumed_round\":{}}}\n",
        ts, h, step, round);
  };
  const auto round = [&](double ts, int r, int last_step, double compute) {
    m += fmt::format("{{\"kind\":\"step\",\"ts\":{},\"step\":{},\"round\":{},\"loss\":3.0}}\n", ts, last_step,
                     r);
    m += fmt::format(
        "{{\"kind\":\"worker\",\"ts\":{},\"round\":{},\"worker\":0,\"compute_s\":{},\"wall_s\":2.0,"
        "\"utilization\":{}}}\n",
        ts, r, compute, compute / 2);
  };
  start(100, 3, 0, 0);
  for (int r = 1; r <= 4; ++r) round(100 + r, r, 3 * r, 1.0);  // 50 %
  start(200, 5, 12, 4);
  for (int r = 5; r <= 6; ++r) round(200 + r, r, 12 + 5 * (r - 4), 1.6);  // 80 %
  fs::create_directories(dir + "/r");
  write_text(dir + "/r/metrics.jsonl", m);
  auto [code, out] = run({binary(), "report", dir + "/r"}, dir + "/report.log", 60);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  // Every round: (4 x 1.0 + 2 x 1.6) / 12 s.
  CATCH_CHECK(
      read_text(dir + "/r/report.html").find("<tr><th>average compute utilization</th><td>60.0 %</td>") !=
      std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a real short run gives a self-contained report with its summary values and charts",
                "[process][report]") {
  const auto dir = scratch_dir("report-run");
  const auto run_dir = dir + "/run";
  write_text(dir + "/tiny.toml", "[run]\nout_dir = \"" + run_dir + "\"\n" + tiny_config);
  auto [code, log] = run({binary(), "run", dir + "/tiny.toml"}, dir + "/run.log", 600);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  const auto metrics = read_text(run_dir + "/metrics.jsonl");
  CATCH_INFO("metrics.jsonl:\n" << metrics);
  CATCH_REQUIRE(occurrences(metrics, "\"kind\"") > 15);

  auto [rcode, rlog] = run({binary(), "report", run_dir}, dir + "/report.log", 120);
  CATCH_INFO(rlog);
  CATCH_REQUIRE(rcode == 0);
  CATCH_REQUIRE(fs::exists(run_dir + "/report.html"));
  const auto html = read_text(run_dir + "/report.html");
  check_self_contained(html);
  CATCH_CHECK(occurrences(html, "<svg class=\"chart\"") == n_charts);

  // The summary shows the run's own numbers: val perplexity as in result.json, and the config.
  std::smatch m;
  const auto result = read_text(run_dir + "/result.json");
  CATCH_REQUIRE(std::regex_search(result, m, std::regex("\"val_ppl\": *([0-9.eE+-]+)")));
  char ppl[32];
  std::snprintf(ppl, sizeof ppl, "%.3f", std::stod(m[1]));
  CATCH_INFO("final val ppl " << ppl);
  CATCH_CHECK(html.find(std::string("<td>") + ppl + "</td>") != std::string::npos);
  CATCH_CHECK(html.find("<td>diloco</td>") != std::string::npos);
  CATCH_CHECK(html.find("<td>tiny</td>") != std::string::npos);
  CATCH_CHECK(html.find("<td>8 × 64</td>") != std::string::npos);  // batch size x sequence length
  CATCH_CHECK(html.find("<td>15 of 15</td>") != std::string::npos);
  CATCH_CHECK(html.find("<td>completed</td>") != std::string::npos);
  // Where its rounds waited: the mean of the round records' reducing_s and outer_step_s from round 2 on.
  double reducing = 0, outer = 0;
  int timed = 0;
  const std::regex round_line("\\{\"kind\":\"round\".*\"round\":([0-9]+),.*");
  std::istringstream lines(metrics);
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_match(line, m, round_line) || std::stoi(m[1]) < 2) continue;
    const auto field = [&](const std::string& key) {
      std::smatch f;
      return std::regex_search(line, f, std::regex("\"" + key + "\":([0-9.eE+-]+)")) ? std::stod(f[1]) : 0.0;
    };
    reducing += field("reducing_s"), outer += field("outer_step_s"), ++timed;
  }
  CATCH_REQUIRE(timed == 2);  // rounds 2 and 3
  char wait[64];
  std::snprintf(wait, sizeof wait, "<td>%.3f s, %.3f s</td>", reducing / timed, outer / timed);
  CATCH_CHECK(html.find(std::string("all-reduce, outer step</th>") + wait) != std::string::npos);

  // --out writes elsewhere; the page also renders in a real browser.
  auto [ocode, olog] =
      run({binary(), "report", run_dir, "--out", dir + "/elsewhere.html"}, dir + "/out.log", 120);
  CATCH_INFO(olog);
  CATCH_CHECK(ocode == 0);
  CATCH_CHECK(fs::exists(dir + "/elsewhere.html"));
  check_rendered_charts(chromium_dom(run_dir + "/report.html", dir));
  fs::remove_all(dir);
}

CATCH_TEST_CASE("headless Chromium renders every chart of a resumed two-node run and takes a screenshot",
                "[process][report]") {
  const auto dir = scratch_dir("report-browser");
  const auto run_dir = dir + "/cluster";
  fs::create_directories(run_dir + "/a");
  fs::create_directories(run_dir + "/b");
  // Node a was SIGKILLed mid-line after round 4 and resumed; node b's name needs escaping.
  write_text(run_dir + "/a/metrics.jsonl", synthetic_metrics("a", 1.7e9, 2, 8, 10, 4));
  write_text(run_dir + "/b/metrics.jsonl", synthetic_metrics("b<i>x</i>", 1.7e9 + 0.5, 2, 8, 10, 0));
  auto [code, log] = run({binary(), "report", run_dir}, dir + "/report.log", 120);
  CATCH_INFO(log);
  CATCH_REQUIRE(code == 0);
  const auto html = read_text(run_dir + "/report.html");
  check_self_contained(html);
  CATCH_CHECK(html.find("b&lt;i&gt;x&lt;/i&gt;") != std::string::npos);
  CATCH_CHECK(html.find("<i>x</i>") == std::string::npos);
  CATCH_CHECK(html.find("1 to 2 per node (a node restarted alone") != std::string::npos);  // a alone
  CATCH_CHECK(html.find("80 of 80") != std::string::npos);  // steps are global across the resume

  const auto dom = chromium_dom(run_dir + "/report.html", dir);
  check_rendered_charts(dom);
  CATCH_CHECK(occurrences(dom, "<svg") == n_charts);
  CATCH_CHECK(dom.find("Validation perplexity") != std::string::npos);
  CATCH_CHECK(dom.find("<i>x</i>") == std::string::npos);  // the name stayed text

  // A PNG of the window size, big enough to hold more than a blank page.
  const auto png = chromium_screenshot(run_dir + "/report.html", dir + "/report.png", dir);
  CATCH_REQUIRE(png.size() > 24);
  CATCH_CHECK(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(png[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(png[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(png[at + 3]));
  };
  CATCH_CHECK(be32(16) == 1280);
  CATCH_CHECK(be32(20) == 2000);
  CATCH_CHECK(png.size() > 50000);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "workers on GPUs add their busy time, peak memory and model FLOP/s utilization to the outcome",
    "[process][report]") {
  const auto dir = scratch_dir("report-gpu");
  fs::create_directories(dir + "/cpu");
  fs::create_directories(dir + "/gpu");
  const auto cpu = synthetic_metrics("n0", 1.7e9, 2, 3, 5, 0);
  write_text(dir + "/cpu/metrics.jsonl", cpu);
  // The same run with its workers on GPUs: 1.5 busy seconds of each 2-second round; worker 1's peak is the
  // highest; worker 0's last round 40 % MFU, worker 1's 44 %.
  std::string gpu;
  std::istringstream in(cpu);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"kind\":\"worker\"") != std::string::npos) {
      const bool w1 = line.find("\"worker\":1,") != std::string::npos;
      char fields[160];
      std::snprintf(
          fields, sizeof fields,
          ",\"gpu_busy_s\":1.5,\"gpu_utilization\":0.75,\"gpu_memory_peak_bytes\":%lld,\"mfu\":%.2f",
          w1 ? 21474836480LL : 10737418240LL, w1 ? 0.44 : 0.40);
      line.insert(line.rfind('}'), fields);
    }
    gpu += line + "\n";
  }
  write_text(dir + "/gpu/metrics.jsonl", gpu);
  for (const char* which : {"cpu", "gpu"}) {
    auto [code, log] = run({binary(), "report", dir + "/" + which}, dir + "/" + which + ".log", 60);
    CATCH_INFO(log);
    CATCH_REQUIRE(code == 0);
  }
  const auto with = read_text(dir + "/gpu/report.html"), without = read_text(dir + "/cpu/report.html");
  CATCH_CHECK(with.find("<th>GPU busy / wall time (GPU workers)</th><td>75.0 %</td>") != std::string::npos);
  CATCH_CHECK(with.find("<th>peak GPU memory (one GPU)</th><td>21.47 GB") != std::string::npos);
  CATCH_CHECK(with.find("<th>model FLOP/s utilization (6N, no attention)</th><td>42.0 %</td>") !=
              std::string::npos);
  CATCH_CHECK(without.find("GPU") == std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE("a folder of separate runs is reported as such, not as one cluster's nodes",
                "[process][report]") {
  const auto dir = scratch_dir("report-separate");
  // Start lines as runs write them: a run alone counts its own workers as the cluster's, a node the
  // cluster's.
  const auto with_cluster_workers = [](std::string text, int n) {
    const std::string at = "\"workers\":2,";
    for (auto p = text.find(at); p != std::string::npos; p = text.find(at, p + 1))
      text.insert(p + at.size(), "\"cluster_workers\":" + std::to_string(n) + ",");
    return text;
  };
  for (const auto& [folder, cluster_workers] :
       std::vector<std::pair<std::string, int>>{{"alone", 2}, {"cluster", 4}})
    for (const char* node : {"a", "b"}) {
      fs::create_directories(dir + "/" + folder + "/" + node);
      write_text(dir + "/" + folder + "/" + node + "/metrics.jsonl",
                 with_cluster_workers(synthetic_metrics(node, 1.7e9, 2, 3, 5, 0), cluster_workers));
    }
  auto [acode, alone] = run({binary(), "report", dir + "/alone"}, dir + "/alone.log", 60);
  CATCH_INFO(alone);
  CATCH_REQUIRE(acode == 0);
  CATCH_CHECK(alone.find("holds 2 separate runs (a, b), not one cluster's nodes") != std::string::npos);
  const auto alone_page = read_text(dir + "/alone/report.html");
  CATCH_CHECK(alone_page.find("2 separate runs, not one cluster's nodes") != std::string::npos);
  // Its headline names whose perplexity it shows; the title names what the heading names (both: a probe).
  CATCH_CHECK(alone_page.find("final val perplexity of a<") != std::string::npos);
  CATCH_CHECK(alone_page.find("<title>Longwave report: alone</title>") != std::string::npos);
  CATCH_CHECK(alone_page.find("<h1>Longwave run report: alone</h1>") != std::string::npos);
  auto [ccode, cluster] = run({binary(), "report", dir + "/cluster"}, dir + "/cluster.log", 60);
  CATCH_INFO(cluster);
  CATCH_REQUIRE(ccode == 0);
  CATCH_CHECK(cluster.find("separate runs") == std::string::npos);
  const auto cluster_page = read_text(dir + "/cluster/report.html");
  CATCH_CHECK(cluster_page.find("&middot; 2 nodes") != std::string::npos);
  CATCH_CHECK(cluster_page.find("final val perplexity<") != std::string::npos);  // one theta: the cluster's
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "bad input: a missing directory or file exits 2 naming it, garbage lines are skipped with a warning",
    "[process][report]") {
  const auto dir = scratch_dir("report-bad");
  // No such directory.
  auto [c1, o1] = run({binary(), "report", dir + "/nope"}, dir + "/1.log", 60);
  CATCH_INFO(o1);
  CATCH_CHECK(c1 == 2);
  CATCH_CHECK(o1.find(dir + "/nope") != std::string::npos);
  CATCH_CHECK(occurrences(o1, "error") == 1);

  // A directory without metrics.jsonl.
  fs::create_directories(dir + "/empty");
  auto [c2, o2] = run({binary(), "report", dir + "/empty"}, dir + "/2.log", 60);
  CATCH_INFO(o2);
  CATCH_CHECK(c2 == 2);
  CATCH_CHECK(o2.find(dir + "/empty/metrics.jsonl") != std::string::npos);
  CATCH_CHECK(occurrences(o2, "error") == 1);

  // Garbage between valid lines: skipped with a warning naming the line; a truncated last line is ignored.
  fs::create_directories(dir + "/garbage");
  auto lines = synthetic_metrics("g", 1.7e9, 2, 3, 5, 0);
  const size_t third = lines.find('\n', lines.find('\n') + 1) + 1;
  lines.insert(third, "this is not json\n{\"kind\":\"step\",\"ts\":1,\"loss\":}\n");  // lines 3 and 4
  lines += "{\"kind\":\"step\",\"ts\":1700000100.5,\"step\":16,\"ro";
  write_text(dir + "/garbage/metrics.jsonl", lines);
  auto [c3, o3] = run({binary(), "report", dir + "/garbage"}, dir + "/3.log", 60);
  CATCH_INFO(o3);
  CATCH_CHECK(c3 == 0);
  CATCH_CHECK(o3.find("metrics.jsonl:3:") != std::string::npos);
  CATCH_CHECK(o3.find("metrics.jsonl:4:") != std::string::npos);
  CATCH_CHECK(occurrences(o3, "warning") == 2);
  CATCH_CHECK(fs::exists(dir + "/garbage/report.html"));
  CATCH_CHECK(read_text(dir + "/garbage/report.html").find("2 malformed lines skipped") != std::string::npos);
  // A run's own file is the run: a folder under it with another metrics.jsonl is not a second node (its
  // totals were added twice).
  fs::create_directories(dir + "/garbage/copy");
  fs::copy_file(dir + "/garbage/metrics.jsonl", dir + "/garbage/copy/metrics.jsonl");
  auto [c11, o11] = run({binary(), "report", dir + "/garbage"}, dir + "/11.log", 60);
  CATCH_INFO(o11);
  CATCH_CHECK(c11 == 0);
  CATCH_CHECK(o11.find("records from 1 file)") != std::string::npos);

  // metrics.jsonl that is a directory: named as such (it said "not found").
  fs::create_directories(dir + "/odd/metrics.jsonl");
  auto [c12, o12] = run({binary(), "report", dir + "/odd"}, dir + "/12.log", 60);
  CATCH_INFO(o12);
  CATCH_CHECK(c12 == 2);
  CATCH_CHECK(o12.find(dir + "/odd/metrics.jsonl: is a directory") != std::string::npos);

  // Numbers beyond any run's (every all-reduce in round 1e30): the charts' axes still end, without NaN ticks.
  fs::create_directories(dir + "/huge");
  std::string huge;
  std::istringstream plain(synthetic_metrics("h", 1.7e9, 2, 3, 5, 0));
  for (std::string line; std::getline(plain, line);) {
    if (line.find("\"kind\":\"allreduce\"") != std::string::npos) {
      const size_t at = line.find("\"round\":") + 8;
      line.replace(at, line.find(',', at) - at, "1e30");
    }
    huge += line + "\n";
  }
  CATCH_REQUIRE(huge.find("\"round\":1e30") != std::string::npos);
  write_text(dir + "/huge/metrics.jsonl", huge);
  auto [c9, o9] = run({binary(), "report", dir + "/huge"}, dir + "/9.log", 60);
  CATCH_INFO(o9);
  CATCH_CHECK(c9 == 0);
  CATCH_CHECK(read_text(dir + "/huge/report.html").find("nan\"") == std::string::npos);  // x="-nan"

  // A diverged run: its losses are there, none finite; the chart says so rather than "no records".
  fs::create_directories(dir + "/diverged");
  std::string diverged;
  std::istringstream steps(synthetic_metrics("d", 1.7e9, 2, 3, 5, 0));
  for (std::string line; std::getline(steps, line);) {
    for (const std::string key : {"\"loss\":", "\"val_loss\":"})
      if (const size_t at = line.find(key);
          at != std::string::npos && line.rfind("{\"kind\":\"worker\"", 0) != 0)
        line.replace(at + key.size(), line.find_first_of(",}", at) - at - key.size(), "null");
    diverged += line + "\n";
  }
  write_text(dir + "/diverged/metrics.jsonl", diverged);
  auto [c10, o10] = run({binary(), "report", dir + "/diverged"}, dir + "/10.log", 60);
  CATCH_INFO(o10);
  CATCH_CHECK(c10 == 0);
  CATCH_CHECK(read_text(dir + "/diverged/report.html").find("<b>Loss</b>None of its 18 values") !=
              std::string::npos);

  // A writer killed mid-line, the resumed run's first record on the same line: the record is kept. A line of
  // nested records that never closes is skipped like any malformed line.
  fs::create_directories(dir + "/partial");
  lines = synthetic_metrics("p", 1.7e9, 2, 3, 5, 0);
  const size_t second = lines.find('\n') + 1;
  lines.insert(second, "{\"kind\":\"step\",\"ts\":1,\"st{\"kind\":\"membership\",\"ts\":1700000000.5}\n");
  std::string nested;
  for (int i = 0; i < 2000; ++i) nested += "{\"kind\":";
  lines.insert(second, nested + "\n");
  write_text(dir + "/partial/metrics.jsonl", lines);
  auto [c6, o6] = run({binary(), "report", dir + "/partial"}, dir + "/6.log", 60);
  CATCH_INFO(o6);
  CATCH_CHECK(c6 == 0);
  CATCH_CHECK(o6.find("metrics.jsonl:2: skipped a malformed line") != std::string::npos);
  CATCH_CHECK(o6.find("metrics.jsonl:3: skipped a partial record before column 26") != std::string::npos);
  CATCH_CHECK(occurrences(o6, "warning") == 2);

  // A clock set back during a resumed run: its end record, stamped before the last start, still ends it (the
  // file's order says so; it read "no end record").
  fs::create_directories(dir + "/clock");
  lines = synthetic_metrics("k", 1.7e9, 2, 3, 5, 2);
  const size_t end_ts = lines.rfind("{\"kind\":\"end\",\"ts\":") + 19;
  lines.replace(end_ts, lines.find(',', end_ts) - end_ts, "1600000000.000");
  write_text(dir + "/clock/metrics.jsonl", lines);
  auto [c13, o13] = run({binary(), "report", dir + "/clock"}, dir + "/13.log", 60);
  CATCH_INFO(o13);
  CATCH_CHECK(c13 == 0);
  CATCH_CHECK(read_text(dir + "/clock/report.html").find("<td>completed</td>") != std::string::npos);

  // Nothing valid at all, and an empty file.
  fs::create_directories(dir + "/junk");
  write_text(dir + "/junk/metrics.jsonl", "garbage\n<html>\n{\"kind\":\n");
  auto [c4, o4] = run({binary(), "report", dir + "/junk"}, dir + "/4.log", 60);
  CATCH_INFO(o4);
  CATCH_CHECK(c4 == 2);
  CATCH_CHECK(o4.find(dir + "/junk/metrics.jsonl") != std::string::npos);
  CATCH_CHECK(o4.find("no valid metrics line") != std::string::npos);
  CATCH_CHECK_FALSE(fs::exists(dir + "/junk/report.html"));
  // What it holds is said, not "the file is empty" (a probe: a truncated line, or blank lines).
  write_text(dir + "/junk/metrics.jsonl", "\n  \n{\"kind\":\"start\",\"ts\":1");
  auto [c4b, o4b] = run({binary(), "report", dir + "/junk"}, dir + "/4b.log", 60);
  CATCH_INFO(o4b);
  CATCH_CHECK(c4b == 2);
  CATCH_CHECK(o4b.find("no valid metrics line (a truncated last line, 2 blank lines)") != std::string::npos);
  write_text(dir + "/junk/metrics.jsonl", "");
  auto [c5, o5] = run({binary(), "report", dir + "/junk"}, dir + "/5.log", 60);
  CATCH_INFO(o5);
  CATCH_CHECK(c5 == 2);
  CATCH_CHECK(o5.find("empty") != std::string::npos);

  // A cluster with one node's file empty: the others are reported, that node named and left out.
  fs::create_directories(dir + "/cl/a");
  fs::create_directories(dir + "/cl/b");
  write_text(dir + "/cl/a/metrics.jsonl", synthetic_metrics("a", 1.7e9, 2, 3, 5, 0));
  write_text(dir + "/cl/b/metrics.jsonl", "");
  auto [c7, o7] = run({binary(), "report", dir + "/cl"}, dir + "/7.log", 60);
  CATCH_INFO(o7);
  CATCH_CHECK(c7 == 0);
  CATCH_CHECK(o7.find(dir +
                      "/cl/b/metrics.jsonl: no valid metrics line (the file is empty); that node is left "
                      "out") != std::string::npos);
  CATCH_CHECK(o7.find("from 1 file; 1 left out)") != std::string::npos);
  CATCH_CHECK(fs::exists(dir + "/cl/report.html"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a cluster's status is its coordinator's end: a node removed on the way, steps a joiner fetched, async "
    "rounds",
    "[process][report]") {
  const auto dir = scratch_dir("report-cluster-end");
  for (const char* n : {"a", "b", "c"}) fs::create_directories(dir + "/cl/" + n);
  write_text(dir + "/cl/a/metrics.jsonl", synthetic_metrics("a", 1.7e9, 1, 3, 5, 0));
  write_text(dir + "/cl/b/metrics.jsonl", synthetic_metrics("b", 1.7e9, 1, 3, 5, 0));
  // c: killed (no end record), and steps 6 to 10 were never its own (a joiner fetches the others' state).
  std::string c;
  std::istringstream lines(synthetic_metrics("c", 1.7e9, 1, 3, 5, 0));
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find("\"kind\":\"step\",");
    const int step =
        at == std::string::npos ? 0 : std::stoi(line.substr(line.find("\"step\":", at + 12) + 7));
    if (line.find("\"kind\":\"end\"") == std::string::npos && (step < 6 || step > 10)) c += line + "\n";
  }
  write_text(dir + "/cl/c/metrics.jsonl", c);
  write_text(dir + "/cl/coordinator.jsonl",
             "{\"kind\":\"start\",\"ts\":1700000000.0,\"term\":256,\"nodes\":\"a,b,c\",\"min_nodes\":1}\n"
             "{\"kind\":\"removed\",\"ts\":1700000001.0,\"node\":\"c\",\"reason\":\"lost\",\"epoch\":1}\n"
             "{\"kind\":\"end\",\"ts\":1700000009.0,\"outcome\":\"finished\",\"exit_code\":0,"
             "\"finished\":\"a,b\",\"removed\":\"c:lost\",\"epoch\":2}\n");
  const auto report_of = [&](const std::string& sub) {  // the page, once the report succeeded
    auto [code, out] = run({binary(), "report", dir + "/" + sub}, dir + "/" + sub + ".log", 60);
    CATCH_INFO(out);
    CATCH_REQUIRE(code == 0);
    return read_text(dir + "/" + sub + "/report.html");
  };
  const auto html = report_of("cl");
  CATCH_CHECK(html.find("<tr><th>status</th><td>completed; removed on the way: c (lost)</td>") !=
              std::string::npos);  // it read "no end record (still running, or killed)"
  CATCH_CHECK(html.find("<td>removed (lost)</td>") != std::string::npos);
  CATCH_CHECK(html.find("<td>15 (10 trained here)</td>") != std::string::npos);
  // diloco.outer = "async": train.rounds counts versions, so no "of rounds x H".
  fs::create_directories(dir + "/async");
  write_text(dir + "/async/metrics.jsonl",
             synthetic_metrics("s", 1.7e9, 1, 3, 5, 0) +
                 "{\"kind\":\"contribution\",\"ts\":1700000010.0,\"phase\":3,\"tokens\":2560,"
                 "\"steps_per_second\":5.0}\n");
  CATCH_CHECK(report_of("async").find("<tr><th>inner steps per worker</th><td>15</td>") != std::string::npos);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "report --out writes through a link and never over its input, a file that is not a page, a "
    "pipe or a directory",
    "[process][report]") {
  const auto dir = scratch_dir("report-out");
  fs::create_directories(dir + "/partial");
  const std::string input = dir + "/partial/metrics.jsonl";
  write_text(input, synthetic_metrics("p", 1.7e9, 2, 3, 5, 0));
  const std::string before = read_text(input);
  auto report_to = [&](const std::string& out, const std::string& name) {
    return run({binary(), "report", dir + "/partial", "--out", out}, dir + "/" + name + ".log", 60);
  };
  auto [c1, o1] = report_to(input, "out-input");
  CATCH_INFO(o1);
  CATCH_CHECK(c1 == 2);
  CATCH_CHECK(o1.find("which the report reads") != std::string::npos);
  CATCH_CHECK(read_text(input) == before);
  write_text(dir + "/notes.txt", "my notes\n");
  auto [c2, o2] = report_to(dir + "/notes.txt", "out-notes");
  CATCH_INFO(o2);
  CATCH_CHECK(c2 == 2);
  CATCH_CHECK(o2.find("exists and is not an HTML page") != std::string::npos);
  CATCH_CHECK(read_text(dir + "/notes.txt") == "my notes\n");
  CATCH_REQUIRE(::mkfifo((dir + "/pipe").c_str(), 0600) == 0);
  auto [c3, o3] = report_to(dir + "/pipe", "out-pipe");
  CATCH_INFO(o3);
  CATCH_CHECK(c3 == 2);
  CATCH_CHECK(o3.find("is not a regular file") != std::string::npos);
  CATCH_CHECK(fs::is_fifo(dir + "/pipe"));
  auto [c4, o4] = report_to(dir + "/partial", "out-dir");
  CATCH_CHECK(c4 == 2);
  CATCH_CHECK(o4.find("is a directory") != std::string::npos);
  auto [c5, o5] = report_to("", "out-empty");
  CATCH_INFO(o5);
  CATCH_CHECK(c5 == 2);
  CATCH_CHECK(o5.find("--out") != std::string::npos);
  // A file where its directory should be is named as such (it said the directory does not exist).
  auto [c8, o8] = report_to(dir + "/notes.txt/page.html", "out-under-file");
  CATCH_CHECK(c8 == 2);
  CATCH_CHECK(o8.find(dir + "/notes.txt is a file, not a directory") != std::string::npos);
  // Without --out the line names the page, not an --out the user did not give.
  fs::create_directories(dir + "/partial/report.html");
  auto [c9, o9] = run({binary(), "report", dir + "/partial"}, dir + "/default-dir.log", 60);
  CATCH_INFO(o9);
  CATCH_CHECK(c9 == 2);
  CATCH_CHECK(o9.find("the page " + dir + "/partial/report.html: is a directory") != std::string::npos);
  CATCH_CHECK(o9.find("--out") == std::string::npos);
  fs::remove(dir + "/partial/report.html");
  // Through a link: the link stays, its target gets the page.
  fs::create_directories(dir + "/pages");
  fs::create_symlink(dir + "/pages/page.html", dir + "/link.html");
  auto [c6, o6] = report_to(dir + "/link.html", "out-link");
  CATCH_INFO(o6);
  CATCH_CHECK(c6 == 0);
  CATCH_CHECK(fs::is_symlink(dir + "/link.html"));
  CATCH_CHECK(read_text(dir + "/pages/page.html").rfind("<!DOCTYPE html", 0) == 0);
  auto [c7, o7] = report_to(dir + "/link.html", "out-link-again");  // an earlier page is replaced
  CATCH_CHECK(c7 == 0);
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "a cluster started over is reported as its newest run, without an earlier run's node, and each session's "
    "memberships are their own rows",
    "[process][report]") {
  const auto dir = scratch_dir("report-fresh");
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  // After each start line, the membership that session entered: a resumed cluster's coordinator counts its
  // epochs from 1 again.
  const auto with_memberships = [](const std::string& text, const std::vector<std::string>& entered) {
    std::string out;
    std::istringstream in(text);
    size_t n = 0;
    for (std::string line; std::getline(in, line);) {
      out += line + "\n";
      if (line.find("\"kind\":\"start\"") != std::string::npos && n < entered.size())
        out += "{\"kind\":\"membership\",\"ts\":" + line.substr(line.find("\"ts\":") + 5, 14) +
               ",\"epoch\":1,\"rank\":0,\"members\":\"" + entered[n] +
               "\",\"kept_round\":" + std::to_string(n) + ",\"kept_fragment\":0}\n";
      n += line.find("\"kind\":\"start\"") != std::string::npos;
    }
    return out;
  };
  // A run of 3 rounds on a, b and c, then one of 4 rounds, resumed once, on a and b (c gone from the cluster
  // file): b's file is new (--fresh deletes it); a's holds both runs (one stopped before its first
  // checkpoint also starts again from step 0).
  for (const char* n : {"a", "b", "c"}) {
    fs::create_directories(dir + "/cl/" + n);
    const auto earlier = with_memberships(synthetic_metrics(n, 1.7e9, 1, 3, 5, 0), {"a,b,c"});
    const auto newest = with_memberships(synthetic_metrics(n, 1.7e9 + 1000, 1, 4, 5, 2), {"a,b", "a,b"});
    const std::string node = n;
    write_text(dir + "/cl/" + n + "/metrics.jsonl", node == "a"   ? earlier + newest
                                                    : node == "b" ? newest
                                                                  : earlier);
  }
  auto [code, out] = run({binary(), "report", dir + "/cl"}, dir + "/report.log", 60);
  CATCH_INFO(out);
  CATCH_REQUIRE(code == 0);
  CATCH_CHECK(has(out, dir + "/cl/a/metrics.jsonl: left out 1 earlier run in this file"));
  CATCH_CHECK_FALSE(has(out, dir + "/cl/b/metrics.jsonl: left out"));
  CATCH_CHECK(has(out, dir + "/cl/c/metrics.jsonl: left out: its records end at"));
  const auto html = read_text(dir + "/cl/report.html");
  CATCH_CHECK(has(html, "&middot; 2 nodes"));
  CATCH_CHECK(has(html, "<tr><th>started</th><td>2023-11-14 22:30:00 UTC</td>"));  // the newest run's start
  CATCH_CHECK(has(html, "<tr><th>sessions</th><td>2 (resumed once)</td>"));        // 3 with the earlier run
  CATCH_CHECK(has(html, "<td>20 of 20</td>"));
  // Both sessions' epoch 1, in time order; the earlier run's is gone.
  CATCH_CHECK(occurrences(html, "<tr><th>1</th>") == 2);
  CATCH_CHECK(has(html, "<td>a,b</td><td>0, 0</td>"));
  CATCH_CHECK(html.find("<td>a,b</td><td>0, 0</td>") < html.find("<td>a,b</td><td>1, 0</td>"));
  CATCH_CHECK_FALSE(has(html, "a,b,c"));

  // A node killed before its first checkpoint that joins the running cluster again starts from step 0 too,
  // but goes on in the same run: its first session stays.
  fs::create_directories(dir + "/rejoin/a");
  auto again = synthetic_metrics("a", 1.7e9 + 1000, 1, 4, 5, 0);
  const auto first_start = again.find("\"resumed_step\":0}");
  CATCH_REQUIRE(first_start != std::string::npos);
  again.replace(first_start, 17, "\"resumed_step\":0,\"joined\":true}");
  write_text(dir + "/rejoin/a/metrics.jsonl", synthetic_metrics("a", 1.7e9, 1, 3, 5, 0) + again);
  auto [rcode, rout] = run({binary(), "report", dir + "/rejoin"}, dir + "/rejoin.log", 60);
  CATCH_INFO(rout);
  CATCH_REQUIRE(rcode == 0);
  CATCH_CHECK_FALSE(has(rout, "left out"));
  CATCH_CHECK(has(read_text(dir + "/rejoin/report.html"), "<tr><th>sessions</th><td>2 (resumed once)</td>"));
  fs::remove_all(dir);
}
