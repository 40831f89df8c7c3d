// Turns PROGRAM [ARGS] into what is exec'd: `.py` and `-m` run under $PYTHON_EXEC -u, as torchrun
// does; anything else (or --no_python) runs directly. Checked before anything starts.
#pragma once

#include <string>
#include <vector>

namespace ddprun {

struct ResolvedProgram {
  std::string executable;
  std::vector<std::string> args;
};

// Throws ConfigError naming the program when it does not exist or cannot be executed.
// runPath (torchrun's --run_path): PROGRAM, an absolute path to a Python file, runs through
// runpy.run_path(PROGRAM, run_name="__main__") with sys.argv = [PROGRAM, ARGS...]; it wins over
// -m and --no_python, as in torchrun.
ResolvedProgram resolveProgram(const std::string& program, const std::vector<std::string>& args, bool module,
                               bool noPython, const std::string& pythonExec, const std::string& path,
                               bool runPath = false);

// The executable a command name refers to: itself when it has a '/', else the first match on PATH.
// Empty when nothing executable is found.
std::string findExecutable(const std::string& name, const std::string& path);

}  // namespace ddprun
