#include "spmd/driver/config.h"

#include "spmd/runtime/checkpoint.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"

#include <toml++/toml.hpp>

#include <charconv>
#include <fstream>
#include <map>
#include <sstream>

namespace spmd {
namespace {

std::string placeOf(const std::string& file, const toml::source_region& source) {
  return file + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
}

// A double as its shortest text that reads back to the same value (3e-4, not
// 0.00029999999999999997): what the user wrote, in the usual cases.
std::string shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// One scalar as the text a flag takes; throws Diagnostic for tables, dates and arrays.
std::string scalarText(const toml::node& node, const std::string& where) {
  if (auto s = node.as_string()) return s->get();
  if (auto i = node.as_integer()) return std::to_string(i->get());
  if (auto f = node.as_floating_point()) return shortest(f->get());
  if (auto b = node.as_boolean()) return b->get() ? "true" : "false";
  throw Diagnostic(where, std::string("expected a string, a number, a boolean or an array of them, got ") +
                              (node.is_table() ? "a table" : node.is_array() ? "an array of arrays" : "a date or time"));
}

CLI::Option* optionOf(CLI::App& app, const ConfigValue& v) {
  CLI::App* group = nullptr;
  for (CLI::App* g : app.get_subcommands([](CLI::App*) { return true; })) {
    if (g->get_group() == v.table || g->get_name() == v.table) group = g;
  }
  if (!group) throw Diagnostic(v.where, "[" + echo(v.table) + "]: no such table (model, compile, run)");
  for (CLI::Option* o : group->get_options()) {
    if (o->check_lname(v.key)) return o;
  }
  throw Diagnostic(v.where, echo(v.key) + ": [" + v.table + "] has no such key (see spmd-train --help: the --" +
                                "flags of its " + v.table + " group)");
}

// A value as TOML: numbers and booleans bare, anything else a quoted string.
std::string tomlValue(const std::string& text) {
  if (text == "true" || text == "false") return text;
  double d = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
  if (ec == std::errc() && end == text.data() + text.size() && !text.empty()) return text;
  std::ostringstream out;
  out << toml::value<std::string>(text);
  return out.str();
}

}  // namespace

std::vector<ConfigValue> readConfigFile(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& source = e.source();
    if (source.begin.line == 0) throw Diagnostic("", "cannot read it: " + std::string(e.description())).inFile(path);
    throw Diagnostic("", placeOf(path, source) + ": " + std::string(e.description()));
  }
  std::vector<ConfigValue> values;
  for (auto&& [tableKey, tableNode] : root) {
    const std::string table(tableKey.str());
    const std::string tableWhere = placeOf(path, tableKey.source());
    const toml::table* t = tableNode.as_table();
    if (!t) throw Diagnostic("", tableWhere + ": " + echo(table) + ": expected a table ([model], [compile], [run])");
    for (auto&& [key, node] : *t) {
      ConfigValue v{table, std::string(key.str()), {}, placeOf(path, key.source())};
      if (const toml::array* a = node.as_array()) {
        for (const toml::node& element : *a) v.values.push_back(scalarText(element, v.where + ": " + v.key));
      } else {
        v.values.push_back(scalarText(node, v.where + ": " + v.key));
      }
      values.push_back(std::move(v));
    }
  }
  return values;
}

void applyConfig(CLI::App& app, const std::vector<ConfigValue>& values) {
  for (const ConfigValue& v : values) {
    CLI::Option* option = optionOf(app, v);
    if (option->count() > 0) continue;  // the command line's value wins
    const bool flag = option->get_expected_max() == 0;
    if (flag) {
      if (v.values.size() != 1 || (v.values[0] != "true" && v.values[0] != "false")) {
        throw Diagnostic(v.where, v.key + ": expected true or false");
      }
      if (v.values[0] == "false") continue;  // a flag not given
    } else if (v.values.size() > 1 && option->get_expected_max() == 1 && option->get_items_expected_max() <= 1) {
      throw Diagnostic(v.where, v.key + ": takes one value, not an array");
    }
    try {
      option->add_result(v.values);
      option->run_callback();
    } catch (const CLI::Error& e) {
      throw Diagnostic(v.where, v.key + ": " + e.what());
    }
  }
}

