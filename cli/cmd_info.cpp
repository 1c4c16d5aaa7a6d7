// `sinkattn info`: version, backends compiled in, devices, dtypes, head dims, the kernel families with when each
// runs and the environment switches, as tables of at most 100 columns (kWidth). Everything but the version comes
// from the library through the C ABI (sinkattn_backend_describe, sinkattn_backend_kernel_families,
// sinkattn_backend_switches), so the command describes the library it runs against.
//   --verbose             the full rule of every kernel family and what every switch is for
//   --json                all of it as one JSON object
//   --switches-markdown   the switch table as markdown (docs/DESIGN.md's "Environment switches" section is this
//                         output; tests/cli/check_info.py checks that they are equal)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"

extern char** environ;
#include "device.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

namespace {

constexpr size_t kWidth = 100;  // columns of every line printed (but --json and --switches-markdown)

struct Topic {
  std::string label, text;
};
// A backend as the library describes it.
struct BackendInfo {
  std::string name;
  bool compiled_in = false;
  std::string summary;
  std::vector<Topic> topics;  // "device 0", "dtypes", "head dims", "features", ...
  const sinkattn_kernel_family_t* families = nullptr;
  int n_families = 0;
  const sinkattn_switch_t* switches = nullptr;
  int n_switches = 0;
};

// The describe text: a first line "NAME: summary", then one indented "TOPIC: text" line per topic
// (sinkattn_backend_describe in sinkattn.h).
BackendInfo backend_info(sinkattn_backend_t b, const char* name) {
  BackendInfo info;
  info.name = name;
  info.compiled_in = sinkattn_backend_available(b) != 0;
  if (!info.compiled_in) return info;
  std::vector<char> buf(1 << 16, '\0');
  sinkattn_backend_describe(b, buf.data(), buf.size());
  const std::string text(buf.data());
  size_t pos = 0;
  bool first = true;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t lead = line.find_first_not_of(' ');
    if (lead == std::string::npos) continue;
    line = line.substr(lead);
    const size_t colon = line.find(": ");
    if (first) {
      info.summary = colon == std::string::npos ? line : line.substr(colon + 2);
      first = false;
    } else if (colon == std::string::npos) {
      info.topics.push_back({"", line});
    } else {
      info.topics.push_back({line.substr(0, colon), line.substr(colon + 2)});
    }
  }
  info.n_families = sinkattn_backend_kernel_families(b, &info.families);
  info.n_switches = sinkattn_backend_switches(b, &info.switches);
  return info;
}

std::vector<BackendInfo> all_backends() {
  return {backend_info(SINKATTN_BACKEND_CPU, "cpu"), backend_info(SINKATTN_BACKEND_CUDA, "cuda")};
}

// Words of `text` in lines of at most `width` characters (a longer word is cut).
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::string line;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = text.find_first_not_of(' ', pos);
    if (start == std::string::npos) break;
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(start, end - start);
    pos = end;
    while (word.size() > width) {
      if (!line.empty()) lines.push_back(std::move(line));
      line.clear();
      lines.push_back(word.substr(0, width));
      word = word.substr(width);
    }
    if (line.empty()) {
      line = word;
    } else if (line.size() + 1 + word.size() <= width) {
      line += ' ' + word;
    } else {
      lines.push_back(std::move(line));
      line = word;
    }
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

// Rows of fixed-width columns, the last one wrapped to what is left of kWidth; a cell too long for its column
// takes its own line and the row goes on below it.
class Table {
 public:
  explicit Table(std::vector<size_t> widths) : widths_(std::move(widths)) {}
  void row(const std::vector<std::string>& cells) const {
    size_t used = 0;
    for (size_t w : widths_) used += w + 2;
    const size_t last = kWidth - used;
    std::string prefix;
    for (size_t i = 0; i < widths_.size(); ++i) {
      const std::string& c = cells[i];
      if (c.size() > widths_[i]) {
        std::printf("%s%s\n", prefix.c_str(), c.c_str());
        prefix.assign(prefix.size() + widths_[i] + 2, ' ');
      } else {
        prefix += c + std::string(widths_[i] + 2 - c.size(), ' ');
      }
    }
    const std::vector<std::string> lines = wrap(cells.back(), last);
    for (size_t i = 0; i < lines.size(); ++i)
      std::printf("%s%s\n", i == 0 ? prefix.c_str() : std::string(used, ' ').c_str(), lines[i].c_str());
  }

 private:
  std::vector<size_t> widths_;  // every column but the last
};

// A switch as its table shows it: NAME=VALUES.
std::string switch_spelling(const sinkattn_switch_t& s) { return std::string(s.name) + "=" + s.values; }

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// SINKATTN_CUDA_* variables set in this process that no backend reads (a removed switch, a misspelling): the library
// ignores them, so the command says so.
std::vector<std::string> unknown_switches_set(const std::vector<BackendInfo>& backends) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    if (kv.rfind("SINKATTN_CUDA_", 0) != 0) continue;
    const std::string name = kv.substr(0, kv.find('='));
    bool known = false;
    for (const auto& b : backends)
      for (int i = 0; i < b.n_switches; ++i) known = known || name == b.switches[i].name;
    if (!known) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `text` wrapped to kWidth: the first line after `first`, the others after as many spaces.
void print_paragraph(const std::string& first, const std::string& text) {
  const std::vector<std::string> lines = wrap(text, kWidth - first.size());
  for (size_t i = 0; i < lines.size(); ++i)
    std::printf("%s%s\n", i == 0 ? first.c_str() : std::string(first.size(), ' ').c_str(), lines[i].c_str());
}

