// Measure-once tuning and its report: see tuning.h.
#include "tuning.h"

#include "check.h"
#include "kernel_common.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

namespace lltm_cpu {
namespace tuning {
namespace {

// A choice as made: its key and Record, the option chosen, how, and what
// each option measured.
struct Choice {
  std::string key;
  Record what;
  std::string chosen;
  const char* source;
  std::vector<std::pair<std::string, double>> measured_us;
};

struct State {
  std::mutex mutex;  // held while a key is measured, and to read or add a choice
  std::map<std::string, int> chosen;  // the index of the option chosen
  std::vector<Choice> choices;        // in the order chosen
};

State& state() {
  static State* const instance = new State;  // never destroyed: other threads may tune at exit
  return *instance;
}

// LLTM_CPU_TEST_SLOW_ROUTES (tests only): a comma-separated list of options
// ("mkl", "rows", ...) whose measured time is multiplied by 1000, so that two
// processes can be made to choose differently (test_sequence.py's
// reproducibility test), or of "option=us", which measures `us` instead, so
// that a test can set the times a rule decides between.  An option
// "x 1 thread" is slowed with "x".
double test_time(const std::string& name, double us) {
  static const std::string slowed = [] {
    const char* env = std::getenv("LLTM_CPU_TEST_SLOW_ROUTES");
    return env == nullptr ? std::string() : "," + std::string(env) + ",";
  }();
  const std::string route = "," + name.substr(0, name.find(' '));
  if (slowed.find(route + ",") != std::string::npos) {
    return us * 1000.0;
  }
  const size_t given = slowed.find(route + "=");
  return given == std::string::npos ? us : std::strtod(slowed.c_str() + given + route.size() + 1, nullptr);
}

}  // namespace

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
    }
    out += c;
  }
  return out + '"';
}

int tuned_index(const std::string& key, const Record& what, const std::vector<const char*>& names,
                const std::function<double(int)>& time_option, const char* single_source, int rounds,
                const std::vector<double>& within) {
  LLTM_CHECK(!names.empty(), "lltm_cpu: nothing to choose from for ", key);
  const bool fixed = deterministic_algorithms();
  const std::string full_key = fixed ? key + " deterministic" : key;
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (const auto found = s.chosen.find(full_key); found != s.chosen.end()) {
    return found->second;
  }
  int best = 0;
  std::vector<std::pair<std::string, double>> measured;
  if (names.size() > 1 && !fixed) {
    std::vector<double> fastest(names.size(), 0);
    for (int round = 0; round < rounds; ++round) {
      for (int index = 0; index < static_cast<int>(names.size()); ++index) {
        const double us = test_time(names[index], time_option(index));
        fastest[index] = round == 0 ? us : std::min(fastest[index], us);
      }
    }
    const auto counted = [&](int index) { return within.empty() ? fastest[index] : fastest[index] / within[index]; };
    for (int index = 0; index < static_cast<int>(names.size()); ++index) {
      measured.emplace_back(names[index], fastest[index]);
      if (counted(index) < counted(best)) {
        best = index;
      }
    }
  }
  s.chosen.emplace(full_key, best);
  s.choices.push_back({full_key, what, names[best],
                       names.size() <= 1 ? single_source : fixed ? kDeterministic : kMeasured, std::move(measured)});
  return best;
}

namespace {

std::string to_json(const Choice& choice) {
  const Record& r = choice.what;
  std::ostringstream out;
  out.precision(4);
  out << "{\"key\": " << quoted(choice.key) << ", \"kind\": " << quoted(r.kind) << ", \"dtype\": " << quoted(r.dtype);
  const auto number = [&](const char* name, int64_t value) {
    if (value >= 0) {
      out << ", \"" << name << "\": " << value;
    }
  };
  const auto flag = [&](const char* name, const std::optional<bool>& value) {
    if (value.has_value()) {
      out << ", \"" << name << "\": " << (*value ? "true" : "false");
    }
  };
  number("m", r.m);
  number("n", r.n);
  number("k", r.k);
  if (!r.size_class.empty()) {
    out << ", \"size_class\": [" << r.size_class[0] << ", " << r.size_class[1] << ", " << r.size_class[2] << "]";
  }
  flag("a_transposed", r.a_transposed);
  flag("b_transposed", r.b_transposed);
  number("batch", r.batch);
  number("state_size", r.state_size);
  number("threads", r.threads);
  number("torch_threads", r.torch_threads);
  if (*r.direction != '\0') {
    out << ", \"direction\": " << quoted(r.direction);
  }
  number("row_blocks", r.row_blocks);
  number("column_blocks", r.column_blocks);
  out << ", \"chosen\": " << quoted(choice.chosen) << ", \"source\": " << quoted(choice.source)
      << ", \"measured_us\": {";
  for (size_t i = 0; i < choice.measured_us.size(); ++i) {
    out << (i == 0 ? "" : ", ") << quoted(choice.measured_us[i].first) << ": " << choice.measured_us[i].second;
  }
  out << "}}";
  return out.str();
}

}  // namespace

std::string report_json() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::string out = "[";
  for (size_t i = 0; i < s.choices.size(); ++i) {
    out += (i == 0 ? "" : ", ") + to_json(s.choices[i]);
  }
  return out + "]";
}

}  // namespace tuning
}  // namespace lltm_cpu
