#include "spmd/pipelines/stages.h"

namespace spmd {

const char* stageName(Stage stage) {
  switch (stage) {
    case Stage::Expand: return "expand";
    case Stage::Split: return "split";
    case Stage::Unroll: return "unroll";
    case Stage::Lower: return "lower";
  }
  return "";
}

bool parseStage(const std::string& name, Stage& stage) {
  for (Stage s : {Stage::Expand, Stage::Split, Stage::Unroll, Stage::Lower}) {
    if (name == stageName(s)) {
      stage = s;
      return true;
    }
  }
  return false;
}

}  // namespace spmd
