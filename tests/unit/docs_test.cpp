// The documents hold together: every relative link in README.md, ARCHITECTURE.md, docs/ and bench/RESULTS.md
// resolves (the file, and the heading an anchor names), every config key of the schema is a row of a
// chapter's settings table and every such row names a real key, each chapter has its three parts in order,
// and README.md and ARCHITECTURE.md stay short.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/schema.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path root = LW_SOURCE_DIR;

/// The chapters, docs/NN-name.md, in order.
std::vector<fs::path> chapters() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// A file's lines outside fenced code blocks (inside ones become empty, so line numbers hold).
std::vector<std::string> prose_lines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  bool fenced = false;
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 3, "```") == 0) {
      fenced = !fenced;
      out.emplace_back();
      continue;
    }
    out.push_back(fenced ? std::string() : line);
  }
  return out;
}

/// `line` without its inline code spans, whose brackets are not links.
std::string without_code(const std::string& line) {
  std::string out;
  bool code = false;
  for (char c : line) {
    if (c == '`')
      code = !code;
    else if (!code)
      out += c;
  }
  return out;
}

/// GitHub's anchor for a heading: lower case, spaces to '-', punctuation dropped (letters of other scripts,
/// such as Greek, kept), "-1", "-2" after repeats.
std::string slug_of(const std::string& heading) {
  std::string out;
  for (size_t i = 0; i < heading.size(); ++i) {
    const auto c = static_cast<unsigned char>(heading[i]);
    if (c < 0x80) {
      if (std::isalnum(c))
        out += static_cast<char>(std::tolower(c));
      else if (c == ' ' || c == '-')
        out += '-';
      else if (c == '_')
        out += '_';
      continue;
    }
    // A UTF-8 sequence: kept when it is a Latin-1 or Greek letter (U+00C0..U+03FF but not × and ÷).
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    const auto seq = heading.substr(i, len);
    unsigned cp = 0;
    if (len == 2 && i + 1 < heading.size())
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(heading[i + 1]) & 0x3Fu);
    if (cp >= 0xC0 && cp <= 0x3FF && cp != 0xD7 && cp != 0xF7) out += seq;
    i += len - 1;
  }
  return out;
}

/// The anchors of a markdown file's headings.
std::set<std::string> anchors_of(const fs::path& file) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  for (const auto& line : prose_lines(file)) {
    if (line.empty() || line[0] != '#') continue;
    const auto text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    auto base = slug_of(line.substr(text + 1));
    const int n = seen[base]++;
    out.insert(n == 0 ? base : base + "-" + std::to_string(n));
  }
  return out;
}

struct link {
  fs::path file;
  size_t line;
  std::string target;
};

/// Every inline link `[text](target)` and reference definition `[id]: target` outside code.
std::vector<link> links_of(const fs::path& file) {
  static const std::regex inline_link(R"(\]\(([^)\s]+)(\s+"[^"]*")?\))");
  static const std::regex definition(R"(^\s*\[[^\]]+\]:\s*(\S+))");
  std::vector<link> out;
  const auto lines = prose_lines(file);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto text = without_code(lines[i]);
    for (std::sregex_iterator m(text.begin(), text.end(), inline_link), end; m != end; ++m)
      out.push_back({file, i + 1, (*m)[1].str()});
    std::smatch d;
    if (std::regex_search(text, d, definition)) out.push_back({file, i + 1, d[1].str()});
  }
  return out;
}

/// What is wrong with a link, or "" when it resolves.
std::string problem_of(const link& l) {
  const auto& t = l.target;
  if (t.find("://") != std::string::npos || t.rfind("mailto:", 0) == 0) return "";
  const auto hash = t.find('#');
  const std::string path = t.substr(0, hash);
  const std::string anchor = hash == std::string::npos ? "" : t.substr(hash + 1);
  const fs::path target = path.empty() ? l.file : (l.file.parent_path() / path).lexically_normal();
  if (!fs::exists(target)) return "no such file " + target.lexically_relative(root).string();
  if (!anchor.empty() && target.extension() == ".md" && !anchors_of(target).count(anchor))
    return "no heading #" + anchor + " in " + target.lexically_relative(root).string();
  return "";
}

/// Every config key of the schema, "section.key".
std::set<std::string> schema_keys() {
  std::set<std::string> keys;
  longwave::config::train_config cfg;
  longwave::config::for_each_field(cfg, [&](std::string_view s, std::string_view n, auto&, const auto&) {
    keys.insert(std::string(s) + "." + std::string(n));
  });
  return keys;
}

}  // namespace

CATCH_TEST_CASE("every relative link in README.md, ARCHITECTURE.md, docs/ and bench/RESULTS.md resolves",
                "[docs]") {
  std::vector<fs::path> files = {root / "README.md", root / "ARCHITECTURE.md", root / "bench" / "RESULTS.md"};
  for (const auto& c : chapters()) files.push_back(c);
  size_t checked = 0;
  std::vector<std::string> broken;
  for (const auto& f : files) {
    CATCH_REQUIRE(fs::exists(f));
    for (const auto& l : links_of(f)) {
      ++checked;
      if (const auto p = problem_of(l); !p.empty())
        broken.push_back(f.lexically_relative(root).string() + ":" + std::to_string(l.line) + ": (" +
                         l.target + ") " + p);
    }
  }
  std::ostringstream list;
  for (const auto& b : broken) list << "\n  " << b;
  CATCH_INFO(broken.size() << " broken links:" << list.str());
  CATCH_CHECK(broken.empty());
  CATCH_CHECK(checked > 50);  // the README links every chapter; the chapters link each other and the code
}

