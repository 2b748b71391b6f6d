#include "cluster/queue.h"
#include "common/backoff.h"

#include <nats/nats.h>
#include <spdlog/spdlog.h>
#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <random>

namespace armada::cluster {

namespace {

//! The host of the first server in a NATS URL list (`tls://user@host:port,...`).
std::string url_host(const std::string & url) {
    std::string u = url.substr(0, url.find(','));
    if (const auto scheme = u.find("://"); scheme != std::string::npos) u = u.substr(scheme + 3);
    if (const auto at = u.rfind('@'); at != std::string::npos) u = u.substr(at + 1);
    if (!u.empty() && u[0] == '[') return u.substr(1, u.find(']') - 1);
    return u.substr(0, u.find(':'));
}

constexpr int64_t kNsPerMs = 1000000;
constexpr int64_t kMinute = 60 * 1000 * kNsPerMs;

std::string status_text(natsStatus s, jsErrCode jerr = jsErrCode(0)) {
    std::string t = natsStatus_GetText(s);
    if (const char * last = nats_GetLastError(nullptr); last && *last) t = last;
    if (jerr != 0) t += " (JetStream error " + std::to_string(int(jerr)) + ")";
    return t;
}

//! Waits before each reconnect: 250 ms doubling to 4 s, times a random 0.5..1.5, so clients that
//! lost the server together do not come back together.
int64_t reconnect_delay(natsConnection *, int attempts, void *) {
    return common::jittered_ms(int(common::backoff_ms(250, attempts, 4000)));
}

struct StreamDef {
    const char * name;
    const char * subjects;
    bool work_queue;
    int64_t max_age;
};
const StreamDef kStreams[] = {
    {"ARMADA_PLACE", "armada.place.>", true, 0},
    {"ARMADA_CMD", "armada.cmd.>", true, 0},
    {"ARMADA_EVENT", "armada.event.>", false, 60 * kMinute},
    {"ARMADA_DEAD", "armada.dead.>", false, 7 * 24 * 60 * kMinute},
};

}  // namespace

std::string place_subject(const std::string & cell) {
    return "armada.place." + cell;
}
std::string command_subject(const std::string & node) {
    return "armada.cmd." + node;
}
std::string event_subject(const std::string & cell) {
    return "armada.event." + cell;
}

std::string report_subject(const std::string & cell) {
    return "armada.report." + cell;
}

// --- Subscription ---

Subscription::~Subscription() {
    if (sub_) natsSubscription_Destroy(sub_);
}

std::vector<std::pair<std::string, std::string>> Subscription::take(int max, int wait_ms) {
    std::vector<std::pair<std::string, std::string>> out;
    while (int(out.size()) < max) {
        natsMsg * m = nullptr;
        if (natsSubscription_NextMsg(&m, sub_, out.empty() ? std::max(wait_ms, 1) : 1) != NATS_OK || !m) break;
        const char * data = natsMsg_GetData(m);
        out.emplace_back(natsMsg_GetSubject(m), std::string(data ? data : "", size_t(natsMsg_GetDataLength(m))));
        natsMsg_Destroy(m);
    }
    return out;
}

// --- QueueMsg ---

QueueMsg::QueueMsg(natsMsg * m) : m_(m) {
    subject_ = natsMsg_GetSubject(m);
    data_.assign(natsMsg_GetData(m), size_t(natsMsg_GetDataLength(m)));
    jsMsgMetaData * meta = nullptr;
    if (natsMsg_GetMetaData(&meta, m) == NATS_OK && meta) {
        deliveries_ = meta->NumDelivered;
        jsMsgMetaData_Destroy(meta);
    }
}

QueueMsg::QueueMsg(QueueMsg && o) noexcept
    : m_(o.m_), subject_(std::move(o.subject_)), data_(std::move(o.data_)), deliveries_(o.deliveries_) {
    o.m_ = nullptr;
}

QueueMsg::~QueueMsg() {
    if (m_) natsMsg_Destroy(m_);
}

std::string QueueMsg::ack() {
    // Sent without waiting for the server's confirmation: a loop that acks never waits on a NATS
    // that hangs. An ack that is lost redelivers the message after its ack wait.
    const natsStatus s = natsMsg_Ack(m_, nullptr);
    return s == NATS_OK ? std::string() : "ack: " + status_text(s);
}

std::string QueueMsg::nak(int delay_ms) {
    const natsStatus s = delay_ms > 0 ? natsMsg_NakWithDelay(m_, int64_t(delay_ms), nullptr) : natsMsg_Nak(m_, nullptr);
    return s == NATS_OK ? std::string() : "nak: " + status_text(s);
}

std::string QueueMsg::term() {
    const natsStatus s = natsMsg_Term(m_, nullptr);
    return s == NATS_OK ? std::string() : "term: " + status_text(s);
}

// --- Consumer ---

Consumer::~Consumer() {
    if (sub_) natsSubscription_Destroy(sub_);
}

std::vector<QueueMsg> Consumer::fetch(int batch, int wait_ms, std::string & error) {
    std::vector<QueueMsg> out;
    // With Debian 12's libnats and nats-server this returns as soon as any message is there, not
    // when the batch is full (a node acts on a command at once):
    // Queue.AFetchReturnsWhenAMessageComesAndTakesWhatElseIsQueued holds them to that.
    natsMsgList list{};
    const natsStatus s = natsSubscription_Fetch(&list, sub_, batch, int64_t(std::max(wait_ms, 1)), nullptr);
    if (s == NATS_TIMEOUT) return out;  // nothing came
    if (s != NATS_OK) {
        error = "fetch: " + status_text(s);
        return out;
    }
    take(list, out);
    return out;
}

void Consumer::take(natsMsgList & list, std::vector<QueueMsg> & out) {
    for (int i = 0; i < list.Count; ++i) {
        QueueMsg m(list.Msgs[i]);
        list.Msgs[i] = nullptr;  // owned by `m` now
        if (m.deliveries() > uint64_t(max_deliver_)) {
            // Delivered too often without an ack: kept aside for a person, not retried forever.
            const std::string dead = "armada.dead." + m.subject();
            if (auto e = js_->publish(dead, m.data()); !e.empty()) {
                spdlog::warn("queue: cannot move a message of {} to {}: {}", m.subject(), dead, e);
                continue;  // not acked: it comes back, and the move is tried again
            }
            spdlog::warn("queue: a message of {} was delivered {} times; moved to {}", m.subject(), m.deliveries() - 1,
                         dead);
            m.term();
            continue;
        }
        out.push_back(std::move(m));
    }
    natsMsgList_Destroy(&list);
}

// --- JetStream ---

std::unique_ptr<JetStream> JetStream::connect(const std::string & url, std::string & error,
                                              const ServiceCredentials & auth) {
    std::unique_ptr<JetStream> j(new JetStream());
    natsOptions * opts = nullptr;
    natsStatus s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetURL(opts, url.c_str());
    if (s == NATS_OK && !auth.user.empty()) s = natsOptions_SetUserInfo(opts, auth.user.c_str(), auth.password.c_str());
    if (s == NATS_OK && auth.tls()) {
        // The server's certificate is checked against the CA; its name too, when the URL names
        // one server by DNS name (libnats takes one expected name for all, and checks DNS names
        // only, not IP addresses).
        s = natsOptions_SetSecure(opts, true);
        if (s == NATS_OK && !auth.ca_file.empty())
            s = natsOptions_LoadCATrustedCertificates(opts, auth.ca_file.c_str());
        if (s == NATS_OK && !auth.cert_file.empty())
            s = natsOptions_LoadCertificatesChain(opts, auth.cert_file.c_str(), auth.key_file.c_str());
        const std::string host = url_host(url);
        boost::system::error_code ec;
        boost::asio::ip::make_address(host, ec);
        if (s == NATS_OK && !host.empty() && ec && url.find(',') == std::string::npos)
            s = natsOptions_SetExpectedHostname(opts, host.c_str());
        if (s != NATS_OK) {
            natsOptions_Destroy(opts);
            error = "NATS TLS settings: " + status_text(s);
            return nullptr;
        }
    }
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);  // forever
    if (s == NATS_OK) s = natsOptions_SetCustomReconnectDelay(opts, reconnect_delay, nullptr);
    if (s == NATS_OK) s = natsOptions_SetTimeout(opts, 3000);
    if (s == NATS_OK) s = natsConnection_Connect(&j->nc_, opts);
    natsOptions_Destroy(opts);
    if (s != NATS_OK) {
        error = "cannot connect to NATS at " + url + ": " + status_text(s);
        return nullptr;
    }
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    // publish_async: acks are awaited by libnats, off the caller's thread; a full window of
    // unacknowledged publishes makes the next one fail after a short wait instead of blocking.
    jo.PublishAsync.MaxPending = kAsyncWindow;
    jo.PublishAsync.StallWait = 50;
    jo.PublishAsync.ErrHandler = [](jsCtx *, jsPubAckErr * pae, void * closure) {
        auto * self = static_cast<JetStream *>(closure);
        self->async_failures_.fetch_add(1);
        const char * subject = pae->Msg ? natsMsg_GetSubject(pae->Msg) : "";
        spdlog::warn("NATS: an asynchronous publish to {} was not acknowledged: {}", subject ? subject : "",
                     pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err));
    };
    jo.PublishAsync.ErrHandlerClosure = j.get();
    s = natsConnection_JetStream(&j->js_, j->nc_, &jo);
    if (s != NATS_OK) {
        error = "NATS at " + url + ": no JetStream context: " + status_text(s);
        return nullptr;
    }
    if (auto e = j->ensure_streams(); !e.empty()) {
        error = "NATS at " + url + ": " + e;
        return nullptr;
    }
    return j;
}

