#pragma once
// The proxy of a dependency that hangs, from the library (cluster/hang_proxy.h).
#include "cluster/hang_proxy.h"

using armada::cluster::HangProxy;