void print_tables(const std::vector<BackendInfo>& backends, bool verbose) {
  std::printf("sinkattn %s (C ABI %d.%d.%d); this command built %s CUDA\n", sinkattn_version(),
              SINKATTN_VERSION_MAJOR, SINKATTN_VERSION_MINOR, SINKATTN_VERSION_PATCH,
              cli_built_with_cuda() ? "with" : "without");

  std::printf("\n");
  const Table topics({7, 10});
  topics.row({"backend", "", "devices, dtypes, head dims, features"});
  for (const auto& b : backends) {
    if (!b.compiled_in) {
      topics.row({b.name, "", "not compiled into this library"});
      continue;
    }
    topics.row({b.name, "", b.summary});
    for (const auto& t : b.topics) topics.row({"", t.label, t.text});
  }

  std::printf("\n");
  size_t name_w = 13;
  for (const auto& b : backends)
    for (int i = 0; i < b.n_families; ++i) name_w = std::max(name_w, std::string(b.families[i].name).size());
  const Table families({7, name_w});
  families.row({"backend", "kernel family", "runs when"});
  for (const auto& b : backends)
    for (int i = 0; i < b.n_families; ++i)
      families.row({i == 0 ? b.name : "", b.families[i].name, b.families[i].runs_when});
  if (verbose) {
    for (const auto& b : backends)
      for (int i = 0; i < b.n_families; ++i) {
        const sinkattn_kernel_family_t& f = b.families[i];
        std::printf("\n%s %s (%s)\n", b.name.c_str(), f.name, f.sources);
        print_paragraph("  runs when: ", f.runs_when);
        print_paragraph("  rule:      ", f.rule);
      }
  }

  for (const auto& b : backends) {
    if (b.n_switches == 0) continue;
    std::printf("\n");
    print_paragraph("", b.name + " switches (read from the environment once per process" +
                            (verbose ? ")" : "; --verbose: when to use each)"));
    size_t w = 8;
    for (int i = 0; i < b.n_switches; ++i) w = std::max(w, switch_spelling(b.switches[i]).size());
    const Table t({w, 7});
    t.row({"variable", "now", "effect"});
    for (int i = 0; i < b.n_switches; ++i) {
      const sinkattn_switch_t& s = b.switches[i];
      const std::string now = env_value(s.name);
      t.row({switch_spelling(s), now.empty() ? "unset" : now, s.effect});
      if (verbose) t.row({"", "", std::string("use: ") + s.use});
    }
  }
  for (const auto& name : unknown_switches_set(backends))
    print_paragraph("", "warning: " + name + " is set but is not a switch of this library: ignored");
}

nlohmann::ordered_json to_json(const std::vector<BackendInfo>& backends) {
  nlohmann::ordered_json j;
  j["version"] = sinkattn_version();
  j["c_abi"] = std::to_string(SINKATTN_VERSION_MAJOR) + "." + std::to_string(SINKATTN_VERSION_MINOR) + "." +
               std::to_string(SINKATTN_VERSION_PATCH);
  j["command_built_with_cuda"] = cli_built_with_cuda();
  j["backends"] = nlohmann::ordered_json::array();
  for (const auto& b : backends) {
    nlohmann::ordered_json o;
    o["name"] = b.name;
    o["compiled_in"] = b.compiled_in;
    if (b.compiled_in) {
      o["summary"] = b.summary;
      o["topics"] = nlohmann::ordered_json::array();
      for (const auto& t : b.topics) o["topics"].push_back({{"label", t.label}, {"text", t.text}});
      o["kernel_families"] = nlohmann::ordered_json::array();
      for (int i = 0; i < b.n_families; ++i) {
        const sinkattn_kernel_family_t& f = b.families[i];
        o["kernel_families"].push_back(
            {{"name", f.name}, {"sources", f.sources}, {"runs_when", f.runs_when}, {"rule", f.rule}});
      }
      o["switches"] = nlohmann::ordered_json::array();
      for (int i = 0; i < b.n_switches; ++i) {
        const sinkattn_switch_t& s = b.switches[i];
        const char* v = std::getenv(s.name);
        o["switches"].push_back({{"name", s.name},
                                 {"values", s.values},
                                 {"effect", s.effect},
                                 {"use", s.use},
                                 {"value", v == nullptr ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v)}});
      }
    }
    j["backends"].push_back(std::move(o));
  }
  j["unknown_switches_set"] = unknown_switches_set(backends);
  return j;
}

// "|" inside a cell would end it.
std::string md_cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

int print_switches_markdown(const std::vector<BackendInfo>& backends) {
  int rows = 0;
  std::printf("| Variable | Values | What it does | When to use it |\n|---|---|---|---|\n");
  for (const auto& b : backends)
    for (int i = 0; i < b.n_switches; ++i) {
      const sinkattn_switch_t& s = b.switches[i];
      std::printf("| `%s` | `%s` | %s | %s |\n", s.name, md_cell(s.values).c_str(), md_cell(s.effect).c_str(),
                  md_cell(s.use).c_str());
      ++rows;
    }
  if (rows > 0) return 0;
  std::fprintf(stderr, "sinkattn info: the library has no backend with environment switches (CUDA not compiled in)\n");
  return 1;
}

}  // namespace

int cmd_info(const InfoOptions& o) {
  const std::vector<BackendInfo> backends = all_backends();
  if (o.switches_markdown) return print_switches_markdown(backends);
  if (o.json) {
    std::printf("%s\n", to_json(backends).dump(2).c_str());
    return 0;
  }
  print_tables(backends, o.verbose);
  return 0;
}

}  // namespace sinkattn::cli
