#include "store/store.h"

#include <future>

namespace armada::store {

Status Store::commit_sync(Batch batch) {
    std::promise<Status> p;
    auto f = p.get_future();
    commit(std::move(batch), [&p](Status s) { p.set_value(std::move(s)); });
    return f.get();
}

}  // namespace armada::store