namespace {

// The [compile] table's values as TOML text, by key.
std::map<std::string, std::string> compileTable(const toml::table& root) {
  std::map<std::string, std::string> out;
  if (const toml::table* t = root["compile"].as_table()) {
    for (auto&& [key, node] : *t) {
      std::ostringstream text;
      if (const toml::array* a = node.as_array()) {
        text << *a;
      } else if (auto s = node.as_string()) {
        text << toml::value<std::string>(s->get());
      } else {
        text << scalarText(node, "");  // a number or a boolean, as a flag would take it
      }
      out[std::string(key.str())] = text.str();
    }
  }
  return out;
}

}  // namespace

void requireSameCompileConfig(const std::string& checkpoint, const std::string& resolved) {
  // A sharded checkpoint's ranks each keep the same config.toml: rank 0's is read.
  const std::string root = isShardedCheckpoint(checkpoint) ? rankCheckpointRoot(checkpoint, 0) : checkpoint;
  std::string folder;
  try {
    folder = checkpointFolder(root);
  } catch (const Diagnostic&) {
    return;  // no checkpoint there: spmd-run's own reading says so
  }
  const std::string file = folder + "/config.toml";
  std::ifstream in(file);
  if (!in) return;  // written by spmd-run, or before checkpoints kept it
  std::map<std::string, std::string> theirs, mine;
  try {
    theirs = compileTable(toml::parse(in, file));
    mine = compileTable(toml::parse(resolved));
  } catch (const toml::parse_error& e) {
    throw Diagnostic("--resume " + checkpoint, file + ": not TOML: " + std::string(e.description()));
  }
  for (const auto& [key, value] : theirs) {
    auto it = mine.find(key);
    const std::string here = it == mine.end() ? "(not set)" : it->second;
    if (here != value) {
      throw Diagnostic("--resume " + checkpoint, "the checkpoint's step was compiled with " + key + " = " + value +
                                                     " ([compile] in " + file + "), this run has " + here +
                                                     ": a resumed run continues the same step (give the same value, "
                                                     "or --resume-weights-only to start another)");
    }
  }
  for (const auto& [key, value] : mine) {
    if (!theirs.count(key)) {
      throw Diagnostic("--resume " + checkpoint, "this run sets " + key + " = " + value + ", which the checkpoint's step "
                                                     "was compiled without ([compile] in " + file + ")");
    }
  }
}

std::vector<Requirement> deferRequirements(CLI::App& app) {
  std::vector<Requirement> deferred;
  std::vector<CLI::App*> apps = {&app};
  for (CLI::App* g : app.get_subcommands([](CLI::App*) { return true; })) apps.push_back(g);
  for (CLI::App* a : apps) {
    for (CLI::Option* o : a->get_options()) {
      for (CLI::Option* other : o->get_needs()) deferred.push_back({o, other, true});
      for (CLI::Option* other : o->get_excludes()) deferred.push_back({o, other, false});
    }
  }
  for (const Requirement& r : deferred) {
    if (r.needs) {
      r.option->remove_needs(r.other);
    } else {
      r.option->remove_excludes(r.other);
    }
  }
  return deferred;
}

void checkRequirements(const std::vector<Requirement>& requirements) {
  for (const Requirement& r : requirements) {
    if (r.option->count() == 0) continue;
    if (r.needs && r.other->count() == 0) throw Diagnostic(r.option->get_name(), "needs " + r.other->get_name());
    if (!r.needs && r.other->count() > 0) throw Diagnostic(r.option->get_name(), "excludes " + r.other->get_name());
  }
}

std::string resolvedConfig(const CLI::App& app, const std::vector<std::string>& groups) {
  std::string out;
  for (const std::string& name : groups) {
    const CLI::App* group = nullptr;
    for (const CLI::App* g : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (g->get_group() == name || g->get_name() == name) group = g;
    }
    if (!group) continue;
    std::string lines;
    for (const CLI::Option* o : group->get_options()) {
      const std::string key = o->get_lnames().empty() ? "" : o->get_lnames().front();
      if (key.empty()) continue;
      std::vector<std::string> texts = o->results();
      if (o->count() == 0) {
        if (o->get_expected_max() == 0 || o->get_default_str().empty()) continue;
        texts = {o->get_default_str()};
      }
      if (o->get_expected_max() == 0) {
        lines += key + " = true\n";
        continue;
      }
      const bool many = o->get_items_expected_max() > 1;
      std::string value;
      for (size_t i = 0; i < texts.size(); ++i) value += (i ? ", " : "") + tomlValue(texts[i]);
      lines += key + " = " + (many ? "[" + value + "]" : value) + "\n";
    }
    if (!lines.empty()) out += (out.empty() ? "" : "\n") + ("[" + name + "]\n") + lines;
  }
  return out;
}

}  // namespace spmd
