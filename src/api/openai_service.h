#pragma once

#include "api/http_server.h"
#include "api/json_util.h"
#include "api/openai_map.h"
#include "engine/chat_format.h"
#include "engine/engine_set.h"
#include "obs/metrics.h"

#include <boost/asio/any_io_executor.hpp>

#include <chat.h>

#include <memory>
#include <string>

namespace armada::api {

//! OpenAI-compatible chat and text completions over the node's engines. Runs on I/O threads: it parses,
//! templates and tokenises, then hands native requests to the engine, and renders the events
//! that come back. No JSON goes past this class.
class OpenAIService {
  public:
    OpenAIService(std::shared_ptr<engine::Model> model, engine::EngineSet & engine, obs::Registry & metrics,
                  boost::asio::any_io_executor io, RequestLimits limits = {});
    ~OpenAIService();

    //! `account` is the hashed API key the tokens are charged to.
    //! `tenant`: whose KV this is (the prompt cache never crosses tenants); `account`: who pays.
    //! `session`: the X-Armada-Session header, which names the conversation (the program the
    //! engine schedules by) when the body's prompt_cache_key and user do not.
    void chat(const json & body, const std::string & account, const std::string & tenant,
              std::shared_ptr<Responder> out, const std::string & session = {});
    void completion(const json & body, const std::string & account, const std::string & tenant,
                    std::shared_ptr<Responder> out, const std::string & session = {});
    json models() const;
    const std::string & model_id() const { return model_->id(); }

  private:
    struct Job;
    void submit(std::shared_ptr<Job> job, std::vector<std::unique_ptr<engine::GenRequest>> reqs,
                const std::string & account, const std::string & tenant, const std::string & program);

    std::shared_ptr<engine::Model> model_;
    engine::EngineSet & engine_;
    obs::Registry & metrics_;
    boost::asio::any_io_executor io_;
    RequestLimits limits_;
    engine::ChatFormat format_;
};

//! Random id with a prefix, e.g. "chatcmpl-3fK...".
std::string random_id(const std::string & prefix, size_t n = 24);

}  // namespace armada::api
