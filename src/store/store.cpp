#include "store/store.h"

#include <algorithm>
#include <future>

namespace armada::store {

std::optional<std::vector<SessionRecord>> SessionQueries::open_sessions(const std::string & cell,
                                                                        const std::string & node,
                                                                        const std::vector<std::string> & ended_states) {
    auto all = sessions_not_in(ended_states);
    std::erase_if(all, [&](const SessionRecord & r) { return r.cell != cell || (!node.empty() && r.node != node); });
    return all;
}

std::optional<std::vector<std::string>> SessionQueries::open_ids_of(const std::string & owner,
                                                                    const std::vector<std::string> & ended) {
    // `sessions_of` returns at most this many rows, ended ones included: a tenant with more is
    // not known (nullopt), never counted short.
    constexpr size_t kMost = 1000000;
    auto all = sessions_of(owner, "", kMost);
    if (!all || all->size() >= kMost) return std::nullopt;
    std::vector<std::string> out;
    for (const auto & r : *all) {
        if (std::find(ended.begin(), ended.end(), r.state) == ended.end()) out.push_back(r.id);
    }
    return out;
}

std::string leader_fenced(const Batch::Leadership & l) {
    return "a newer leader of " + l.election + " has written to the store; this one (epoch " + std::to_string(l.rev) +
           ") no longer leads. If etcd's revisions went backwards (its data was restored or wiped), stop every "
           "brain that led before that and run `armada cluster forget-leaders --cluster-file …`";
}

Status SessionLog::commit_sync(Batch batch) {
    std::promise<Status> p;
    auto f = p.get_future();
    commit(std::move(batch), [&p](Status s) { p.set_value(std::move(s)); });
    return f.get();
}

}  // namespace armada::store
