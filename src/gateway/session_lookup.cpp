#include "gateway/session_lookup.h"

namespace armada::gateway {

std::optional<store::SessionRecord> lookup_session(store::SessionLog & st, const std::string & id,
                                                   const std::function<bool()> & renew, bool & unavailable) {
    unavailable = false;
    if (auto rec = st.session(id)) return rec;
    // `session` says nothing both for a missing row and for a failed read: ask which.
    std::optional<bool> there = st.has_session(id);
    if (!there && renew && renew()) there = st.has_session(id);
    if (!there) {
        unavailable = true;
        return std::nullopt;
    }
    if (!*there) return std::nullopt;
    auto rec = st.session(id);  // there a moment ago; deleted since, or the read failed now
    if (!rec) {
        const std::optional<bool> again = st.has_session(id);
        unavailable = !again || *again;  // only a row seen gone is "no such session"
    }
    return rec;
}

}  // namespace armada::gateway
