// recordFailureForTorchrun: a rank that torchrun started writes why it
// failed to the file torchrun named in TORCHELASTIC_ERROR_FILE, in the JSON
// that torch.distributed.elastic's own error handler writes
// ({"message": {"message": ..., "extraInfo": {"py_callstack": ...,
// "timestamp": ...}}}), so that torchrun's failure summary shows the
// cause ("traceback : <the line>") instead of "To enable traceback see ...".
//
// - Does nothing when the variable is unset (ddp-run's own launcher,
//   SLURM, mpirun, one process).
// - Never throws: a file it cannot write is reported on stderr and the
//   rank still exits with its own code.
#pragma once

#include <string>

namespace ddp {

// kind: what failed, e.g. "UsageError"; line: the one-line message.
void recordFailureForTorchrun(const std::string& kind, const std::string& line);

}  // namespace ddp
