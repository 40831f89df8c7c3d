#include "launcher/program.h"

#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/strings.h"

namespace ddprun {
namespace {

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (!::getcwd(cwd, sizeof(cwd))) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace

std::string findExecutable(const std::string& name, const std::string& path) {
  if (name.empty()) return {};
  if (name.find('/') != std::string::npos) return isExecutableFile(name) ? absolute(name) : std::string();
  for (const auto& dir : split(path, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (isExecutableFile(candidate)) return absolute(candidate);
  }
  return {};
}

ResolvedProgram resolveProgram(const std::string& program, const std::vector<std::string>& args, bool module,
                               bool noPython, const std::string& pythonExec, const std::string& path, bool runPath) {
  if (program.empty()) throw ConfigError("missing PROGRAM: what should each worker run? (see ddprun --help)");
  ResolvedProgram out;
  if (runPath) {
    if (program.front() != '/') throw ConfigError("--run_path: PROGRAM '" + program + "' must be an absolute path");
    struct stat st {};
    if (::stat(program.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw ConfigError("PROGRAM '" + program + "': no such file");
    }
    out.executable = findExecutable(pythonExec, path);
    if (out.executable.empty()) {
      throw ConfigError("python interpreter '" + pythonExec + "' not found on PATH (set PYTHON_EXEC)");
    }
    out.args = {"-u", "-c",
                "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                program};
    out.args.insert(out.args.end(), args.begin(), args.end());
    return out;
  }
  if (module && noPython) throw ConfigError("-m/--module and --no_python cannot be used together");
  if (module || (!noPython && endsWith(program, ".py"))) {
    out.executable = findExecutable(pythonExec, path);
    if (out.executable.empty()) {
      throw ConfigError("python interpreter '" + pythonExec + "' not found on PATH (set PYTHON_EXEC)");
    }
    out.args = {"-u"};
    if (module) {
      out.args.push_back("-m");
    } else {
      struct stat st {};
      if (::stat(program.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw ConfigError("PROGRAM '" + program + "': no such file");
      }
      if (::access(program.c_str(), R_OK) != 0) throw ConfigError("PROGRAM '" + program + "': not readable");
    }
    out.args.push_back(program);
  } else {
    out.executable = findExecutable(program, path);
    if (out.executable.empty()) {
      struct stat st {};
      bool exists = program.find('/') != std::string::npos && ::stat(program.c_str(), &st) == 0;
      throw ConfigError("PROGRAM '" + program + "': " +
                        (exists ? std::string(S_ISDIR(st.st_mode) ? "is a directory" : "is not executable")
                                : program.find('/') != std::string::npos ? "no such file"
                                                                         : "command not found on PATH"));
    }
  }
  out.args.insert(out.args.end(), args.begin(), args.end());
  return out;
}

}  // namespace ddprun
