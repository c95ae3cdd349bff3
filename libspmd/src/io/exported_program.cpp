// The torch.export importer's entry points (export_internal.h has its parts).
#include "spmd/io/exported_program.h"

#include "export_internal.h"
#include "spmd/io/zip_members.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/mapped_file.h"
#include "spmd/support/phase_times.h"

namespace spmd {

bool isExportedProgram(std::string_view zip) { return export_detail::isExportArchive(zip); }

Graph importExportedProgram(std::string_view bytes, const std::string& fileName, const std::vector<InputSpec>& inputs,
                            const std::shared_ptr<MappedFile>& mapping) {
  export_detail::ser::ExportedProgram program;
  export_detail::WeightAliases aliases;
  {
    TimedPhase phase("parse the program");
    const export_detail::ExportArchive archive = export_detail::findExportArchive(bytes);
    program = export_detail::parseProgram(archive);
    aliases = export_detail::weightAliases(bytes, archive, mapping);
  }
  return export_detail::traceProgram(program, fileName, inputs, aliases);
}

std::map<std::string, at::Tensor> loadExportedWeights(const std::string& path) {
  try {
    auto mapping = std::make_shared<MappedFile>(path, MappedFile::Access::CopyOnWrite);
    checkZipStructure(mapping->view(), ZipCrc::UpTo1MiB);
    return export_detail::readExportWeights(mapping);
  } catch (Diagnostic& d) {
    throw d.inFile(path);
  }
}

}  // namespace spmd
