// Helpers for the runtime's host tests: temp dirs, scoped environment variables, access to the fake HIP library,
// running a function in a fork()ed child with a bound on how long the parent waits for it, and capturing the log.
#pragma once
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <vector>

#include "FakeHipControl.h"
#include "tests/support/FileAllGather.h"
#include "compiler/abi/KernelAbi.h"
#include "megamoe/Error.h"
#include "megamoe/GeneratorHash.h"
#include "megamoe/Log.h"

namespace megamoe::test {

// A fingerprint as this library's own generator writes it (the runtime refuses, as foreign, an entry whose
// fingerprint names no generator or another one); `tag` tells the test's entries apart.
inline std::string ourFingerprint(const std::string& tag) {
  return tag + "; generator " + MEGAMOE_GENERATOR_HASH;
}

// Collects what the runtime logs at `level` and above while it lives; then the default sink and the previous level.
class LogCapture {
 public:
  struct Line {
    LogLevel level;
    std::string text;
  };
  explicit LogCapture(LogLevel level) : previous_(logLevel()) {
    setLogLevel(level);
    setLogSink([this](LogLevel l, const std::string& text) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back({l, text});
    });
  }
  ~LogCapture() {
    setLogSink(nullptr);
    setLogLevel(previous_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<Line> lines() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }
  // The first line of `level` containing every one of `fragments`, or "" (lines are never empty).
  std::string find(LogLevel level, const std::vector<std::string>& fragments) const {
    for (const Line& l : lines()) {
      if (l.level != level) continue;
      bool all = true;
      for (const std::string& f : fragments) all = all && l.text.find(f) != std::string::npos;
      if (all) return l.text;
    }
    return "";
  }
  // Every line as "[level] text\n", for failure messages.
  std::string dump() const {
    std::string out;
    for (const Line& l : lines()) out += std::string("[") + logLevelName(l.level) + "] " + l.text + "\n";
    return out;
  }

 private:
  LogLevel previous_;
  mutable std::mutex mutex_;
  std::vector<Line> lines_;
};

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "megamoe-rt-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// The fake libamdhip64's query functions (same handle as the backend's dlopen of the same path).
struct FakeHip {
  int (*callCount)(const char*);
  int (*launchCount)();
  int (*launch)(int, FakeHipLaunch*);
  int (*liveAllocations)();
  int (*openIpcMappings)();
  int (*modulesLoaded)();
  int (*peerEnabled)(int, int);
  void (*failMallocAfter)(int);
  int (*setDevice)(int);    // the HIP API's own: the calling thread's current device
  int (*getDevice)(int*);

