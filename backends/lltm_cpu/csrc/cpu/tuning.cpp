// Measure-once tuning and its report: see tuning.h.
#include "tuning.h"

#include "check.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

namespace lltm_cpu {
namespace tuning {
namespace {

struct State {
  std::mutex mutex;  // held while a key is measured, and to read or add a choice
  std::map<std::string, int> chosen;  // the index of the option chosen
  std::vector<std::string> records;   // JSON objects, in the order chosen
};

State& state() {
  static State* const instance = new State;  // never destroyed: other threads may tune at exit
  return *instance;
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

int tuned_index(const std::string& key, const std::string& fields, const std::vector<const char*>& names,
                const std::function<double(int)>& time_option, const char* single_source, int rounds) {
  LLTM_CHECK(!names.empty(), "lltm_cpu: nothing to choose from for ", key);
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (const auto found = s.chosen.find(key); found != s.chosen.end()) {
    return found->second;
  }
  int best = 0;
  std::ostringstream measured;
  measured.precision(4);
  measured << '{';
  if (names.size() > 1) {
    std::vector<double> fastest(names.size(), 0);
    for (int round = 0; round < rounds; ++round) {
      for (int index = 0; index < static_cast<int>(names.size()); ++index) {
        const double us = time_option(index);
        fastest[index] = round == 0 ? us : std::min(fastest[index], us);
      }
    }
    for (int index = 0; index < static_cast<int>(names.size()); ++index) {
      measured << (index == 0 ? "" : ", ") << quoted(names[index]) << ": " << fastest[index];
      if (fastest[index] < fastest[best]) {
        best = index;
      }
    }
  }
  measured << '}';
  std::ostringstream record;
  record << "{\"key\": " << quoted(key) << ", " << fields << ", \"chosen\": " << quoted(names[best])
         << ", \"source\": " << quoted(names.size() > 1 ? kMeasured : single_source)
         << ", \"measured_us\": " << measured.str() << '}';
  s.chosen.emplace(key, best);
  s.records.push_back(record.str());
  return best;
}

std::string report_json() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::string out = "[";
  for (size_t i = 0; i < s.records.size(); ++i) {
    out += (i == 0 ? "" : ", ") + s.records[i];
  }
  return out + "]";
}

}  // namespace tuning
}  // namespace lltm_cpu
