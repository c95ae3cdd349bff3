// torch.export programs (.pt2 files written by torch.export.save) as a
// stage's input, beside TorchScript: the program's graph, specialised to
// static shapes, with the module's parameter and buffer names.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

class MappedFile;

// Whether `zip`, a whole zip file, is a .pt2 of either layout.
bool isExportedProgram(std::string_view zip);

// The program's graph: the training IR of torch.export.export, or core ATen
// after run_decompositions(). Input dtypes and shapes are the program's;
// `inputs` may restate them (and must agree) and must give every symbolic
// size. `fileName` names the file in the graph's weights reference (format
// "pt2") and in diagnostics. Throws Diagnostic naming the node for what
// cannot be taken: higher-order ops, custom objects, symbolic sizes no
// --input fixes, a first output that is not a floating scalar.
// `mapping`: the mapped file when `bytes` is all of it (its state dict is
// then read as views), else null.
Graph importExportedProgram(std::string_view bytes, const std::string& fileName, const std::vector<InputSpec>& inputs,
                            const std::shared_ptr<MappedFile>& mapping = nullptr);

// The parameters, buffers and tensor constants of the .pt2 at `path` by the
// module's names, as copy-on-write views of the mapped file. Throws
// Diagnostic naming the file.
std::map<std::string, at::Tensor> loadExportedWeights(const std::string& path);

}  // namespace spmd