  static const char* path() { return MEGAMOE_FAKE_HIP_PATH; }
  static FakeHip& get() {
    static FakeHip api = [] {
      void* lib = ::dlopen(MEGAMOE_FAKE_HIP_PATH, RTLD_NOW | RTLD_LOCAL);
      if (!lib) throw std::runtime_error(std::string("cannot load the fake HIP library: ") + ::dlerror());
      FakeHip f{};
      f.callCount = reinterpret_cast<int (*)(const char*)>(::dlsym(lib, "fakehip_call_count"));
      f.launchCount = reinterpret_cast<int (*)()>(::dlsym(lib, "fakehip_launch_count"));
      f.launch = reinterpret_cast<int (*)(int, FakeHipLaunch*)>(::dlsym(lib, "fakehip_launch"));
      f.liveAllocations = reinterpret_cast<int (*)()>(::dlsym(lib, "fakehip_live_allocations"));
      f.openIpcMappings = reinterpret_cast<int (*)()>(::dlsym(lib, "fakehip_open_ipc_mappings"));
      f.modulesLoaded = reinterpret_cast<int (*)()>(::dlsym(lib, "fakehip_modules_loaded"));
      f.peerEnabled = reinterpret_cast<int (*)(int, int)>(::dlsym(lib, "fakehip_peer_enabled"));
      f.failMallocAfter = reinterpret_cast<void (*)(int)>(::dlsym(lib, "fakehip_fail_malloc_after"));
      f.setDevice = reinterpret_cast<int (*)(int)>(::dlsym(lib, "hipSetDevice"));
      f.getDevice = reinterpret_cast<int (*)(int*)>(::dlsym(lib, "hipGetDevice"));
      return f;
    }();
    return api;
  }
  FakeHipLaunch lastLaunch() {
    FakeHipLaunch l{};
    launch(launchCount() - 1, &l);
    return l;
  }
};

// What a forked child reported.
struct ChildOutcome {
  bool finished = false;  // reported before the parent's bound
  bool ok = false;        // body returned normally
  int code = 0;           // ErrorCode of a thrown megamoe::Error
  std::string text;       // the body's result, or the error message
  double seconds = 0;     // from fork to report, measured by the parent
};

// Runs `body` in a child process. The child writes its outcome to a pipe and _exit()s (no atexit handlers, no
// leak checks of a half-torn-down copy of the parent).
class Child {
 public:
  explicit Child(const std::function<std::string()>& body) : start_(std::chrono::steady_clock::now()) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(fds[0]);
      std::string out;
      try {
        out = "K" + body();
      } catch (const Error& e) {
        out = "E" + std::to_string(static_cast<int>(e.code())) + ":" + e.what();
      } catch (const std::exception& e) {
        out = "E-1:" + std::string(e.what());
      }
      size_t at = 0;
      while (at < out.size()) {
        const ssize_t n = ::write(fds[1], out.data() + at, out.size() - at);
        if (n <= 0) break;
        at += static_cast<size_t>(n);
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  pid_t pid() const { return pid_; }

  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  // Waits at most `boundS` (from the child's start) for its report.
  ChildOutcome wait(double boundS) {
    ChildOutcome outcome;
    const auto deadline = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(boundS));
    std::string data;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, left.count() > 0 ? static_cast<int>(left.count()) : 0);
      if (ready <= 0) break;  // bound passed (the destructor kills the child)
      char buffer[4096];
      const ssize_t n = ::read(fd_, buffer, sizeof buffer);
      if (n <= 0) {
        outcome.finished = !data.empty();
        break;
      }
      if (data.empty())
        outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      data.append(buffer, static_cast<size_t>(n));
    }
    if (!outcome.finished) return outcome;
    if (data[0] == 'K') {
      outcome.ok = true;
      outcome.text = data.substr(1);
    } else {
      const size_t colon = data.find(':');
      outcome.code = std::atoi(data.substr(1, colon - 1).c_str());
      outcome.text = data.substr(colon + 1);
    }
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return outcome;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::chrono::steady_clock::time_point start_;
};

// Child `c` reports success within `boundS` of its start; `who` names it in a failure.
inline void expectOk(Child& c, const std::string& who, double boundS = 20) {
  const ChildOutcome o = c.wait(boundS);
  ASSERT_TRUE(o.finished) << who << " did not report (hung?)";
  EXPECT_TRUE(o.ok) << who << ": " << o.text;
}

// A "code object" for the fake HIP library: its text, NUL-terminated.
// The metadata members an entry of declared kernel `kernel` needs to pass the loader's signature check (""
// for a kernel no declaration names), to splice into a metadata object after its first member.
inline std::string signatureMembers(const std::string& kernel) {
  const abi::KernelDecl* d = abi::findKernelDecl(kernel);
  if (!d) return "";
  return ",\"signature\":\"" + abi::signatureHash(*d) + "\",\"abi_version\":" + std::to_string(abi::kKernelAbiVersion);
}

inline std::vector<uint8_t> fakeImage(const std::string& text) {
  std::vector<uint8_t> bytes(text.begin(), text.end());
  bytes.push_back(0);
  return bytes;
}

}  // namespace megamoe::test
