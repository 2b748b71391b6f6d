#include "cluster/survival.h"

#include <cmath>

namespace armada::cluster {

double Survival::ratio() const {
    const int64_t decided = completed + failed + timed_out + lost;
    return decided > 0 ? double(completed) / double(decided) : std::nan("");
}

void Survival::add(const store::SessionQueries::EndedCount & c) {
    if (c.state == "completed")
        completed += c.count;
    else if (c.state == "cancelled")
        cancelled += c.count;
    else if (c.deadline)
        timed_out += c.count;
    else if (c.moved)
        lost += c.count;
    else
        failed += c.count;
}

std::map<std::string, Survival> survival_by_cell(const std::vector<store::SessionQueries::EndedCount> & rows) {
    std::map<std::string, Survival> out;
    out[""];
    for (const auto & r : rows) {
        out[r.cell].add(r);
        if (!r.cell.empty()) out[""].add(r);
    }
    return out;
}

}  // namespace armada::cluster