JetStream::~JetStream() {
    if (js_) {
        // libnats may be running the error handler (its closure is this object) for a publish
        // not acknowledged: wait for the outstanding ones first, a bounded time.
        jsPubOptions o;
        jsPubOptions_Init(&o);
        o.MaxWait = 6000;
        js_PublishAsyncComplete(js_, &o);
        jsCtx_Destroy(js_);
    }
    if (nc_) {
        natsConnection_Close(nc_);
        natsConnection_Destroy(nc_);
    }
}

std::string JetStream::ensure_streams() {
    for (const auto & d : kStreams) {
        jsStreamConfig sc;
        jsStreamConfig_Init(&sc);
        const char * subjects[] = {d.subjects};
        sc.Name = d.name;
        sc.Subjects = subjects;
        sc.SubjectsLen = 1;
        sc.Storage = js_FileStorage;
        sc.Retention = d.work_queue ? js_WorkQueuePolicy : js_LimitsPolicy;
        sc.MaxAge = d.max_age;
        sc.Duplicates = 2 * kMinute;
        jsStreamInfo * si = nullptr;
        jsErrCode jerr = jsErrCode(0);
        natsStatus s = js_AddStream(&si, js_, &sc, nullptr, &jerr);
        if (s != NATS_OK && jerr == JSStreamNameExistErr) {
            // Created before (by another process, or an earlier start): bring it to these settings.
            jerr = jsErrCode(0);
            s = js_UpdateStream(&si, js_, &sc, nullptr, &jerr);
        }
        if (si) jsStreamInfo_Destroy(si);
        if (s != NATS_OK) return std::string("cannot create stream ") + d.name + ": " + status_text(s, jerr);
    }
    return {};
}

