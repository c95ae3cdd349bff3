// A run's TOML file (spmd-train's CONFIG): tables whose keys are the long
// names of the flags of the option group of the same name ([model], [compile],
// [run]), read with toml++ and given to those options where the command line
// did not set them, so that the command line overrides the file; and the
// resolved configuration written back as TOML.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace spmd {

struct ConfigValue {
  std::string table;                // "compile"
  std::string key;                  // "lr"
  std::vector<std::string> values;  // one, or an array's elements; a flag's "true"/"false"
  std::string where;                // "train.toml:12:1"
};

// Reads `path`: every key of every table, in the file's order. A file that is
// not TOML, a value that is a table or a date, or an array of arrays is a
// Diagnostic naming FILE:LINE:COL.
std::vector<ConfigValue> readConfigFile(const std::string& path);

// Gives each value to the option `--KEY` of the option group named after its
// table, unless the command line set that option; the option's checks run
// as on the command line. A table that is not a group, a key that is no
// option of its table, or a value the option refuses is a Diagnostic naming
// the place in the file.
void applyConfig(CLI::App& app, const std::vector<ConfigValue>& values);

// The needs and excludes between options (--checkpoint-every needs
// --checkpoint), which CLI11 checks while it parses the command line: with a
// file, one side may come from the file, so they are taken off the options
// (deferRequirements, before parsing) and checked once the file is applied
// (checkRequirements: Diagnostic naming both flags).
struct Requirement {
  CLI::Option* option;
  CLI::Option* other;
  bool needs;  // else excludes
};
std::vector<Requirement> deferRequirements(CLI::App& app);
void checkRequirements(const std::vector<Requirement>& requirements);

// --resume of a run spmd-train checkpointed: the [compile] table of the
// checkpoint's config.toml (when it has one) against this run's resolved
// configuration `resolved`; a key whose value differs changes the step, and
// is refused in one line naming it and both values (Diagnostic naming
// --resume). `checkpoint`: a step folder or a --checkpoint folder (its latest).
void requireSameCompileConfig(const std::string& checkpoint, const std::string& resolved);

// Every option of each group in `groups` that holds a value (given, from the
// file, or a default), as TOML: `[group]` then `key = value` lines, in the
// order the options were added. Flags appear when set.
std::string resolvedConfig(const CLI::App& app, const std::vector<std::string>& groups);

}  // namespace spmd
