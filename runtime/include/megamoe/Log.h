// The runtime's log: four levels and off, one process-wide level and one sink (docs/decisions/logging.md).
//
// Level: setLogLevel(), else MEGAMOE_LOG_LEVEL (read once, at the first message), else warn. A message is built
// only when its level is enabled: MEGAMOE_LOG(kDebug, expr) evaluates expr (a std::string) only then, so a debug
// line costs one relaxed atomic load when the level is warn.
//
// Sink: one line per message on stderr, "megamoe [info] text" (embedded newlines become spaces), or the function
// given to setLogSink() (C ABI: megamoe_set_log_callback). The sink is called on the thread that logs, with no
// lock of the runtime held: not the logger's own, not a loader's, heap's or layer's. So a sink may call any
// megamoe function, including setLogLevel and setLogSink (a new sink takes effect from the next message), and
// what it calls may log again, which calls the sink again on the same thread. A sink must be safe to call from
// several threads at once (the runtime does not serialise it) and must not throw (a C++ exception it throws is
// caught and dropped). setLogSink() returns once no other thread is still inside the sink it replaced, so the
// caller may free what that sink used; a sink that waits for a thread which is replacing the sink deadlocks.
#pragma once
#include <atomic>
#include <functional>
#include <string>

namespace megamoe {

// Values are part of the C ABI (megamoe.h mirrors them as MEGAMOE_LOG_*).
enum class LogLevel : int { kOff = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// "off", "error", "warn", "info", "debug" (what MEGAMOE_LOG_LEVEL takes and the default sink prints).
const char* logLevelName(LogLevel level);

using LogSink = std::function<void(LogLevel level, const std::string& message)>;

// Replaces the level (MEGAMOE_LOG_LEVEL is then never read). kOff logs nothing.
void setLogLevel(LogLevel level);
LogLevel logLevel();
// Replaces the sink; an empty function restores the default (stderr). See above for what a sink may do.
void setLogSink(LogSink sink);

namespace detail {
// The level as an int; -1 until set or read from MEGAMOE_LOG_LEVEL.
extern std::atomic<int> logLevelState;
int resolveLogLevel();
}  // namespace detail

// Whether a message of `level` would be delivered now.
inline bool logEnabled(LogLevel level) {
  int current = detail::logLevelState.load(std::memory_order_relaxed);
  if (current < 0) current = detail::resolveLogLevel();
  return level != LogLevel::kOff && static_cast<int>(level) <= current;
}

// Delivers `message` to the sink when `level` is enabled. Never throws.
void logMessage(LogLevel level, const std::string& message) noexcept;

// "12.3 ms" below a second, else "1.5 s": a duration as the log lines write it (3 significant digits).
std::string formatDuration(double seconds);

}  // namespace megamoe

// MEGAMOE_LOG(kInfo, "text " + name): evaluates the message (the remaining arguments, a std::string expression)
// only when the level (a LogLevel enumerator's name) is enabled. MEGAMOE_LOG_AT takes a LogLevel value instead.
#define MEGAMOE_LOG_AT(level, ...)                                                    \
  do {                                                                                \
    if (::megamoe::logEnabled(level)) ::megamoe::logMessage(level, (__VA_ARGS__));    \
  } while (0)
#define MEGAMOE_LOG(levelName, ...) MEGAMOE_LOG_AT(::megamoe::LogLevel::levelName, __VA_ARGS__)