std::string JetStream::publish(const std::string & subject, const std::string & data, const std::string & msg_id,
                               int max_wait_ms) {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    if (!msg_id.empty()) po.MsgId = msg_id.c_str();
    po.MaxWait = max_wait_ms;
    jsPubAck * ack = nullptr;
    jsErrCode jerr = jsErrCode(0);
    const natsStatus s = js_Publish(&ack, js_, subject.c_str(), data.data(), int(data.size()), &po, &jerr);
    if (ack) jsPubAck_Destroy(ack);
    return s == NATS_OK ? std::string() : "publish to " + subject + ": " + status_text(s, jerr);
}

std::string JetStream::publish_async(const std::string & subject, const std::string & data,
                                     const std::string & msg_id) {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    if (!msg_id.empty()) po.MsgId = msg_id.c_str();
    po.MaxWait = 5000;  // for the ack, which libnats awaits on its own thread
    const natsStatus s = js_PublishAsync(js_, subject.c_str(), data.data(), int(data.size()), &po);
    return s == NATS_OK ? std::string() : "publish to " + subject + ": " + status_text(s);
}

std::string JetStream::publish_now(const std::string & subject, const std::string & data) {
    const natsStatus s = natsConnection_Publish(nc_, subject.c_str(), data.data(), int(data.size()));
    return s == NATS_OK ? std::string() : "publish to " + subject + ": " + status_text(s);
}

std::unique_ptr<Subscription> JetStream::subscribe(const std::string & subject, std::string & error) {
    std::unique_ptr<Subscription> sub(new Subscription());
    const natsStatus s = natsConnection_SubscribeSync(&sub->sub_, nc_, subject.c_str());
    if (s != NATS_OK) {
        error = "subscribe to " + subject + ": " + status_text(s);
        return nullptr;
    }
    return sub;
}

std::unique_ptr<Consumer> JetStream::consumer(const std::string & stream, const std::string & durable,
                                              const std::string & filter, int ack_wait_ms, int max_deliver,
                                              std::string & error) {
    // A durable name may not hold '.', which node names (host names) do: it becomes '~', which no
    // cell or node name holds, so two names never map to one consumer.
    std::string name = durable;
    std::replace(name.begin(), name.end(), '.', '~');
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Config.Durable = name.c_str();
    so.Config.AckPolicy = js_AckExplicit;
    so.Config.AckWait = int64_t(ack_wait_ms) * kNsPerMs;
    // One more than ours: the last delivery is the one `fetch` moves to the dead letters.
    so.Config.MaxDeliver = max_deliver + 1;
    so.Config.FilterSubject = filter.c_str();
    std::unique_ptr<Consumer> c(new Consumer());
    c->js_ = this;
    c->max_deliver_ = max_deliver;
    jsErrCode jerr = jsErrCode(0);
    const natsStatus s = js_PullSubscribe(&c->sub_, js_, filter.c_str(), name.c_str(), nullptr, &so, &jerr);
    if (s != NATS_OK) {
        error = "consumer " + durable + " on " + stream + ": " + status_text(s, jerr);
        return nullptr;
    }
    return c;
}

int64_t JetStream::stream_messages(const std::string & stream, std::string & error) {
    jsStreamInfo * si = nullptr;
    jsErrCode jerr = jsErrCode(0);
    const natsStatus s = js_GetStreamInfo(&si, js_, stream.c_str(), nullptr, &jerr);
    if (s != NATS_OK) {
        error = "stream " + stream + ": " + status_text(s, jerr);
        return -1;
    }
    const int64_t n = int64_t(si->State.Msgs);
    jsStreamInfo_Destroy(si);
    return n;
}

}  // namespace armada::cluster