CATCH_TEST_CASE("the link check itself: GitHub's anchors, code left alone, a missing file or heading named",
                "[docs]") {
  CATCH_CHECK(slug_of("Outer-step policies (`[diloco] outer`)") == "outer-step-policies-diloco-outer");
  CATCH_CHECK(slug_of("One sync round, hop by hop (a cluster node)") ==
              "one-sync-round-hop-by-hop-a-cluster-node");
  CATCH_CHECK(slug_of("θ and the outer step — in short") == "θ-and-the-outer-step--in-short");
  CATCH_CHECK(slug_of("2. Policies") == "2-policies");
  const fs::path dir = fs::temp_directory_path() / "lw_docs_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream md(dir / "a.md");
    md << "# Title\n\n## Part\n\n## Part\n\nSee [b](b.md), [the part](#part-1), [gone](#nowhere), "
          "[missing](c.md) and `[not a link](x.md)`.\n\n```\n[in code](y.md)\n# not a heading\n```\n"
          "[ref]: b.md#title\n";
    std::ofstream(dir / "b.md") << "# Title\n";
  }
  std::vector<std::string> targets, problems;
  for (const auto& l : links_of(dir / "a.md")) {
    targets.push_back(l.target);
    problems.push_back(problem_of(l));
  }
  CATCH_CHECK(targets == std::vector<std::string>{"b.md", "#part-1", "#nowhere", "c.md", "b.md#title"});
  CATCH_CHECK(problems[0].empty());
  CATCH_CHECK(problems[1].empty());
  CATCH_CHECK(problems[2] == "no heading #nowhere in " + (dir / "a.md").lexically_relative(root).string());
  CATCH_CHECK(problems[3].rfind("no such file", 0) == 0);
  CATCH_CHECK(problems[4].empty());
  CATCH_CHECK_FALSE(anchors_of(dir / "a.md").count("not-a-heading"));
  fs::remove_all(dir);
}

CATCH_TEST_CASE(
    "every config key of the schema is a row of a chapter's settings table, and every row is a key",
    "[docs]") {
  const auto keys = schema_keys();
  std::set<std::string> sections;
  for (const auto& k : keys) sections.insert(k.substr(0, k.find('.')));
  // A settings row: "| `section.key` | default | meaning |".
  static const std::regex row(R"(^\|\s*`([a-z_]+)\.([a-z_0-9]+)`\s*\|)");
  std::set<std::string> documented;
  std::vector<std::string> unknown;
  for (const auto& c : chapters()) {
    const auto lines = prose_lines(c);
    bool settings = false;  // inside "## Settings", up to the next "## "
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind("## ", 0) == 0) settings = lines[i] == "## Settings";
      std::smatch m;
      if (!settings || !std::regex_search(lines[i], m, row)) continue;
      const auto key = m[1].str() + "." + m[2].str();
      if (keys.count(key))
        documented.insert(key);
      else if (sections.count(m[1].str()))  // a config section's row naming no key: stale, or misspelt
        unknown.push_back(c.filename().string() + ":" + std::to_string(i + 1) + ": " + key);
    }
  }
  std::vector<std::string> missing;
  std::set_difference(keys.begin(), keys.end(), documented.begin(), documented.end(),
                      std::back_inserter(missing));
  std::ostringstream m, u;
  for (const auto& k : missing) m << " " << k;
  for (const auto& k : unknown) u << "\n  " << k;
  CATCH_INFO("keys without a settings row:" << m.str());
  CATCH_CHECK(missing.empty());
  CATCH_INFO("rows that name no config key:" << u.str());
  CATCH_CHECK(unknown.empty());
  CATCH_CHECK(keys.size() > 80);
}

CATCH_TEST_CASE("README.md and ARCHITECTURE.md stay short: detail goes to the chapters", "[docs]") {
  const auto lines = [](const fs::path& f) {
    std::ifstream in(f);
    size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  CATCH_CHECK(lines(root / "README.md") <= 160);        // issue 40: about 150 lines
  CATCH_CHECK(lines(root / "ARCHITECTURE.md") <= 250);  // issue 40: at most 250 lines
}

CATCH_TEST_CASE("each chapter opens with what a user does, then what happens, then its settings", "[docs]") {
  const auto cs = chapters();
  CATCH_REQUIRE(cs.size() >= 10);
  for (const auto& c : cs) {
    CATCH_INFO(c.filename().string());
    CATCH_CHECK(std::regex_match(c.filename().string(), std::regex(R"(\d\d-[a-z0-9-]+\.md)")));
    std::vector<std::string> parts;
    for (const auto& line : prose_lines(c))
      if (line == "## What you do" || line == "## What happens" || line == "## Settings")
        parts.push_back(line);
    CATCH_CHECK(parts == std::vector<std::string>{"## What you do", "## What happens", "## Settings"});
    // Its title carries its number: "# 3. Communication".
    const auto lines = prose_lines(c);
    CATCH_REQUIRE_FALSE(lines.empty());
    const auto number = std::to_string(std::stoi(c.filename().string().substr(0, 2)));
    CATCH_CHECK(lines[0].rfind("# " + number + ". ", 0) == 0);
  }
}
