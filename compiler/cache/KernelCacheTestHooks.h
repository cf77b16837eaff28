// Points inside KernelCache where a host test can act between one process's steps (replace an entry under a
// reader, remove one under a writer), so that a race is reproduced every time instead of by luck. Nothing but
// tests sets a hook; with none set each point costs one test of an empty std::function.
#pragma once
#include <functional>
#include <string>

namespace megamoe::cache::testhooks {

enum class Point {
  kEntryOpened,     // a reader opened the folder of an entry and has read none of its files yet
  kStorePublished,  // store() renamed its entry into place and has not looked it up yet
  kEntryRemoving,   // an entry is about to be moved aside (into tmp/) to be checked again or deleted
};

// Called with the point and the entry's folder (entries/<digest>).
using Hook = std::function<void(Point, const std::string& dir)>;

// Replaces the hook; an empty one removes it. Not synchronised: set it while no cache call runs.
void setHook(Hook hook);

}  // namespace megamoe::cache::testhooks
