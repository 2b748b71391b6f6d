#include "sim/sim.h"

#include "sim/world.h"

namespace armada::sim {

SimResult run(const Scenario & s, const SimOptions & o) {
    return detail::World(s, o).run();
}

}  // namespace armada::sim
