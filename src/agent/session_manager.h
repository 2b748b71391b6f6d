#pragma once

#include "agent/agent_spec.h"
#include "agent/ports.h"
#include "agent/session_state.h"
#include "engine/chat_format.h"
#include "obs/metrics.h"
#include "store/store.h"
#include "tools/tool_transport.h"

#include <boost/asio/any_io_executor.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace armada::agent {

//! One event of a session's stream, numbered from 1. `data` is a JSON object.
struct SessionEventRecord {
    int64_t id = 0;
    std::string type;  // token, message, tool_call, tool_result, state, error
    std::string data;
};

//! A session as callers see it.
struct SessionView {
    std::string id, agent_id, state, reason;
    std::string transcript;  // JSON array of OpenAI-style messages
    std::vector<store::StepRecord> steps;
    int32_t model_steps = 0;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    int64_t created_ms = 0;
    //! Session memory: where its KV is now, and its size after each model step.
    std::optional<engine::KvUsage> kv;
    struct KvPoint {
        int32_t step = 0;
        int64_t tokens = 0;
        uint64_t bytes = 0;
    };
    std::vector<KvPoint> kv_history;
    int32_t compactions = 0;
};

//! Outcome of a request to the manager; `status` is an HTTP-like code (200, 400, 404, 409, 503).
struct Outcome {
    int status = 200;
    std::string error;
    std::string id;
    int retry_after_s = 0;  // with 429/503
};

//! Runs agent sessions: model step → tool calls → model step … → answer, with every state change
//! written to the store before anyone hears of it.
//!
//! Threads: public methods may be called from any thread. All session data is guarded by `mu_`;
//! engine, tool and store callbacks never touch it directly but post a handler to the I/O
//! executor, which takes the lock. Nothing blocks while holding it: engine submit, store commit
//! and tool calls only enqueue.
class SessionManager {
  public:
    SessionManager(engine::ChatFormat & format, GenerationPort & engine, store::Store & store,
                   tools::ToolTransport & tools, boost::asio::any_io_executor io, obs::Registry & metrics,
                   const Clock & clock);
    ~SessionManager();

    //! Registers or replaces an agent.
    void put_agent(AgentSpec spec);
    //! Registers an agent declared through the API and stores `source` (its YAML/JSON), so it is
    //! there again after a restart; `done` runs once it is durable.
    void declare_agent(AgentSpec spec, const std::string & source, std::function<void(Outcome)> done);
    //! Loads the agents declared through the API before the last stop. Agents already known
    //! (from the --agents file) win. `prepare` completes each (MCP tools); returns how many.
    size_t load_declared_agents(const std::function<std::string(AgentSpec &)> & prepare);
    std::vector<AgentSpec> agents() const;
    bool has_agent(const std::string & id) const;

    //! Creates a session; `done` runs once it is durable, with its id (or an error).
    void create(const std::string & agent_id, const std::string & owner, const std::string & input,
                std::function<void(Outcome)> done);
    //! Adds a user turn to a session that finished its last turn or waits for input.
    void add_message(const std::string & id, const std::string & owner, const std::string & text,
                     std::function<void(Outcome)> done);
    std::optional<SessionView> get(const std::string & id, const std::string & owner);
    void cancel(const std::string & id, const std::string & owner, std::function<void(Outcome)> done);
    void erase(const std::string & id, const std::string & owner, std::function<void(Outcome)> done);

    //! Replays events after `last_id`, then delivers new ones until the session ends or the
    //! returned handle is released. `fn` must not block; `end` runs once when the stream closes.
    //! Returns 0 when the session is unknown to `owner`.
    uint64_t subscribe(const std::string & id, const std::string & owner, int64_t last_id,
                       std::function<void(const SessionEventRecord &)> fn, std::function<void()> end);
    void unsubscribe(const std::string & id, uint64_t handle);

    //! Loads every session that had not ended and continues it from its last durable step.
    //! Returns how many were resumed.
    size_t resume_all();

    //! Counts for metrics and tests.
    size_t live_sessions() const;

  private:
    struct Session;
    struct PendingCall;

    Session * find(const std::string & id, const std::string & owner);
    bool apply(Session & s, SessionEvent ev, const std::string & reason = {});
    void model_step(Session & s);
    void on_model_text(const std::string & id, uint64_t gen, std::string text);
    void on_model_done(const std::string & id, uint64_t gen, engine::GenEvent ev);
    void run_tools(Session & s);
    void on_tool_done(const std::string & id, const std::string & key, tools::ToolResult r);
    void persist(Session & s, store::Batch b, std::function<void(Session &)> after);
    void send_next(Session & s);
    void on_committed(const std::string & id, store::Status st);
    void emit(Session & s, const std::string & type, const std::string & data);
    void end_subscribers(Session & s);
    store::SessionRecord record(const Session & s) const;
    store::StepRecord step_record(Session & s, const std::string & kind, const std::string & payload,
                                  const std::string & key = {});
    void fail(Session & s, SessionEvent ev, const std::string & reason);
    void count_outcome(const Session & s);
    //! Runs `fn` on `on` (default: the I/O pool) unless the manager is gone by then.
    void post(std::function<void()> fn, const boost::asio::any_io_executor & on = {});
    std::pair<std::string, int32_t> shared_prefix(const Session & s, const AgentSpec & a,
                                                  const std::vector<common_chat_tool> & tools,
                                                  common_chat_tool_choice choice);
    void after_ms(int ms, std::function<void()> fn);

    engine::ChatFormat & format_;
    GenerationPort & engine_;
    store::Store & store_;
    tools::ToolTransport & tools_;
    boost::asio::any_io_executor io_;
    obs::Registry & metrics_;
    const Clock & clock_;

    mutable std::mutex mu_;
    std::map<std::string, AgentSpec> agents_;                   // guarded by mu_
    std::map<std::string, engine::Tokens> prefixes_;            // agent|choice → shared prompt prefix; mu_
    std::set<std::string> declared_;                            // agents loaded from the store; mu_
    std::map<std::string, std::unique_ptr<Session>> sessions_;  // guarded by mu_
    uint64_t next_sub_ = 1;                                     // guarded by mu_
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

//! A tool's output as the model sees it: inside a `<tool_output … trust="untrusted">` envelope
//! that nothing in the output can close, with chat-template control tokens ("<|…") broken up.
std::string label_tool_output(const std::string & tool, const std::string & content);
//! The agent's system message: its instructions and, when it has tools, the note that tool
//! output is untrusted data. None when both are empty.
std::optional<common_chat_msg> system_message(const AgentSpec & a);

}  // namespace armada::agent
