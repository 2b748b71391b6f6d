#pragma once

#include <pthread.h>
#include <csignal>

namespace armada::common {

//! Blocks SIGINT and SIGTERM in the calling thread before any other thread starts, so every thread
//! inherits the mask and only the thread that waits for them (sigwait) receives them. Returns
//! the set to wait on.
inline sigset_t block_stop_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    return set;
}

}  // namespace armada::common
