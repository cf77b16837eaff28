// The runtime's log (see Log.h and docs/decisions/logging.md).
#include "megamoe/Log.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "megamoe/Error.h"
#include "megamoe/env.h"

namespace megamoe {

namespace detail {
std::atomic<int> logLevelState{-1};
}  // namespace detail

namespace {

// A sink and how many threads are inside it now (under State::mutex).
struct Sink {
  explicit Sink(LogSink f) : fn(std::move(f)) {}
  LogSink fn;
  int inFlight = 0;
};

// Leaked, so that a message logged from a static destructor at exit still finds it.
struct State {
  std::mutex mutex;                 // held only to swap or count: never while a sink runs
  std::condition_variable idle;     // a sink's inFlight dropped
  std::shared_ptr<Sink> sink;       // null: the default sink
};
State& state() {
  static State* s = new State;
  return *s;
}

// The sinks this thread is inside, innermost last: a sink that replaces itself waits for the other threads only.
thread_local std::vector<const Sink*> callingSinks;

void writeDefault(LogLevel level, const std::string& message) {
  std::string line = std::string("megamoe [") + logLevelName(level) + "] " + message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  line += '\n';
  // One write per line: stdio locks stderr for the call, so lines of concurrent threads do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace

const char* logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kOff: return "off";
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "unknown";
}

int detail::resolveLogLevel() {
  LogLevel level = LogLevel::kWarn;
  std::string problem;
  try {
    level = parseLogLevelEnv();
  } catch (const std::exception& e) {
    problem = e.what();
  }
  int expected = -1;
  // setLogLevel, or another thread's first message, may have won meanwhile: the first value stays.
  if (!logLevelState.compare_exchange_strong(expected, static_cast<int>(level), std::memory_order_relaxed))
    return expected;
  if (!problem.empty())
    logMessage(LogLevel::kWarn, problem + "; logging at warn");  // once: only the thread that set the level
  return static_cast<int>(level);
}

void setLogLevel(LogLevel level) {
  const int value = static_cast<int>(level);
  if (value < static_cast<int>(LogLevel::kOff) || value > static_cast<int>(LogLevel::kDebug))
    throw Error(ErrorCode::kInvalidArgument, "log level " + std::to_string(value) +
                                                 " is not one of off (0), error (1), warn (2), info (3), debug (4)");
  detail::logLevelState.store(value, std::memory_order_relaxed);
}

LogLevel logLevel() {
  int current = detail::logLevelState.load(std::memory_order_relaxed);
  if (current < 0) current = detail::resolveLogLevel();
  return static_cast<LogLevel>(current);
}

void setLogSink(LogSink sink) {
  std::shared_ptr<Sink> next = sink ? std::make_shared<Sink>(std::move(sink)) : nullptr;
  State& s = state();
  std::shared_ptr<Sink> old;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    old = std::exchange(s.sink, std::move(next));
    if (old) {
      const int mine = static_cast<int>(std::count(callingSinks.begin(), callingSinks.end(), old.get()));
      s.idle.wait(lock, [&] { return old->inFlight == mine; });
    }
  }
  // The old function (and what it captured) is destroyed here, outside the lock, unless this thread is inside it:
  // then the last caller's reference frees it.
}

void logMessage(LogLevel level, const std::string& message) noexcept {
  if (!logEnabled(level)) return;
  State& s = state();
  std::shared_ptr<Sink> sink;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    sink = s.sink;
    if (sink) ++sink->inFlight;
  }
  if (!sink) {
    try {
      writeDefault(level, message);
    } catch (...) {
      // Out of memory while building the line: the message is lost, the caller is not.
    }
    return;
  }
  // Counted out and popped however the sink returns.
  struct Inside {
    State& s;
    const std::shared_ptr<Sink>& sink;
    bool pushed = false;
    ~Inside() {
      if (pushed) callingSinks.pop_back();
      {
        std::lock_guard<std::mutex> lock(s.mutex);
        --sink->inFlight;
      }
      s.idle.notify_all();
    }
  } inside{s, sink};
  try {
    callingSinks.push_back(sink.get());
    inside.pushed = true;
    sink->fn(level, message);
  } catch (...) {
    // A sink must not throw; what it throws is not the caller's failure.
  }
}

std::string formatDuration(double seconds) {
  std::ostringstream out;
  out.precision(3);
  if (seconds < 1.0) out << seconds * 1000.0 << " ms";
  else out << seconds << " s";
  return out.str();
}

}  // namespace megamoe
