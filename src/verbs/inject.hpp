// `softverbs inject` requests addressed to this process (inject.cpp): the watcher thread of
// control.cpp hands them over when the state directory's inject.<pid> changes.
#pragma once

namespace softverbs::inject {

// True for the state file name that carries requests to this process.
bool is_request(const char* file_name);
// Remembers the request already there (left for an earlier process with this pid).
void baseline();
// Reads the request, applies it unless it was applied already, and writes the reply.
void apply();

}  // namespace softverbs::inject
