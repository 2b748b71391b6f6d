#include "store/new_session.h"

#include <nlohmann/json.hpp>

#include <random>

namespace armada::store {

std::string new_session_id() {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng(std::random_device{}());
    std::string s = "sess_";
    for (int i = 0; i < 20; ++i)
        s += alphabet[rng() % (sizeof(alphabet) - 1)];
    return s;
}

Batch new_session_batch(const std::string & id, const std::string & agent_id, const std::string & tenant,
                        const std::string & input, const std::string & cell, int64_t now_ms) {
    using json = nlohmann::json;
    Batch b;
    SessionRecord r;
    r.id = id;
    r.agent_id = agent_id;
    r.owner = tenant;
    // The names agent/session_state.h gives these states (a unit test holds them together).
    r.state = input.empty() ? "waiting_input" : "queued";
    r.data = "{}";
    r.created_ms = r.updated_ms = now_ms;
    r.cell = cell;
    b.sessions.push_back(r);
    StepRecord st;
    st.session_id = id;
    st.seq = 1;
    st.ts_ms = now_ms;
    // Invalid UTF-8 in the input is replaced, not thrown on (the gateway checked it already).
    if (!input.empty()) {
        st.kind = "user_input";
        st.payload = json{{"content", input}}.dump(-1, ' ', false, json::error_handler_t::replace);
    } else {
        st.kind = "state";
        st.payload = json{{"state", r.state}}.dump();
    }
    b.steps.push_back(st);
    return b;
}

}  // namespace armada::store
